"""The configured position settings reach every layer of a built model. Rotary: each
self-attention's output equals attention computed from its own weights with q and k rotated by
the formula at the configured base and rotary_dim (features past rotary_dim untouched). ALiBi:
each layer gets the paper's bias for the model's head count."""

import math

import pytest
import torch

from attnlab import ModelConfig, build_model


def rotate_formula(x: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """x (B, H, T, Dh) at positions 0..T-1: the pair (i, i + R/2) rotated by t * base^(-2i/R)."""
    T, half = x.shape[2], rotary_dim // 2
    t = torch.arange(T, dtype=torch.float64)[:, None]
    angles = t * base ** (-2 * torch.arange(half, dtype=torch.float64) / rotary_dim)  # (T, R/2)
    cos, sin = angles.cos(), angles.sin()
    a, b, rest = x[..., :half].double(), x[..., half:rotary_dim].double(), x[..., rotary_dim:].double()
    return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], dim=-1)


def reference_self_attention(attn, x: torch.Tensor, causal: bool, rotary_dim: int, base: float) -> torch.Tensor:
    """softmax(rot(q) rot(k)^T / sqrt(Dh)) v through `attn`'s own projections, in float64."""
    B, T, _ = x.shape
    H, G, Dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
    w, bias = attn.qkv_proj.weight.double(), attn.qkv_proj.bias
    y = x.double() @ w.T + (bias.double() if bias is not None else 0)
    q, k, v = y.view(B, T, H + 2 * G, Dh).transpose(1, 2).split([H, G, G], dim=1)
    q, k = rotate_formula(q, rotary_dim, base), rotate_formula(k, rotary_dim, base)
    k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(Dh)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * Dh)
    ob = attn.out_proj.bias
    return out @ attn.out_proj.weight.double().T + (ob.double() if ob is not None else 0)


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("rotary_dim, base", [(4, 500.0), (None, 123.0)])
def test_configured_rotary_reaches_every_layer(arch, rotary_dim, base):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=40, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm="rmsnorm", attention={"num_kv_heads": 2},
                      position={"scheme": "rotary", "rotary_base": base, "rotary_dim": rotary_dim})
    model = build_model(cfg).eval()
    seen = {}

    def capture(name):
        def hook(module, args, kwargs, output):
            seen[name] = (module, args[0], output[0])
        return hook

    for i, layer in enumerate(model.layers):
        layer.self_attn.register_forward_hook(capture(i), with_kwargs=True)
    with torch.no_grad():
        model(torch.randint(1, 40, (2, 9)))
    assert sorted(seen) == [0, 1]
    for i, (attn, x, out) in seen.items():
        expected = reference_self_attention(attn, x, arch == "decoder", rotary_dim or 8, base)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5, msg=f"layer {i}")


@pytest.mark.parametrize("num_heads", [4, 6])
def test_alibi_bias_of_a_built_model_reaches_every_layer(num_heads):
    # ALiBi's bias is built once per stack and handed to each layer: every self-attention gets
    # -slope_h |i - j| with the paper's slopes for H heads (6 is not a power of two)
    m = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * (h + 1) / m) for h in range(m)] + [2 ** (-8 * (2 * j + 1) / (2 * m))
                                                            for j in range(num_heads - m)]
    cfg = ModelConfig(arch="decoder", vocab_size=40, d_model=48, num_layers=2, num_heads=num_heads, d_ff=64,
                      dropout=0.0, position={"scheme": "alibi"})
    model = build_model(cfg).eval()
    seen = []
    for layer in model.layers:
        layer.self_attn.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(kwargs["bias"]),
                                                  with_kwargs=True)
    T = 7
    with torch.no_grad():
        model(torch.randint(1, 40, (2, T)))
    distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs().double()  # (Tq, Tk)
    expected = -torch.tensor(slopes, dtype=torch.float64)[:, None, None] * distance  # (H, Tq, Tk)
    assert len(seen) == 2
    for bias in seen:
        torch.testing.assert_close(bias.double().expand(2, -1, -1, -1), expected.expand(2, -1, -1, -1))
