"""Sliding-window attention (Beltagy et al. 2020, https://arxiv.org/abs/2004.05150).

Query i sees the keys j with |i - j| <= w (causal: 0 <= i - j <= w), i.e. w keys on each allowed
side plus itself: time and memory O(T w) instead of O(T^2). Notation: B batch, H heads, T length,
Dh head_dim, w window.

Without a bias and with at most a padding mask this runs the band kernel
(`attnlab.nn.kernels.band`: windows of tiles are views of k and v, no copies); other masks and
biases (a decoder's padding-and-causal mask, ALiBi, T5) take the block kernel
(`attnlab.nn.kernels.block_sparse`), which gathers only the attended entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from attnlab.nn.kernels.band import band_attention
from attnlab.nn.kernels.base import Kernel, KernelSetup
from attnlab.nn.kernels.block_sparse import BlockPlan, block_sparse_attention
from attnlab.nn.kernels.sparse import SPARSE, check_int, check_qkv, default_scale, default_tile, key_valid, window_table
from attnlab.nn.masks import window_mask

@dataclass
class SlidingWindowOptions:
    """`attention.kernel_options` of kernel `sliding_window`."""

    window: int = field(default=256, metadata={"min": 0})  # keys within this distance on each allowed side

    legacy: ClassVar[dict[str, str]] = {"window": "window"}  # flat `attention.*` fields of older configs


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int, causal: bool = False,
                             scale: float | None = None, mask: Tensor | None = None, bias: Tensor | None = None,
                             dropout_p: float = 0.0, tile: int | None = None) -> Tensor:
    """Each query attends to the keys within distance `window` (on its left only when causal).

    Args:
        q, k, v: (B, H, T, Dh).
        window: w >= 0.
        causal: keys j <= i only.
        scale: multiplies q . k; default 1 / sqrt(Dh).
        mask: bool, True = may attend, broadcastable to (B, H, T, T) (padding: (B, 1, 1, T)).
        bias: float scores added before the softmax (ALiBi, T5), broadcastable to (B, H, T, T).
        dropout_p: dropout on the weights.
        tile: block size of the computation (default `default_tile(window, banded=True)`: 32 for
            the banded kernel, 64 for the block one, smaller for narrow windows); no effect on
            results beyond floating-point rounding.

    Returns:
        (B, H, T, Dh).

    Raises:
        ValueError: for a negative window or mismatched shapes.
    """
    check_int("window", window, low=0)
    check_qkv(q, k, v)
    valid = key_valid(q, mask, bias)
    if valid is not False:
        return band_attention(q, k, v, window=window, causal=causal, tile=tile or default_tile(window, banded=True),
                              scale=default_scale(q, scale), key_valid=valid, dropout_p=dropout_p)
    b = tile or default_tile(window)
    plan = BlockPlan(b, window_table(q.shape[2], b, window, causal), window, causal)
    return block_sparse_attention(q, k, v, plan, scale=default_scale(q, scale), mask=mask, bias=bias,
                                  dropout_p=dropout_p)


class SlidingWindowKernel(Kernel):
    """`attention.kernel='sliding_window'`: see `sliding_window_attention`."""

    name = "sliding_window"
    supports = SPARSE
    Options = SlidingWindowOptions

    def __init__(self, window: int):
        super().__init__()
        self.window = window

    @classmethod
    def build(cls, options: SlidingWindowOptions, setup: KernelSetup) -> "SlidingWindowKernel":
        return cls(options.window)

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor:
        """The pattern as a bool (T, T) mask (True = may attend)."""
        return window_mask(t, self.window, causal=causal, device=device)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        out = sliding_window_attention(q, k, v, window=self.window, causal=causal, scale=scale, mask=mask,
                                       bias=bias, dropout_p=dropout_p)
        return out, None
