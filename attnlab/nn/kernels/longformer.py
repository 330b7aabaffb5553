"""Longformer attention (Beltagy et al. 2020, https://arxiv.org/abs/2004.05150).

A sliding window (|i - j| <= w; causal: 0 <= i - j <= w) plus global tokens, chosen by position
and/or by token id (e.g. [CLS]): a global query sees every key and every query sees the global
keys (causal: only those on its left). Notation: B batch, H heads, T length, Dh head_dim, w
window, g global tokens. Time O(T (w + g)); the global queries run a dense row pass, O(g T).

Without a bias and with at most a padding mask, global keys and queries ride inside the band
kernel (`attnlab.nn.kernels.band`); otherwise the block kernel plus a dense pass for global rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from attnlab.nn.kernels.band import band_attention
from attnlab.nn.kernels.base import Kernel, KernelSetup, TokenIds
from attnlab.nn.kernels.block_sparse import BlockPlan, block_sparse_attention
from attnlab.nn.kernels.sparse import (SPARSE, check_int, check_qkv, default_scale, default_tile, global_index,
                                       global_rows, key_valid, window_table)
from attnlab.nn.masks import causal_mask, window_mask


@dataclass
class LongformerOptions:
    """`attention.kernel_options` of kernel `longformer`."""

    window: int = field(default=256, metadata={"min": 0})  # keys within this distance on each allowed side
    global_positions: list[int] = field(default_factory=list, metadata={"min": 0})  # global tokens by position
    global_token_id: int | None = field(default=None, metadata={"min": 0, "token_id": True})  # e.g. [CLS]

    legacy: ClassVar[dict[str, str]] = {"window": "window", "global_positions": "global_positions",
                                        "global_token_id": "global_token_id"}


def longformer_mask(t: int, window: int, global_tokens: Tensor | None = None, *, causal: bool = False,
                    device: torch.device | None = None) -> Tensor:
    """The pattern as a dense bool mask (True = may attend): window plus global tokens.

    Args:
        t: length T; window: w.
        global_tokens: 1-D positions (-> (T, T)) or (B, T) bool flags (-> (B, 1, T, T)); None = none.

    Returns:
        bool (T, T) or (B, 1, T, T).
    """
    mask = window_mask(t, window, causal=causal, device=device)
    if global_tokens is None:
        return mask
    if global_tokens.dtype == torch.bool:
        flags = global_tokens.to(mask.device)  # (B, T)
    else:
        flags = torch.zeros(1, t, dtype=torch.bool, device=mask.device)
        flags[:, global_tokens[global_tokens < t].long().to(mask.device)] = True
    out = mask[None] | flags[:, :, None] | flags[:, None, :]  # (B, T, T)
    if causal:
        out = out & causal_mask(t, device=mask.device)
    return out[:, None] if global_tokens.dtype == torch.bool else out[0]


def longformer_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int, global_tokens: Tensor | None = None,
                         causal: bool = False, scale: float | None = None, mask: Tensor | None = None,
                         bias: Tensor | None = None, dropout_p: float = 0.0, tile: int | None = None) -> Tensor:
    """Sliding window plus global tokens.

    Args:
        q, k, v: (B, H, T, Dh).
        window: w >= 0; causal: keys j <= i only; scale: default 1 / sqrt(Dh).
        global_tokens: a 1-D LongTensor of global positions, or (B, T) bool flags (e.g.
            `input_ids == cls_id`); None = none. A global query sees every (allowed) key and every
            query sees the global keys (causal: those on its left).
        mask: bool, True = may attend, broadcastable to (B, H, T, T) (padding: (B, 1, 1, T)).
        bias: float scores added before the softmax, broadcastable to (B, H, T, T).
        dropout_p: dropout on the weights; tile: block size (no effect on results).

    Returns:
        (B, H, T, Dh).

    Raises:
        ValueError: for a bad window, global_tokens or shapes.
    """
    check_int("window", window, low=0)
    check_qkv(q, k, v)
    B, H, T, _ = q.shape
    gidx = global_index(global_tokens, T, B, q.device)  # (B, g), sentinel T
    s = default_scale(q, scale)
    valid = key_valid(q, mask, bias)
    if valid is not False:  # global queries and keys inside the band kernel: no full-size copies
        return band_attention(q, k, v, window=window, causal=causal, tile=tile or default_tile(window, banded=True),
                              scale=s, key_valid=valid, global_keys=gidx, global_queries=gidx, dropout_p=dropout_p)
    b = tile or default_tile(window)
    plan = BlockPlan(b, window_table(T, b, window, causal), window, causal, gidx if gidx.shape[1] else None)
    out = block_sparse_attention(q, k, v, plan, scale=s, mask=mask, bias=bias, dropout_p=dropout_p)
    return global_rows(q, k, v, out, gidx, scale=s, causal=causal, mask=mask, bias=bias, dropout_p=dropout_p)


class LongformerKernel(Kernel):
    """`attention.kernel='longformer'`. Global tokens by position (`global_positions`) and/or by
    token id (`global_token_id`, read from the stack's `TokenIds`, set before its layers run)."""

    name = "longformer"
    supports = SPARSE
    Options = LongformerOptions

    def __init__(self, window: int, global_positions: list[int] | tuple[int, ...] = (),
                 token_ids: TokenIds | None = None, global_token_id: int | None = None):
        super().__init__()
        if (token_ids is None) != (global_token_id is None):
            raise ValueError("longformer global_token_id needs the stack's token_ids (and token_ids an id)")
        self.window = window
        self.global_positions = list(global_positions)
        self.token_ids, self.global_token_id = token_ids, global_token_id

    @classmethod
    def build(cls, options: LongformerOptions, setup: KernelSetup) -> "LongformerKernel":
        by_id = options.global_token_id is not None
        return cls(options.window, options.global_positions, setup.token_ids if by_id else None,
                   options.global_token_id)

    @staticmethod
    def needs_token_ids(options: LongformerOptions) -> bool:
        return options.global_token_id is not None

    def flags(self, batch: int, t: int, device: torch.device | None) -> Tensor | None:
        """(B, T) bool: global tokens, or None when there are none."""
        flags = None
        if self.token_ids is not None:
            ids = self.token_ids.value
            if ids is None or ids.shape != (batch, t):
                raise ValueError("longformer global_token_id needs the token ids of every key: run the model on the "
                                 "whole sequence (a KV cache is not supported with global_token_id)")
            flags = ids == self.global_token_id
        if self.global_positions:
            by_pos = torch.zeros(batch, t, dtype=torch.bool, device=device)
            pos = torch.tensor([p for p in self.global_positions if p < t], dtype=torch.long, device=device)
            by_pos[:, pos] = True
            flags = by_pos if flags is None else flags | by_pos
        return flags

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor:
        """The pattern as a bool (T, T) or (B, 1, T, T) mask (True = may attend)."""
        return longformer_mask(t, self.window, self.flags(batch, t, device), causal=causal, device=device)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        flags = self.flags(q.shape[0], q.shape[2], q.device)
        out = longformer_attention(q, k, v, window=self.window, global_tokens=flags, causal=causal, scale=scale,
                                   mask=mask, bias=bias, dropout_p=dropout_p)
        return out, None
