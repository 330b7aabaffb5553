"""Which keys each query may see under the long-input attention patterns.

Notation: T sequence length, b block (tile) size, NQ = ceil(T / b) query blocks, n key blocks
per query block, w window. Positions are tensor indices 0..T-1 (not position ids), so the
pattern is the same with or without padding.

A pattern is described twice, and the two descriptions must agree (the tests check it):
- as a *block table* for the blockwise kernels (`attnlab.nn.block_sparse`): for each query
  block, the key blocks it gathers (sentinel NQ = "no block"), refined element-wise by a band
  |i - j| <= w and by causality;
- as a dense bool (T, T) mask (True = may attend) in `attnlab.nn.masks`, for the dense
  reference and for plots.

    sliding window (Beltagy et al. 2020):  j allowed for i iff |i - j| <= w  (causal: 0 <= i - j <= w)
    Longformer:  window, plus global tokens: they attend everywhere and everyone attends to them
    BigBird (Zaheer et al. 2020, https://arxiv.org/abs/2007.14062), in blocks of b:
        query block i sees key blocks i-W..i+W (window), the first G blocks (global; their
        queries see everything), and R random other blocks drawn with a seed per block.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor


def _check_positive(name: str, value: object, *, zero_ok: bool = False) -> None:
    low = 0 if zero_ok else 1
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def sliding_window_table(t: int, block: int, window: int, causal: bool) -> Tensor:
    """(NQ, n) key blocks of a sliding window: query block i gathers blocks i - ceil(w / b) ..
    i (+ ceil(w / b) when bidirectional); blocks outside [0, NQ) are the sentinel NQ.

    Args:
        t: sequence length T.
        block: tile size b.
        window: w, the largest |i - j| allowed (keys within distance w on each allowed side).
        causal: keys on the left only.

    Returns:
        LongTensor (NQ, n).
    """
    for name, value in (("t", t), ("block", block)):
        _check_positive(name, value)
    _check_positive("window", window, zero_ok=True)
    nq = math.ceil(t / block)
    side = math.ceil(window / block)
    offsets = torch.arange(-side, 1 if causal else side + 1)
    table = torch.arange(nq)[:, None] + offsets[None, :]
    return table.masked_fill((table < 0) | (table >= nq), nq)


@functools.lru_cache(maxsize=64)
def _bigbird_table(nq: int, window_blocks: int, global_blocks: int, random_blocks: int, seed: int,
                   causal: bool) -> Tensor:
    rows = []
    for i in range(nq):
        lo, hi = max(0, i - window_blocks), (i if causal else min(nq - 1, i + window_blocks))
        chosen = list(range(lo, hi + 1))
        chosen += [g for g in range(min(global_blocks, nq)) if g not in chosen and (g <= i or not causal)]
        limit = i if causal else nq  # a causal query block draws from the past only
        candidates = [j for j in range(limit) if j not in chosen]
        if random_blocks and candidates:
            # one generator per query block: the draw of block i depends on (seed, i) and on nq
            # only when bidirectional, so a causal pattern is the same for every prefix
            gen = torch.Generator().manual_seed((seed * 1_000_003 + i) % (2**63))
            pick = torch.randperm(len(candidates), generator=gen)[:random_blocks].tolist()
            chosen += sorted(candidates[p] for p in pick)
        rows.append(chosen)
    width = max(len(r) for r in rows)
    table = torch.full((nq, width), nq, dtype=torch.long)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return table


def bigbird_table(t: int, block: int, window_blocks: int, global_blocks: int, random_blocks: int, seed: int,
                  causal: bool) -> Tensor:
    """(NQ, n) key blocks of BigBird's pattern, each listed once, sentinel NQ in unused slots.

    Args:
        t: sequence length T.
        block: block size b.
        window_blocks: W, neighbouring blocks on each allowed side.
        global_blocks: G, the first G blocks are global (their queries also see every key;
            that part is the kernels' business, not this table's).
        random_blocks: R random blocks per query block, among those not already chosen
            (causal: among earlier blocks only).
        seed: fixes the random blocks; layers use different seeds.
        causal: keys on the left only.

    Returns:
        LongTensor (NQ, n).

    Raises:
        ValueError: for a non-integer or negative argument.
    """
    _check_positive("t", t)
    _check_positive("block", block)
    for name, value in (("window_blocks", window_blocks), ("global_blocks", global_blocks),
                        ("random_blocks", random_blocks), ("seed", seed)):
        _check_positive(name, value, zero_ok=True)
    return _bigbird_table(math.ceil(t / block), window_blocks, global_blocks, random_blocks, seed, bool(causal))


def global_index(global_tokens: Tensor | None, t: int, batch: int, device: torch.device | None = None) -> Tensor:
    """Global positions as a padded (B, g) index; the sentinel t marks an empty slot.

    Args:
        global_tokens: None (no global token), a 1-D LongTensor of positions shared by the
            batch, or a (B, T) bool tensor (True = global).
        t: sequence length T; positions >= T are dropped.
        batch: B.

    Returns:
        LongTensor (B, g), g >= 0.

    Raises:
        ValueError: for a tensor of another shape or dtype.
    """
    if global_tokens is None:
        return torch.empty(batch, 0, dtype=torch.long, device=device)
    if global_tokens.dtype == torch.bool:
        if global_tokens.shape != (batch, t):
            raise ValueError(f"global token flags must be (B, T) = {(batch, t)}, got {tuple(global_tokens.shape)}")
        count = int(global_tokens.sum(-1).max()) if global_tokens.numel() else 0
        pos = torch.arange(t, device=global_tokens.device).expand(batch, t)
        key = torch.where(global_tokens, pos, t + pos)  # globals first, in order
        order = key.sort(-1).values[:, :count]
        return torch.where(order < t, order, t).to(device or global_tokens.device)
    if global_tokens.dim() != 1 or global_tokens.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"global positions must be a 1-D integer tensor or (B, T) bool flags, got "
                         f"{global_tokens.dtype} of shape {tuple(global_tokens.shape)}")
    pos = torch.unique(global_tokens.long())
    if pos.numel() and int(pos.min()) < 0:
        raise ValueError(f"global positions must be >= 0, got {pos.tolist()}")
    pos = pos[pos < t]
    return pos.to(device)[None].expand(batch, -1).contiguous()


def bigbird_random_part(table: Tensor, window_blocks: int, global_blocks: int, causal: bool) -> Tensor:
    """The random blocks of a `bigbird_table`: each row's blocks outside its window and the
    global blocks, first, sentinel NQ after.

    Args:
        table: (NQ, n) from `bigbird_table`.
        window_blocks, global_blocks, causal: the arguments that built it.

    Returns:
        LongTensor (NQ, R), R the most random blocks of any row (0 when there are none).
    """
    nq = table.shape[0]
    i = torch.arange(nq, device=table.device)[:, None]
    in_window = (table >= i - window_blocks) & (table <= (i if causal else i + window_blocks))
    random = (table != nq) & ~in_window & (table >= global_blocks)
    width = int(random.sum(1).max()) if nq else 0
    keyed = torch.where(random, table, torch.full_like(table, nq)).sort(1).values
    return keyed[:, :width].contiguous()
