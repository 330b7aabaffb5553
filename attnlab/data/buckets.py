"""Batches of sentence pairs of similar length, filled to a token budget.

A batch of pairs is padded to its longest source and its longest target, so pairs drawn at random
waste compute on padding: on `bible-en-es` half of a random batch of 32 is padding. Here pairs are
sorted once by length, and a batch is a run of neighbours in that order starting at a random
place, as many as fit `batch_tokens` padded tokens (source and target together):

    order = length_order(src_lengths, tgt_lengths)            # once per token files
    index = bucketed_batch(order, src_lengths, tgt_lengths, 4096, generator)

Short pairs make batches of many rows, long pairs batches of few; every batch costs about the
same. Neighbours of equal length are shuffled (seed 0) so a run is not a stretch of the file.
"""

from __future__ import annotations

import numpy as np
import torch


def length_order(src_lengths: np.ndarray, tgt_lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    """Pair indices sorted by source + target length (ties in a seeded random order)."""
    if len(src_lengths) != len(tgt_lengths) or not len(src_lengths):
        raise ValueError(f"expected as many source as target lengths, and some, got {len(src_lengths)} and "
                         f"{len(tgt_lengths)}")
    shuffled = np.random.default_rng(seed).permutation(len(src_lengths))
    return shuffled[np.argsort(src_lengths[shuffled] + tgt_lengths[shuffled], kind="stable")]


def bucketed_batch(order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_tokens: int,
                   generator: torch.Generator) -> np.ndarray:
    """Indices of one batch: the pairs from a uniformly random place in `order` upwards, then
    below that place, each run as long as rows x (longest source + longest target) stays within
    `batch_tokens`; at least one pair, even one longer than the budget.

    Args:
        order: `length_order` of the lengths.
        src_lengths, tgt_lengths: each pair's padded cost per side (tokens, with any EOS/BOS).
        batch_tokens: the budget of padded tokens per batch.
        generator: draws the starting place.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be a positive integer, got {batch_tokens}")
    n = len(order)
    start = int(torch.randint(0, n, (1,), generator=generator))
    picked: list[int] = []
    longest = [0, 0]  # source, target
    for run in (range(start, n), range(start - 1, -1, -1)):  # upwards from the start, then below it
        for position in run:
            i = int(order[position])
            src, tgt = max(longest[0], int(src_lengths[i])), max(longest[1], int(tgt_lengths[i]))
            if picked and (len(picked) + 1) * (src + tgt) > batch_tokens:
                break
            picked.append(i)
            longest = [src, tgt]
    return np.asarray(picked, dtype=np.int64)
