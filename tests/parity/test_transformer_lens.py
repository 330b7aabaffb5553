"""GPT-2 inside attnlab against TransformerLens on the same weights: a small random
GPT2LMHeadModel converted with `attnlab.from_hf`, and TransformerLens's bridge built around that
same Hugging Face model offline (raw weights: no LayerNorm folding, no centring, which would
change the residual stream). Read through attnlab's hook points (`run_with_cache`), the residual
stream before, between and after each layer's sublayers, the attention patterns, the per-head
outputs before (z) and after the output projection (result, bias excluded), the final norm and
the logits agree with TransformerLens's `run_with_cache` within 1e-5.

Layouts: TransformerLens writes per-head tensors (B, T, H, ...); attnlab (B, H, T, ...).
"""

import pytest
import torch
from transformer_lens.model_bridge.sources import build_bridge_from_module
from transformers import GPT2Config, GPT2LMHeadModel

import attnlab
from attnlab.inspect.hooks import run_with_cache

V, D, H, L, T = 97, 48, 4, 3, 9
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=V, n_positions=32, n_embd=D, n_layer=L, n_head=H, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    hf = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # weights larger than the initialisation's, so that layers differ visibly
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ours = attnlab.from_hf(hf).eval()  # before the bridge: it rewires the Hugging Face model in place
    bridge = build_bridge_from_module(hf, "GPT2LMHeadModel", hf_config=hf.config)
    bridge.set_use_attn_result(True)
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(ids)
    return ours, ids, logits, cache


def _our_activations(model, ids):
    """attnlab's activations by its hook-point names, under TransformerLens's names, in its layouts."""
    names = ["layers.*.hook_resid_pre", "layers.*.hook_resid_mid", "layers.*.hook_resid_post",
             "layers.*.self_attn.hook_pattern", "layers.*.self_attn.hook_z", "layers.*.self_attn.hook_result",
             "hook_final"]
    with torch.no_grad():
        logits, cache = run_with_cache(model, ids, names=names)
    got = {"logits": logits, "ln_final.hook_out": cache["hook_final"]}
    for i in range(L):
        for ours, theirs in (("hook_resid_pre", "hook_resid_pre"), ("hook_resid_mid", "hook_resid_mid"),
                             ("hook_resid_post", "hook_resid_post"), ("self_attn.hook_pattern", "attn.hook_pattern")):
            got[f"blocks.{i}.{theirs}"] = cache[f"layers.{i}.{ours}"]
        for point in ("hook_z", "hook_result"):  # (B, H, T, ...) -> (B, T, H, ...)
            got[f"blocks.{i}.attn.{point}"] = cache[f"layers.{i}.self_attn.{point}"].transpose(1, 2)
    return got


def test_residual_stream_patterns_and_head_outputs_equal_transformer_lens(models):
    ours, ids, logits, cache = models
    got = _our_activations(ours, ids)
    torch.testing.assert_close(got["logits"], logits, **TOL)
    for i in range(L):
        for name in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_pattern", "attn.hook_z",
                     "attn.hook_result"):
            key = f"blocks.{i}.{name}"
            assert got[key].shape == cache[key].shape, key
            torch.testing.assert_close(got[key], cache[key], **TOL, msg=lambda m, key=key: f"{key}: {m}")
    torch.testing.assert_close(got["ln_final.hook_out"], cache["ln_final.hook_out"], **TOL)
    # the per-head results and the output bias add up to the attention sublayer's output
    attn_out = cache["blocks.0.hook_resid_mid"] - cache["blocks.0.hook_resid_pre"]
    torch.testing.assert_close(got["blocks.0.attn.hook_result"].sum(2) + ours.layers[0].self_attn.out_proj.bias,
                               attn_out, **TOL)
