"""GPT-2 from transformers == attnlab after conversion, and back (random small models)."""

import pytest
import torch
import transformers

from attnlab.interop import from_hf, save_hf, to_hf
from attnlab.nn.masks import positions_from_mask
from tests.interop.helpers import (TOL, assert_round_trip, randomize, real_max_diff, right_padded,
                                   single_thread)

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

CONFIGS = {
    "3-heads-tied": dict(n_embd=48, n_head=3, n_layer=2, n_positions=32),
    "untied-relu-unscaled": dict(n_embd=32, n_head=4, n_layer=3, n_positions=24, n_inner=40, tie_word_embeddings=False,
                                 activation_function="relu", scale_attn_weights=False, layer_norm_epsilon=1e-6),
}


def _hf(name: str, cls=None):
    cfg = transformers.GPT2Config(vocab_size=61, bos_token_id=0, eos_token_id=0, **CONFIGS[name])
    return randomize((cls or transformers.GPT2LMHeadModel)(cfg))


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_on_a_right_padded_batch(name):
    hf = _hf(name)
    ours = from_hf(hf)
    ids, mask = right_padded([9, 5, 1], 61)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, mask)
    assert real_max_diff(got, want, mask) <= TOL


def test_left_padding_with_explicit_positions():
    # attnlab counts positions over real tokens; transformers is given the same position ids
    hf = _hf("3-heads-tied")
    ours = from_hf(hf)
    ids, mask = right_padded([7, 4], 61)
    ids, mask = ids.flip(1), mask.flip(1)  # left padding
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
        got = ours(ids, mask)
    assert real_max_diff(got, want, mask) <= TOL


def test_gpt2model_hidden_states():
    hf = _hf("3-heads-tied", transformers.GPT2Model)
    ours = from_hf(hf)
    assert ours.config.head == "none"
    ids = torch.randint(0, 61, (2, 6))
    with torch.no_grad():
        assert real_max_diff(ours(ids), hf(input_ids=ids).last_hidden_state) <= TOL
    assert_round_trip(ours)


@pytest.mark.parametrize("name", CONFIGS)
def test_round_trip_is_exact(name):
    ours = from_hf(_hf(name))
    assert (ours.head.proj.weight is ours.embed.token.weight) == (name == "3-heads-tied")
    assert_round_trip(ours)


def test_folder_written_by_attnlab_loads_in_transformers(tmp_path):
    ours = from_hf(_hf("3-heads-tied"))
    save_hf(ours, tmp_path / "gpt2")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").eval()
    ids = torch.randint(0, 61, (2, 8))
    with torch.no_grad():
        assert real_max_diff(hf(input_ids=ids).logits, ours(ids)) <= TOL


def test_folder_written_by_transformers_converts_without_the_class(tmp_path):
    hf = _hf("untied-relu-unscaled")
    hf.save_pretrained(tmp_path / "gpt2")
    ours = from_hf(tmp_path / "gpt2")
    ids = torch.randint(0, 61, (2, 8))
    with torch.no_grad():
        assert real_max_diff(hf(input_ids=ids).logits, ours(ids)) <= TOL


def test_to_hf_refuses_what_gpt2_cannot_express():
    from attnlab import ModelConfig, build_model

    cfg = ModelConfig(arch="decoder", vocab_size=50, d_model=32, num_heads=4, num_layers=1, d_ff=64,
                      norm_placement="pre", position={"scheme": "rotary"}, attention={"num_kv_heads": 2})
    with pytest.raises(ValueError, match=r"position\.scheme='rotary'.*attention\.num_kv_heads=2|"
                                         r"attention\.num_kv_heads=2.*position\.scheme='rotary'"):
        to_hf(build_model(cfg))
