"""Linformer equals its formula softmax(Q (E K)^T / sqrt(d)) (F V)."""

import pytest
import torch

from attnlab.nn.kernels.linformer import LinformerKernel


@pytest.mark.parametrize("sharing", ["layer", "head"])
def test_linformer_equals_its_formula_with_padding(sharing):
    torch.manual_seed(0)
    B, H, T, D, k = 2, 3, 50, 8, 12
    kernel = LinformerKernel(max_len=64, k=k, num_heads=H, sharing=sharing)
    q, key, v = (torch.randn(B, H, T, D) for _ in range(3))
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[1, 40:] = False
    out, weights = kernel(q, key, v, scale=D**-0.5, causal=False, mask=keep[:, None, None, :], need_weights=True)
    for b in range(B):
        for h in range(H):
            E = kernel.e_proj[..., :T] if sharing == "layer" else kernel.e_proj[h, :, :T]
            F = kernel.f_proj[..., :T] if sharing == "layer" else kernel.f_proj[h, :, :T]
            real = keep[b]
            K, V = key[b, h][real], v[b, h][real]  # padded keys contribute nothing
            w = torch.softmax(q[b, h] @ (E[:, real] @ K).T / D**0.5, dim=-1)
            torch.testing.assert_close(out[b, h], w @ (F[:, real] @ V), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(weights[b, h], w, atol=1e-6, rtol=1e-5)
    assert weights.shape == (B, H, T, k)


def test_linformer_gradients_reach_the_projections():
    kernel = LinformerKernel(max_len=32, k=4, num_heads=2)
    q, key, v = (torch.randn(1, 2, 20, 8) for _ in range(3))
    out, _ = kernel(q, key, v, scale=1.0, causal=False)
    out.sum().backward()
    assert kernel.e_proj.grad[:, :20].abs().sum() > 0 and kernel.f_proj.grad[:, :20].abs().sum() > 0
    assert kernel.e_proj.grad[:, 20:].abs().sum() == 0  # positions beyond T are unused


def test_linformer_refuses_what_it_cannot_do():
    kernel = LinformerKernel(max_len=16, k=4, num_heads=2)
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(ValueError, match="bidirectional"):
        kernel(q, q, q, scale=1.0, causal=True)
    with pytest.raises(ValueError, match="max_len"):
        kernel(*(torch.randn(1, 2, 17, 8) for _ in range(3)), scale=1.0, causal=False)
    with pytest.raises(ValueError, match="key padding mask"):
        kernel(q, q, q, scale=1.0, causal=False, mask=torch.ones(1, 1, 16, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="sharing"):
        LinformerKernel(max_len=16, k=4, num_heads=2, sharing="kv")
