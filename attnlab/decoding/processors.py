"""Logit processors and warpers: the per-step edits to the next-token distribution.

Notation: N rows (batch x beams or x samples), V vocabulary, L tokens so far.
Every function takes scores (N, V) and returns a new (N, V) tensor; the input is not modified.

Order in a decoding step (the conventional one):

    processors (the model's distribution, used by greedy, sampling and beam search)
        repetition_penalty -> no_repeat_ngram -> min_new_tokens (forbid EOS)
    warpers (sampling only)
        temperature -> top_k -> top_p -> softmax -> sample

    >>> top_p_filter(torch.tensor([[2.0, 1.0, 0.0]]).log_softmax(-1), 0.5).isinf().tolist()
    [[False, True, True]]
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def repetition_penalty(scores: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """Penalise every token id in `seen` (N, L) (Keskar et al. 2019, CTRL, section 4.1,
    https://arxiv.org/abs/1909.05858): a positive score is divided by `penalty`, a negative one
    multiplied by it, so with `penalty > 1` a repeated token always becomes less likely.

    Args:
        scores: (N, V) logits (or log-probabilities).
        seen: (N, L) ids of the tokens to penalise (repeats are fine).
        penalty: > 0; 1 leaves the scores unchanged.

    Returns:
        (N, V) penalised scores.
    """
    if penalty == 1.0:
        return scores
    picked = scores.gather(1, seen)  # (N, L)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return scores.scatter(1, seen, picked)


def no_repeat_ngram(scores: Tensor, ids: Tensor, n: int, valid: Tensor | None = None) -> Tensor:
    """Forbid every token that would complete an n-gram already present in its row
    (Paulus et al. 2017, https://arxiv.org/abs/1705.04304, section 2.5).

    Args:
        scores: (N, V).
        ids: (N, L) tokens so far.
        n: n-gram size; 0 disables.
        valid: optional (N, L) bool, False on padding (n-grams touching it are ignored).

    Returns:
        (N, V) with the banned tokens at -inf.
    """
    N, L = ids.shape
    if n <= 0 or L < n:
        return scores
    grams = ids.unfold(1, n, 1)  # (N, L - n + 1, n)
    match = (grams[:, :, :-1] == ids[:, None, L - n + 1:]).all(-1)  # (N, L - n + 1): prefix == last n-1 tokens
    if valid is not None:
        match &= valid.unfold(1, n, 1).all(-1) & valid[:, L - n + 1:].all(-1, keepdim=True)
    V = scores.shape[1]
    banned_ids = torch.where(match, grams[:, :, -1], V)  # V is a dummy column, dropped below
    banned = torch.zeros(N, V + 1, dtype=torch.bool, device=scores.device).scatter_(1, banned_ids, True)
    return scores.masked_fill(banned[:, :V], NEG_INF)


def forbid_tokens(scores: Tensor, token_ids: Tensor) -> Tensor:
    """Set the scores of `token_ids` (K,) to -inf in every row (EOS before min_new_tokens)."""
    out = scores.clone()
    out[:, token_ids] = NEG_INF
    return out


def top_k_filter(scores: Tensor, k: int) -> Tensor:
    """Keep the k highest scores of each row (ties with the k-th are kept), -inf elsewhere
    (Fan et al. 2018, https://arxiv.org/abs/1805.04833)."""
    if k >= scores.shape[-1]:
        return scores
    kth = scores.topk(k, dim=-1).values[:, -1:]  # (N, 1)
    return scores.masked_fill(scores < kth, NEG_INF)


def top_p_filter(scores: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020, https://arxiv.org/abs/1904.09751): keep the
    smallest set of most likely tokens whose probability mass reaches p, -inf elsewhere.

    A token is kept when the mass of the tokens strictly more likely than it (in sorted
    order) is below p, so the most likely token is always kept.

    Args:
        scores: (N, V) logits (after temperature).
        p: in (0, 1]; 1 keeps everything.

    Returns:
        (N, V) filtered scores.
    """
    if p >= 1.0:
        return scores
    sorted_scores, order = scores.sort(dim=-1, descending=True)
    probs = sorted_scores.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # (N, V): mass of the tokens ranked above
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return scores.masked_fill(drop, NEG_INF)


def sample(scores: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row (N,) drawn from softmax(scores)."""
    probs = scores.float().softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
