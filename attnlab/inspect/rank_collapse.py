"""Rank collapse: pure self-attention stacks drive token representations to rank 1.

Dong et al. 2021 (https://arxiv.org/abs/2103.03404): for X (T, d), res(X) = X - 1 x^T with x
the best such vector; in a stack of attention-only layers ||res|| shrinks doubly exponentially
with depth, while skip connections (and, less, feed-forward layers) prevent it. We measure the
relative residual r(X) = ||X - 1 x*^T||_F / ||X||_F with the Frobenius norm, for which the best
x* is the mean token (Dong et al. use a composite l1/l_inf norm; the trend is the same).

Variants of one layer, all with H heads and random weights:
    attention      X <- SA(X)                      (pure attention)
    attention_ffn  X <- FFN(SA(X))                 (no skip connections)
    residual       X <- X + SA(X)                  (skip only)
    transformer    pre-LN X <- X + SA(LN X); X <- X + FFN(LN X)
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import FeedForward
from attnlab.nn.norms import make_norm

VARIANTS = ("attention", "attention_ffn", "residual", "transformer")


def relative_residual(x: Tensor) -> Tensor:
    """||X - 1 mean(X)^T||_F / ||X||_F per example: x (B, T, d) -> (B,). 0 means rank 1."""
    res = x - x.mean(dim=-2, keepdim=True)
    return res.flatten(1).norm(dim=-1) / x.flatten(1).norm(dim=-1).clamp(min=1e-30)


class _Layer(nn.Module):
    def __init__(self, variant: str, d_model: int, num_heads: int):
        super().__init__()
        self.variant = variant
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, 4 * d_model) if variant in ("attention_ffn", "transformer") else None
        self.norm1 = make_norm("layernorm", d_model) if variant == "transformer" else None
        self.norm2 = make_norm("layernorm", d_model) if variant == "transformer" else None

    def forward(self, x: Tensor) -> Tensor:
        if self.variant == "attention":
            return self.attn(x)[0]
        if self.variant == "attention_ffn":
            return self.ffn(self.attn(x)[0])
        if self.variant == "residual":
            return x + self.attn(x)[0]
        x = x + self.attn(self.norm1(x))[0]
        return x + self.ffn(self.norm2(x))


def rank_collapse(variant: str, *, depth: int = 12, seq_len: int = 32, d_model: int = 64, num_heads: int = 4,
                  batch_size: int = 8, seed: int = 0) -> Tensor:
    """Mean relative residual after 0, 1, ..., depth layers on random inputs (B, T, d) ~ N(0, 1).

    Args:
        variant: one of `attention`, `attention_ffn`, `residual`, `transformer`.
        seed: weights and inputs come from it.

    Returns:
        (depth + 1,) residuals; entry 0 is the input's.

    Raises:
        ValueError: an unknown variant or a depth below 1.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not one of {', '.join(VARIANTS)}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        layers = [_Layer(variant, d_model, num_heads) for _ in range(depth)]  # torch's default init
        x = torch.randn(batch_size, seq_len, d_model)
        out = [relative_residual(x).mean()]
        for layer in layers:
            x = layer(x)
            out.append(relative_residual(x).mean())
    return torch.stack(out)


def plot_rank_collapse(curves: dict[str, Tensor], path: str | os.PathLike) -> str:
    """Relative residual against depth, log scale, one line per variant."""
    from attnlab.inspect.plots import plot_lines

    series = {n: (list(range(len(c))), c.clamp(min=1e-12).tolist()) for n, c in curves.items()}
    return plot_lines(series, path, xlabel="depth (layers)", ylabel="||res(X)|| / ||X||",
                      title="rank collapse", logy=True)
