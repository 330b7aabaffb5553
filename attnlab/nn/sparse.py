"""Long-input attention kernels: sliding window, Longformer, BigBird (blockwise, linear in T).

Notation: B batch, H heads, T length, Dh head_dim, w window, b block, g global tokens.
Positions are tensor indices 0..T-1; the exact patterns are in `attnlab.nn.sparse_patterns`
and, as dense bool masks for reference and plots, in `attnlab.nn.masks`.

- sliding window (Beltagy et al. 2020, https://arxiv.org/abs/2004.05150): query i sees keys j
  with |i - j| <= w (causal: 0 <= i - j <= w), i.e. w keys on each allowed side plus itself.
- Longformer (same paper): the window plus global tokens (by position or by token id); a
  global query sees every key, and every query sees the global keys.
- BigBird (Zaheer et al. 2020, https://arxiv.org/abs/2007.14062): blocks of b; query block i
  sees blocks i-W..i+W, the first G blocks (global both ways) and R random blocks fixed by a seed.

Every kernel takes q, k, v (B, H, T, Dh) after the score's own preparation, and the usual
bool mask (True = may attend, broadcastable to (B, H, T, T); padding (B, 1, 1, T) costs O(T))
and float bias; it never builds a T x T tensor itself. Global queries (Longformer, BigBird) run
a dense row attention over all T keys: O(g T) memory. Without a bias and with at most a
padding mask, all three run the band kernel of `attnlab.nn.band` (no gathers or copies of
full-length tensors); other masks and biases take `attnlab.nn.block_sparse`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.band import band_attention
from attnlab.nn.block_sparse import BlockPlan, _as_4d, block_sparse_attention
from attnlab.nn.sparse_patterns import bigbird_random_part, bigbird_table, global_index, sliding_window_table


def default_tile(window: int) -> int:
    """The tile a sliding window is computed in: 64, or smaller for narrow windows (fewer
    wasted scores at the window's ragged edges)."""
    return 64 if window >= 64 else max(8, 1 << max(0, math.ceil(math.log2(max(window, 1)))))


def _global_rows(q: Tensor, k: Tensor, v: Tensor, out: Tensor, rows: Tensor, *, scale: float, causal: bool,
                 mask: Tensor | None, bias: Tensor | None, dropout_p: float) -> Tensor:
    """Replace the outputs of the query rows (B, g) (sentinel T = none) by dense attention of
    those queries over every key. out (B, H, T, Dh) -> (B, H, T, Dh)."""
    B, H, T, Dh = q.shape
    g = rows.shape[1]
    if g == 0:
        return out
    rc = rows.clamp(max=T - 1)
    qg = q.gather(2, rc[:, None, :, None].expand(B, H, g, Dh))  # (B, H, g, Dh)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # (B, H, g, T)
    keys = torch.arange(T, device=q.device)
    allowed = (keys[None, None, :] <= rc[:, :, None]) if causal else torch.ones(1, 1, T, dtype=torch.bool,
                                                                                device=q.device)
    allowed = allowed[:, None]  # (B or 1, 1, g, T)
    mask, bias = _as_4d(mask, "mask", T), _as_4d(bias, "bias", T)
    if mask is not None:
        m = mask.expand(B, *mask.shape[1:])
        if m.shape[2] > 1:
            m = m.gather(2, rc[:, None, :, None].expand(B, m.shape[1], g, T))
        allowed = allowed & m
    if bias is not None:
        bb = bias.expand(B, *bias.shape[1:])
        if bb.shape[2] > 1:
            bb = bb.gather(2, rc[:, None, :, None].expand(B, bb.shape[1], g, T))
        scores = scores + bb.to(scores.dtype)
    allowed = allowed.expand(B, H, g, T)
    work = torch.promote_types(scores.dtype, torch.float32)  # fp32 softmax under bf16, fp64 stays fp64
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1, dtype=work).to(scores.dtype)
    weights = weights.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # a row with no key: zeros, not NaN
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    og = torch.matmul(weights, v)  # (B, H, g, Dh)
    padded = torch.cat([out, out.new_zeros(B, H, 1, Dh)], dim=2)  # row T takes the empty slots
    return padded.scatter(2, rows[:, None, :, None].expand(B, H, g, Dh), og)[:, :, :T]


