"""BigBird attention (Zaheer et al. 2020, https://arxiv.org/abs/2007.14062).

In blocks of b: query block i sees key blocks i-W..i+W (window; causal: i-W..i), the first G
blocks (global: their queries also see every key) and R random other blocks drawn with a seed
per block (a layer l uses seed + l). Notation: B batch, H heads, T length, Dh head_dim, NQ =
ceil(T / b) blocks. Time O(T b (2W + 1 + G + R)).

With no bias and at most a key mask this runs the band kernel (`attnlab.nn.kernels.band`): the
window blocks as a band, the global blocks as global keys (and, bidirectional, global queries),
the random blocks gathered per block; otherwise the general block kernel plus a dense pass for
the global rows.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from attnlab.nn.kernels.band import band_attention
from attnlab.nn.kernels.base import Kernel, KernelSetup
from attnlab.nn.kernels.block_sparse import BlockPlan, block_sparse_attention
from attnlab.nn.kernels.sparse import SPARSE, check_int, check_qkv, default_scale, global_rows, key_valid
from attnlab.nn.masks import causal_mask


@dataclass
class BigBirdOptions:
    """`attention.kernel_options` of kernel `bigbird`."""

    block_size: int = field(default=64, metadata={"min": 1})
    window_blocks: int = field(default=1, metadata={"min": 0})  # neighbouring blocks on each allowed side
    global_blocks: int = field(default=1, metadata={"min": 0})  # the first blocks, global both ways
    random_blocks: int = field(default=3, metadata={"min": 0})  # random blocks per query block
    random_seed: int = field(default=0, metadata={"min": 0})  # layer l draws with random_seed + l

    legacy: ClassVar[dict[str, str]] = {name: name for name in ("block_size", "window_blocks", "global_blocks",
                                                                "random_blocks", "random_seed")}


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
    check_int("t", t)
    check_int("block", block)
    for name, value in (("window_blocks", window_blocks), ("global_blocks", global_blocks),
                        ("random_blocks", random_blocks), ("seed", seed)):
        check_int(name, value, low=0)
    return _bigbird_table(math.ceil(t / block), window_blocks, global_blocks, random_blocks, seed, bool(causal))


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


def bigbird_mask(t: int, block: int, window_blocks: int = 1, global_blocks: int = 1, random_blocks: int = 3,
                 seed: int = 0, *, causal: bool = False, device: torch.device | None = None) -> Tensor:
    """The (T, T) bool pattern (True = may attend): window, global (the first `global_blocks`
    blocks, both ways) and random blocks, the same ones the kernel uses.

    Args:
        t: length T; block: b; window_blocks: W per side; global_blocks: G;
        random_blocks: R per query block; seed: fixes the random blocks.
    """
    table = bigbird_table(t, block, window_blocks, global_blocks, random_blocks, seed, causal)
    nq = table.shape[0]
    blocks = torch.zeros(nq, nq + 1, dtype=torch.bool)
    blocks.scatter_(1, table, True)
    blocks = blocks[:, :nq]
    blocks[: min(global_blocks, nq)] = True  # global queries see everything
    mask = blocks.repeat_interleave(block, 0).repeat_interleave(block, 1)[:t, :t].to(device)
    return mask & causal_mask(t, device=device) if causal else mask


def bigbird_attention(q: Tensor, k: Tensor, v: Tensor, *, block: int, window_blocks: int = 1,
                      global_blocks: int = 1, random_blocks: int = 3, seed: int = 0, causal: bool = False,
                      scale: float | None = None, mask: Tensor | None = None, bias: Tensor | None = None,
                      dropout_p: float = 0.0) -> Tensor:
    """BigBird: window, global and random blocks (see `bigbird_table`).

    Args:
        q, k, v: (B, H, T, Dh); causal: keys j <= i only; scale: default 1 / sqrt(Dh).
        block: b; window_blocks: W per side; global_blocks: G (the first G blocks);
        random_blocks: R per query block; seed: fixes the random blocks.
        mask: bool, True = may attend, broadcastable to (B, H, T, T); bias: float, likewise.
        dropout_p: dropout on the weights.

    Returns:
        (B, H, T, Dh).
    """
    check_qkv(q, k, v)
    B, H, T, _ = q.shape
    table = bigbird_table(T, block, window_blocks, global_blocks, random_blocks, seed, causal)
    n_rows = min(global_blocks * block, T)
    rows = torch.arange(n_rows, device=q.device)[None].expand(B, n_rows)
    valid = key_valid(q, mask, bias)
    s = default_scale(q, scale)
    if valid is not False:
        # window blocks as a band, the global blocks as global keys, the random blocks gathered
        # per tile; a causal global query sees only keys of global blocks, already its own
        return band_attention(q, k, v, window=None, window_blocks=window_blocks, causal=causal, tile=block,
                              scale=s, key_valid=valid, global_keys=rows, global_queries=None if causal else rows,
                              random_blocks=bigbird_random_part(table, window_blocks, global_blocks, causal),
                              dropout_p=dropout_p)
    out = block_sparse_attention(q, k, v, BlockPlan(block, table, None, causal), scale=s, mask=mask, bias=bias,
                                 dropout_p=dropout_p)
    return global_rows(q, k, v, out, rows, scale=s, causal=causal, mask=mask, bias=bias, dropout_p=dropout_p)


class BigBirdKernel(Kernel):
    """`attention.kernel='bigbird'`: see `bigbird_attention`; `seed` differs per layer."""

    name = "bigbird"
    supports = SPARSE
    Options = BigBirdOptions

    def __init__(self, block: int, window_blocks: int, global_blocks: int, random_blocks: int, seed: int):
        super().__init__()
        self.block, self.window_blocks, self.global_blocks = block, window_blocks, global_blocks
        self.random_blocks, self.seed = random_blocks, seed

    @classmethod
    def build(cls, options: BigBirdOptions, setup: KernelSetup) -> "BigBirdKernel":
        return cls(options.block_size, options.window_blocks, options.global_blocks, options.random_blocks,
                   options.random_seed + setup.layer)

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor:
        """The pattern as a bool (T, T) mask (True = may attend)."""
        return bigbird_mask(t, self.block, self.window_blocks, self.global_blocks, self.random_blocks, self.seed,
                            causal=causal, device=device)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        out = bigbird_attention(q, k, v, block=self.block, window_blocks=self.window_blocks,
                                global_blocks=self.global_blocks, random_blocks=self.random_blocks, seed=self.seed,
                                causal=causal, scale=scale, mask=mask, bias=bias, dropout_p=dropout_p)
        return out, None
