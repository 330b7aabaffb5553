"""GPT-2 inside attnlab against TransformerLens on the same weights: a small random
GPT2LMHeadModel converted with `attnlab.from_hf`, and TransformerLens's bridge built around that
same Hugging Face model offline (raw weights: no LayerNorm folding, no centring, which would
change the residual stream). The residual stream before, between and after each layer's
sublayers, the attention patterns, the per-head outputs before (z) and after the output
projection (result, bias excluded), the final norm and the logits agree within 1e-5.

Layouts: TransformerLens writes per-head tensors (B, T, H, ...); attnlab (B, H, T, ...).
"""

import pytest
import torch
from transformer_lens.model_bridge.sources import build_bridge_from_module
from transformers import GPT2Config, GPT2LMHeadModel

import attnlab
from attnlab.inspect.attention_maps import attention_maps

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
    """attnlab's activations under TransformerLens's names, read by hooks on attnlab's modules."""
    got, handles = {}, []

    def keep(name, read):
        return lambda mod, args, *out: got.__setitem__(name, read(args, out))

    for i in range(L):
        layer = model.layers[i]
        handles += [
            layer.register_forward_pre_hook(keep(f"blocks.{i}.hook_resid_pre", lambda a, o: a[0])),
            layer.ffn_block.norm.register_forward_pre_hook(keep(f"blocks.{i}.hook_resid_mid", lambda a, o: a[0])),
            layer.register_forward_hook(keep(f"blocks.{i}.hook_resid_post", lambda a, o: o[0])),
            layer.self_attn.out_proj.register_forward_pre_hook(keep(f"blocks.{i}.attn.hook_z", lambda a, o: a[0])),
        ]
    handles.append(model.final_norm.register_forward_hook(keep("ln_final.hook_out", lambda a, o: o[0])))
    try:
        with torch.no_grad():
            got["logits"] = model(ids)
    finally:
        for h in handles:
            h.remove()
    maps = attention_maps(model, ids)
    for i in range(L):
        got[f"blocks.{i}.attn.hook_pattern"] = maps[f"layers.{i}.self_attn"]
        z = got[f"blocks.{i}.attn.hook_z"].unflatten(-1, (H, D // H))  # (B, T, H, Dh)
        w = model.layers[i].self_attn.out_proj.weight.unflatten(1, (H, D // H))  # (D, H, Dh)
        got[f"blocks.{i}.attn.hook_z"] = z
        got[f"blocks.{i}.attn.hook_result"] = torch.einsum("bthd,ehd->bthe", z, w)  # each head's share, no bias
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
