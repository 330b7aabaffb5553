"""The attention computation itself, apart from the projections around it.

Two kernels: `attention_weights` (eager: the softmax weights as a tensor, for inspection
and for variants the fused kernel cannot express) and `sdpa_attention` (PyTorch's fused
scaled_dot_product_attention). Both take the same bool mask (True = may attend) and an
optional additive float bias, and both return zeros for a query that may attend nowhere
(e.g. a padding query under a causal mask), never NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def attention_weights(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax over keys of (B, H, Tq, Tk) scores; masked keys get exactly 0."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(scores.dtype)  # fp32 softmax under bf16
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # all-masked rows: NaN -> 0
    return weights


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: Tensor | None = None,
                   bias: Tensor | None = None, dropout_p: float = 0.0, enable_gqa: bool = False) -> Tensor:
    """Fused softmax(scale * q k^T + bias, masked) v; q (B, H, Tq, Dh) -> (B, H, Tq, Dh).
    With enable_gqa, k and v may have fewer heads G (dividing H), each serving H/G queries."""
    attn_mask = mask
    if bias is not None:
        bias = bias.to(q.dtype)
        attn_mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=enable_gqa)
