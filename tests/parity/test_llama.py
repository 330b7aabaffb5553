"""Llama, Mistral and Qwen2 from transformers == attnlab after conversion, and back: logits
within 1e-5 (fp32) on right- and left-padded batches, exact round trips, folders each way
(random small models of every variant: GQA, MQA and MHA, tied and untied heads, rotary bases,
Llama's attention/MLP biases and explicit head_dim, Mistral's sliding window, Qwen2's q/k/v
biases)."""

import pytest
import torch
import transformers

from attnlab.interop import from_hf, save_hf, to_hf
from attnlab.nn.masks import positions_from_mask
from tests.interop.helpers import assert_round_trip, randomize, real_max_diff, right_padded, single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

TOL = 1e-5  # fp32, eval mode
V = 61
_SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
              bos_token_id=1, eos_token_id=2)
VARIANTS = {
    "llama-gqa-untied": ("Llama", dict(num_key_value_heads=2, rms_norm_eps=1e-5,
                                       rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "llama-mha-tied-biases": ("Llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                            hidden_act="gelu_pytorch_tanh")),
    "llama-head-dim-mqa": ("Llama", dict(num_key_value_heads=1, head_dim=12)),
    "llama-linear-scaling": ("Llama", dict(rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                            "rope_theta": 100.0})),
    "llama3-scaling": ("Llama", dict(num_key_value_heads=2, max_position_embeddings=256, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32, "rope_theta": 500.0})),
    "mistral-window-3": ("Mistral", dict(num_key_value_heads=2, sliding_window=3)),
    "mistral-no-window": ("Mistral", dict(sliding_window=None, num_key_value_heads=4,
                                          rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen2-mqa-tied": ("Qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True)),
}


def hf_model(name: str, base: bool = False):
    """A random-initialised transformers model of variant `name` (its CausalLM, or base Model)."""
    prefix, kwargs = VARIANTS[name]
    cfg = getattr(transformers, f"{prefix}Config")(**_SMALL, **kwargs)
    cls = getattr(transformers, f"{prefix}Model" if base else f"{prefix}ForCausalLM")
    return randomize(cls(cfg))


@pytest.mark.parametrize("name", VARIANTS)
def test_logits_match_on_a_right_padded_batch(name):
    hf = hf_model(name)
    ours = from_hf(hf)
    ids, mask = right_padded([9, 5, 1], V)  # longer than Mistral's window of 3
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, mask)
    assert real_max_diff(got, want, mask) <= TOL


@pytest.mark.parametrize("name", VARIANTS)
def test_logits_match_on_a_left_padded_batch(name):
    # attnlab counts positions over real tokens; transformers is given the same position ids
    hf = hf_model(name)
    ours = from_hf(hf)
    ids, mask = right_padded([8, 3, 6], V, seed=1)
    ids, mask = ids.flip(1), mask.flip(1)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
        got = ours(ids, mask)
    assert real_max_diff(got, want, mask) <= TOL


def test_the_config_maps_field_by_field():
    ours = from_hf(hf_model("llama-gqa-untied")).config
    assert (ours.norm, ours.norm_eps, ours.activation, ours.attention.num_kv_heads) == ("rmsnorm", 1e-5, "swiglu", 2)
    assert (ours.position.scheme, ours.position.rotary_base, ours.tie_embeddings) == ("rotary", 500.0, False)
    mistral = from_hf(hf_model("mistral-window-3")).config
    assert (mistral.attention.kernel, mistral.attention.kernel_options.window) == ("sliding_window", 2)
    assert from_hf(hf_model("llama-head-dim-mqa")).config.resolved_head_dim == 12


def test_base_model_hidden_states():
    hf = hf_model("qwen2-mqa-tied", base=True)
    ours = from_hf(hf)
    assert ours.config.head == "none"
    ids = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        assert real_max_diff(ours(ids), hf(input_ids=ids).last_hidden_state) <= TOL
    assert_round_trip(ours)