def _scale(q: Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must all be (B, H, T, Dh) of one shape (self-attention), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")


def _key_valid(q: Tensor, mask: Tensor | None, bias: Tensor | None) -> Tensor | None | bool:
    """(B, T) key validity when the band fast path applies (no bias; no mask or a key mask
    (B or 1, 1, 1, T)); False when the general block kernel is needed."""
    if bias is not None:
        return False
    if mask is None:
        return None
    B, _, T, _ = q.shape
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True = may attend), got {mask.dtype}")
    m = _as_4d(mask, "mask", T)
    if m.shape[1] != 1 or m.shape[2] != 1:
        return False
    return m[:, 0, 0, :].expand(B, T)


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
        tile: block size of the computation (default `default_tile(window)`); no effect on results.

    Returns:
        (B, H, T, Dh).

    Raises:
        ValueError: for a negative window or mismatched shapes.
    """
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ValueError(f"window must be an integer >= 0, got {window!r}")
    _check_qkv(q, k, v)
    b = tile or default_tile(window)
    key_valid = _key_valid(q, mask, bias)
    if key_valid is not False:
        return band_attention(q, k, v, window=window, causal=causal, tile=b, scale=_scale(q, scale),
                              key_valid=key_valid, dropout_p=dropout_p)
    plan = BlockPlan(b, sliding_window_table(q.shape[2], b, window, causal), window, causal)
    return block_sparse_attention(q, k, v, plan, scale=_scale(q, scale), mask=mask, bias=bias, dropout_p=dropout_p)


def longformer_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int, global_tokens: Tensor | None = None,
                         causal: bool = False, scale: float | None = None, mask: Tensor | None = None,
                         bias: Tensor | None = None, dropout_p: float = 0.0, tile: int | None = None) -> Tensor:
    """Sliding window plus global tokens (Longformer).

    Args:
        q, k, v, window, causal, scale, mask, bias, dropout_p, tile: as `sliding_window_attention`.
        global_tokens: a 1-D LongTensor of global positions, or (B, T) bool flags (e.g.
            `input_ids == cls_id`); None = none. A global query sees every (allowed) key and every
            query sees the global keys (causal: those on its left).

    Returns:
        (B, H, T, Dh).

    Raises:
        ValueError: for a bad window, global_tokens or shapes.
    """
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ValueError(f"window must be an integer >= 0, got {window!r}")
    _check_qkv(q, k, v)
    B, H, T, _ = q.shape
    gidx = global_index(global_tokens, T, B, q.device)  # (B, g), sentinel T
    b = tile or default_tile(window)
    s = _scale(q, scale)
    key_valid = _key_valid(q, mask, bias)
    if key_valid is not False:  # global queries and keys inside the band kernel: no full-size copies
        return band_attention(q, k, v, window=window, causal=causal, tile=b, scale=s, key_valid=key_valid,
                              global_keys=gidx, global_queries=gidx, dropout_p=dropout_p)
    plan = BlockPlan(b, sliding_window_table(T, b, window, causal), window, causal, gidx if gidx.shape[1] else None)
    out = block_sparse_attention(q, k, v, plan, scale=s, mask=mask, bias=bias, dropout_p=dropout_p)
    return _global_rows(q, k, v, out, gidx, scale=s, causal=causal, mask=mask, bias=bias, dropout_p=dropout_p)


def bigbird_attention(q: Tensor, k: Tensor, v: Tensor, *, block: int, window_blocks: int = 1,
                      global_blocks: int = 1, random_blocks: int = 3, seed: int = 0, causal: bool = False,
                      scale: float | None = None, mask: Tensor | None = None, bias: Tensor | None = None,
                      dropout_p: float = 0.0) -> Tensor:
    """BigBird: window, global and random blocks (see `sparse_patterns.bigbird_table`).

    With no bias and at most a key mask, this runs the band kernel (`attnlab.nn.band`): the
    window blocks as a band, the global blocks as global keys (and, bidirectional, global
    queries), the random blocks gathered per block; otherwise the general block kernel.

    Args:
        q, k, v, causal, scale, mask, bias, dropout_p: as `sliding_window_attention`.
        block: b; window_blocks: W per side; global_blocks: G (the first G blocks);
        random_blocks: R per query block; seed: fixes the random blocks.

    Returns:
        (B, H, T, Dh).
    """
    _check_qkv(q, k, v)
    B, H, T, _ = q.shape
    table = bigbird_table(T, block, window_blocks, global_blocks, random_blocks, seed, causal)
    n_rows = min(global_blocks * block, T)
    rows = torch.arange(n_rows, device=q.device)[None].expand(B, n_rows)
    key_valid = _key_valid(q, mask, bias)
    if key_valid is not False:
        # window blocks as a band, the global blocks as global keys, the random blocks gathered
        # per tile; a causal global query sees only keys of global blocks, already its own
        return band_attention(q, k, v, window=None, window_blocks=window_blocks, causal=causal, tile=block,
                              scale=_scale(q, scale), key_valid=key_valid, global_keys=rows,
                              global_queries=None if causal else rows,
                              random_blocks=bigbird_random_part(table, window_blocks, global_blocks, causal),
                              dropout_p=dropout_p)
    out = block_sparse_attention(q, k, v, BlockPlan(block, table, None, causal), scale=_scale(q, scale), mask=mask,
                                 bias=bias, dropout_p=dropout_p)
    return _global_rows(q, k, v, out, rows, scale=_scale(q, scale), causal=causal, mask=mask, bias=bias,
                        dropout_p=dropout_p)


# ---- kernels injected into MultiHeadAttention ---------------------------------------------------


class SlidingWindowKernel(nn.Module):
    """`attention.kernel='sliding_window'`: see `sliding_window_attention`."""

    def __init__(self, window: int):
        super().__init__()
        self.window = window

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor:
        """The pattern as a bool (T, T) mask (True = may attend)."""
        from attnlab.nn.masks import sliding_window_mask

        return sliding_window_mask(t, self.window, causal=causal, device=device)

    def forward(self, q, k, v, *, scale, causal, mask=None, bias=None, dropout_p=0.0):
        return sliding_window_attention(q, k, v, window=self.window, causal=causal, scale=scale, mask=mask,
                                        bias=bias, dropout_p=dropout_p)


class LongformerKernel(nn.Module):
    """`attention.kernel='longformer'`. Global tokens by position (`global_positions`) and/or by
    token id: `token_flags` is a holder whose `.value` the model sets to (B, T) bool flags
    (`input_ids == global_token_id`) before its layers run."""

    def __init__(self, window: int, global_positions: list[int] | tuple[int, ...] = (), token_flags=None):
        super().__init__()
        self.window = window
        self.global_positions = list(global_positions)
        self.token_flags = token_flags

    def flags(self, batch: int, t: int, device: torch.device | None) -> Tensor | None:
        """(B, T) bool: global tokens, or None when there are none."""
        flags = None
        if self.token_flags is not None:
            flags = self.token_flags.value
            if flags is None or flags.shape != (batch, t):
                raise ValueError("longformer global_token_id needs the token ids of every key: run the model on the "
                                 "whole sequence (a KV cache is not supported with global_token_id)")
        if self.global_positions:
            by_pos = torch.zeros(batch, t, dtype=torch.bool, device=device)
            pos = torch.tensor([p for p in self.global_positions if p < t], dtype=torch.long, device=device)
            by_pos[:, pos] = True
            flags = by_pos if flags is None else flags | by_pos
        return flags

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor:
        """The pattern as a bool (T, T) or (B, 1, T, T) mask (True = may attend)."""
        from attnlab.nn.masks import longformer_mask

        flags = self.flags(batch, t, device)
        return longformer_mask(t, self.window, flags, causal=causal, device=device)

    def forward(self, q, k, v, *, scale, causal, mask=None, bias=None, dropout_p=0.0):
        flags = self.flags(q.shape[0], q.shape[2], q.device)
        return longformer_attention(q, k, v, window=self.window, global_tokens=flags, causal=causal, scale=scale,
                                    mask=mask, bias=bias, dropout_p=dropout_p)


class BigBirdKernel(nn.Module):
    """`attention.kernel='bigbird'`: see `bigbird_attention`; `seed` differs per layer."""

    def __init__(self, block: int, window_blocks: int, global_blocks: int, random_blocks: int, seed: int):
        super().__init__()
        self.block, self.window_blocks, self.global_blocks = block, window_blocks, global_blocks
        self.random_blocks, self.seed = random_blocks, seed

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor:
        """The pattern as a bool (T, T) mask (True = may attend)."""
        from attnlab.nn.masks import bigbird_mask

        return bigbird_mask(t, self.block, self.window_blocks, self.global_blocks, self.random_blocks, self.seed,
                            causal=causal, device=device)

    def forward(self, q, k, v, *, scale, causal, mask=None, bias=None, dropout_p=0.0):
        return bigbird_attention(q, k, v, block=self.block, window_blocks=self.window_blocks,
                                 global_blocks=self.global_blocks, random_blocks=self.random_blocks, seed=self.seed,
                                 causal=causal, scale=scale, mask=mask, bias=bias, dropout_p=dropout_p)
