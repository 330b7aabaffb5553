"""PyTorch's fused scaled_dot_product_attention (FlashAttention / memory-efficient kernels where
the device has them): the weights are never held in memory, so dot-product-shaped scores only
and no weights returned (asking for them takes the dense reference, the eager kernel)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.kernels.base import Kernel, Supports


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: Tensor | None = None,
                   bias: Tensor | None = None, dropout_p: float = 0.0, enable_gqa: bool = False) -> Tensor:
    """Fused softmax(scale * q k^T + bias, masked) v; q (B, H, Tq, Dh) -> (B, H, Tq, Dh).
    With enable_gqa, k and v may have fewer heads G (dividing H), each serving H/G queries.
    A query that may attend nowhere gets zeros."""
    attn_mask = mask
    if bias is not None:
        bias = bias.to(q.dtype)
        attn_mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=enable_gqa)


class SdpaKernel(Kernel):
    """`attention.kernel='sdpa'`: the fused kernel, or an error for a variant it cannot express."""

    name = "sdpa"
    supports = Supports(weights=False, any_score=False, value_term=False, fused=True)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        out = sdpa_attention(q, k, v, scale=scale, mask=mask, bias=bias, dropout_p=dropout_p,
                             enable_gqa=k.shape[1] != q.shape[1])
        return out, None
