"""T5 (v1.0 ReLU, v1.1 gated-GELU) from transformers == attnlab after conversion, and back."""

import pytest
import torch
import transformers

from attnlab.interop import from_hf, save_hf
from tests.interop.helpers import (TOL, assert_round_trip, randomize, real_max_diff, right_padded,
                                   single_thread)

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

V = 59
CONFIGS = {
    # v1.0: ReLU, tied output scaled by d_model^-0.5
    "v1.0-relu-tied": dict(d_model=32, d_kv=8, num_heads=4, d_ff=48, num_layers=2, feed_forward_proj="relu"),
    # v1.1: gated tanh-GELU, no output scaling; 3 heads with d_kv * heads != d_model
    "v1.1-gated-gelu-3-heads": dict(d_model=32, d_kv=12, num_heads=3, d_ff=40, num_layers=2, num_decoder_layers=1,
                                    feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                    relative_attention_num_buckets=8, relative_attention_max_distance=20),
}


def _hf(name: str):
    cfg = transformers.T5Config(vocab_size=V, decoder_start_token_id=0, **CONFIGS[name])
    return randomize(transformers.T5ForConditionalGeneration(cfg))


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_on_padded_batches(name):
    hf = _hf(name)
    ours = from_hf(hf)
    src, src_mask = right_padded([30, 4, 17], V, seed=1)  # long enough for the logarithmic buckets
    tgt, tgt_mask = right_padded([25, 3, 9], V, seed=2)
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                  decoder_attention_mask=tgt_mask).logits
        got = ours(src, tgt, src_mask, tgt_mask)
    assert real_max_diff(got, want, tgt_mask) <= TOL


def test_configs_map_to_the_core_options():
    v10, v11 = from_hf(_hf("v1.0-relu-tied")).config, from_hf(_hf("v1.1-gated-gelu-3-heads")).config
    assert v10.lm_head_scale == 32**-0.5 and v10.activation == "relu" and v10.attention.score == "dot"
    assert v11.lm_head_scale == 1.0 and v11.activation == "geglu_tanh" and v11.resolved_head_dim == 12
    assert v11.resolved_decoder_layers == 1 and v11.position.t5_num_buckets == 8


@pytest.mark.parametrize("name", CONFIGS)
def test_round_trip_is_exact(name):
    assert_round_trip(from_hf(_hf(name)))


@pytest.mark.parametrize("name", CONFIGS)
def test_folders_both_ways(name, tmp_path):
    hf = _hf(name)
    hf.save_pretrained(tmp_path / "hf")
    ours = from_hf(tmp_path / "hf")
    save_hf(ours, tmp_path / "ours")
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "ours").eval()
    src, tgt = torch.randint(0, V, (2, 9)), torch.randint(0, V, (2, 5))
    with torch.no_grad():
        want = hf(input_ids=src, decoder_input_ids=tgt).logits
        assert real_max_diff(ours(src, tgt), want) <= TOL
        assert real_max_diff(back(input_ids=src, decoder_input_ids=tgt).logits, want) <= TOL


def test_pre_v5_untied_config_reads_a_separate_output_matrix(tmp_path):
    # transformers < 5 wrote tie_word_embeddings=False and a separate lm_head for T5 v1.1
    hf = _hf("v1.1-gated-gelu-3-heads")
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"])
    config = {k: v for k, v in hf.config.to_dict().items() if k != "scale_decoder_outputs"}
    config["tie_word_embeddings"] = False
    from attnlab.interop.api import from_state

    ours = from_state(config, "T5ForConditionalGeneration", state)
    assert not ours.config.tie_embeddings and ours.config.lm_head_scale == 1.0
    assert torch.equal(ours.decoder.head.proj.weight, state["lm_head.weight"])