@pytest.mark.parametrize("name", VARIANTS)
def test_round_trip_is_exact_and_picks_the_family(name):
    ours = from_hf(hf_model(name))
    assert (ours.head.proj.weight is ours.embed.token.weight) == name.endswith(("-tied", "-tied-biases"))
    family = "Llama" if name == "mistral-no-window" else VARIANTS[name][0]  # without a window, a Llama
    assert type(to_hf(ours)).__name__ == f"{family}ForCausalLM"
    assert_round_trip(ours)
    assert from_hf(to_hf(ours, VARIANTS[name][0].lower())).config == ours.config


@pytest.mark.parametrize("name", ["mistral-window-3", "qwen2-mqa-tied", "llama-mha-tied-biases"])
def test_folder_written_by_attnlab_loads_in_transformers(tmp_path, name):
    ours = from_hf(hf_model(name))
    save_hf(ours, tmp_path / name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
    assert type(hf).__name__ == f"{VARIANTS[name][0]}ForCausalLM"
    ids, mask = right_padded([9, 4], V)
    with torch.no_grad():
        assert real_max_diff(hf(input_ids=ids, attention_mask=mask).logits, ours(ids, mask), mask) <= TOL


@pytest.mark.parametrize("name", ["llama-gqa-untied", "mistral-window-3"])
def test_folder_written_by_transformers_converts_without_the_class(tmp_path, name):
    hf = hf_model(name)
    hf.save_pretrained(tmp_path / name)
    ours = from_hf(tmp_path / name)
    ids = torch.randint(0, V, (2, 8))
    with torch.no_grad():
        assert real_max_diff(hf(input_ids=ids).logits, ours(ids)) <= TOL


def test_an_older_config_json_with_top_level_rope_theta():
    # config.json files written before transformers 5 keep rope_theta (and rope_scaling) at the top level
    from attnlab.interop.llama import LLAMA

    hf = hf_model("llama-gqa-untied")
    data = hf.config.to_dict()
    data.pop("rope_parameters")
    cfg = LLAMA.config_from_hf({**data, "rope_theta": 500.0, "rope_scaling": None}, "LlamaForCausalLM")
    assert cfg.position.rotary_base == 500.0 and cfg == from_hf(hf).config


def test_qwen2_export_refuses_an_out_proj_bias_that_moved_from_zero():
    ours = from_hf(hf_model("qwen2-mqa-tied"))
    with torch.no_grad():
        ours.layers[1].self_attn.out_proj.bias[3] = 0.5
    with pytest.raises(ValueError, match=r"layers\.1\.self_attn\.out_proj\.bias is not zero.*family='llama'"):
        to_hf(ours)
    ids = torch.randint(0, V, (2, 5))
    with torch.no_grad():  # as a Llama with attention_bias, the bias is kept
        assert real_max_diff(to_hf(ours, "llama")(input_ids=ids).logits, ours(ids)) <= TOL


# ---- the parity above can fail: a broken mapping is seen ---------------------------------------


def _interleave_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows reordered per head from halves (0, R/2), (1, R/2 + 1), ... to adjacent pairs:
    what a converter that forgot the rotary pairing convention would produce."""
    dh = w.shape[0] // heads
    order = torch.arange(dh).view(2, dh // 2).t().reshape(-1)
    return w.view(heads, dh, -1)[:, order].reshape(w.shape)


@pytest.mark.parametrize("broken", ["rotary-pairing", "transposed-o_proj", "swapped-gate-up"])
def test_a_broken_mapping_breaks_the_parity(broken):
    hf = hf_model("llama-gqa-untied")
    ours = from_hf(hf)
    attn, ffn = ours.layers[0].self_attn, ours.layers[0].ffn
    with torch.no_grad():
        if broken == "rotary-pairing":
            q, k, v = attn.qkv_proj.weight.split([32, 16, 16])
            attn.qkv_proj.weight.copy_(torch.cat([_interleave_rows(q, 4), _interleave_rows(k, 2), v]))
        elif broken == "transposed-o_proj":
            attn.out_proj.weight.copy_(attn.out_proj.weight.t().clone())
        else:
            ffn.w13.weight.copy_(ffn.w13.weight.roll(40, dims=0))
    ids, mask = right_padded([9, 5], V)
    with torch.no_grad():
        assert real_max_diff(ours(ids, mask), hf(input_ids=ids, attention_mask=mask).logits, mask) > 100 * TOL
