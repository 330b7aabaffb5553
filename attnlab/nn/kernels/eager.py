"""The eager kernel: the softmax weights as a tensor (Vaswani et al. 2017, eq. 1).

    weights = softmax(scale q k^T + bias, masked)      (B, H, Tq, Tk), kept for inspection
    out     = dropout(weights) v

The reference every other kernel is tested against, and the path for what a fused kernel
cannot express: the weights themselves, non-dot-product scores (`eager_attention` takes any
scores), Shaw et al.'s relative values term. A query that may attend nowhere (a padding query
under a causal mask) gets zeros, never NaN.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.kernels.base import Kernel, Supports, repeat_kv


def attention_weights(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax over keys of (B, H, Tq, Tk) scores; masked keys get exactly 0."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(scores.dtype)  # fp32 softmax under bf16
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # all-masked rows: NaN -> 0
    return weights


def eager_attention(scores: Tensor, v: Tensor, *, mask: Tensor | None = None, dropout_p: float = 0.0,
                    values: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """softmax(scores, masked) v for any (B, H, Tq, Tk) scores; v (B, H, Tk, Dh).

    `values(dropped_weights)` adds a term computed from the weights after dropout (Shaw et al.'s
    relative values). Returns (out (B, H, Tq, Dh), weights before dropout)."""
    weights = attention_weights(scores, mask)
    dropped = F.dropout(weights, dropout_p) if dropout_p else weights
    out = dropped @ v
    if values is not None:
        out = out + values(dropped)
    return out, weights


class EagerKernel(Kernel):
    """`attention.kernel='eager'`: always materialises the weights (and returns them)."""

    name = "eager"
    supports = Supports(materializes_weights=True)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        k, v = repeat_kv(k, v, q.shape[1])
        scores = (q @ k.transpose(-2, -1)) * scale
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        return eager_attention(scores, v, mask=mask, dropout_p=dropout_p)
