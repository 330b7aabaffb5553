"""BART and Marian (one layer layout) from transformers == attnlab after conversion, and back."""

import pytest
import torch
import transformers

from attnlab.interop import from_hf, save_hf
from tests.interop.helpers import (TOL, assert_round_trip, randomize, real_max_diff, right_padded,
                                   single_thread)

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

V = 53
SMALL = dict(d_model=48, encoder_attention_heads=3, decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40,
             encoder_layers=2, decoder_layers=1, max_position_embeddings=40)
CONFIGS = {
    "bart-3-heads": ("BartForConditionalGeneration", dict(SMALL)),
    "bart-scaled-untied-relu": ("BartForConditionalGeneration",
                                dict(SMALL, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
                                     decoder_layers=2, scale_embedding=True, tie_word_embeddings=False,
                                     activation_function="relu")),
    "marian-3-heads-swish": ("MarianMTModel", dict(SMALL, scale_embedding=True, activation_function="swish",
                                                  pad_token_id=V - 1, decoder_start_token_id=V - 1)),
    "marian-separate-vocabularies": ("MarianMTModel",
                                     dict(SMALL, scale_embedding=True, share_encoder_decoder_embeddings=False,
                                          decoder_vocab_size=V - 10, pad_token_id=0, decoder_start_token_id=0)),
    "marian-separate-vocabularies-untied": ("MarianMTModel",
                                            dict(SMALL, share_encoder_decoder_embeddings=False, decoder_vocab_size=V - 10,
                                                 tie_word_embeddings=False, pad_token_id=0, decoder_start_token_id=0)),
}


def _hf(name: str):
    cls, kwargs = CONFIGS[name]
    config_cls = transformers.BartConfig if cls.startswith("Bart") else transformers.MarianConfig
    cfg = config_cls(vocab_size=V, bos_token_id=0, eos_token_id=2, forced_eos_token_id=2, **kwargs)
    # Marian's sinusoidal table is fixed: keep it
    return randomize(getattr(transformers, cls)(cfg), skip=("embed_positions",))


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_on_padded_batches(name):
    hf = _hf(name)
    ours = from_hf(hf)
    tgt_vocab = ours.config.vocab_size
    src, src_mask = right_padded([9, 4, 7], ours.config.resolved_src_vocab_size, seed=1)
    tgt, tgt_mask = right_padded([5, 6, 2], tgt_vocab, seed=2)
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                  decoder_attention_mask=tgt_mask).logits
        got = ours(src, tgt, src_mask, tgt_mask)
    assert got.shape == want.shape == (3, 6, tgt_vocab)
    assert real_max_diff(got, want, tgt_mask) <= TOL


@pytest.mark.parametrize("name", CONFIGS)
def test_round_trip_is_exact(name):
    ours = from_hf(_hf(name))
    shared = ours.encoder.embed.token.weight is ours.decoder.embed.token.weight
    assert shared == (name not in ("marian-separate-vocabularies", "marian-separate-vocabularies-untied",
                                   "bart-scaled-untied-relu"))
    tied = ours.decoder.head.proj.weight is ours.decoder.embed.token.weight
    assert tied == (name not in ("marian-separate-vocabularies-untied", "bart-scaled-untied-relu"))
    assert_round_trip(ours)


def test_the_core_options_carry_the_layouts():
    bart, marian = from_hf(_hf("bart-3-heads")).config, from_hf(_hf("marian-3-heads-swish")).config
    assert bart.position.learned_offset == 2 and bart.embedding_norm and bart.lm_head_bias
    assert marian.position.sinusoidal_layout == "halves" and marian.embedding_scale and not marian.embedding_norm


@pytest.mark.parametrize("name", ["bart-scaled-untied-relu", "marian-3-heads-swish"])
def test_folders_both_ways(name, tmp_path):
    hf = _hf(name)
    hf.save_pretrained(tmp_path / "hf")
    ours = from_hf(tmp_path / "hf")
    save_hf(ours, tmp_path / "ours")
    back = type(hf).from_pretrained(tmp_path / "ours").eval()
    src, tgt = torch.randint(3, V - 10, (2, 7)), torch.randint(3, V - 10, (2, 4))
    with torch.no_grad():
        want = hf(input_ids=src, decoder_input_ids=tgt).logits
        assert real_max_diff(ours(src, tgt), want) <= TOL
        assert real_max_diff(back(input_ids=src, decoder_input_ids=tgt).logits, want) <= TOL


def test_a_wrong_marian_position_table_is_an_error():
    hf = _hf("marian-3-heads-swish")
    state = hf.state_dict()
    state["model.encoder.embed_positions.weight"] = state["model.encoder.embed_positions.weight"].flip(1)
    from attnlab.interop.api import from_state

    with pytest.raises(ValueError, match="model.encoder.embed_positions.weight"):
        from_state(hf.config.to_dict(), "MarianMTModel", state)


def test_different_encoder_and_decoder_widths_are_refused():
    cfg = transformers.BartConfig(vocab_size=V, **dict(SMALL, decoder_ffn_dim=64))
    with pytest.raises(ValueError, match="encoder_ffn_dim=40 differs from decoder_ffn_dim=64"):
        from_hf(transformers.BartForConditionalGeneration(cfg))
