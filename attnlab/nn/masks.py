"""Attention masks. One convention everywhere: bool, True = may attend.

Masks broadcast to (B, H, Tq, Tk) and are built outside a layer, then passed in.
A user's padding mask is (B, T) with 1/True on real tokens.

    >>> causal_mask(3).int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(t_q: int, t_k: int | None = None, *, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) lower-triangular mask; with Tk > Tq the queries are the last Tq positions
    (as when a cache holds Tk - Tq earlier keys)."""
    t_k = t_q if t_k is None else t_k
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def padding_mask(attention_mask: Tensor) -> Tensor:
    """(B, T) user mask (1 = real token) -> (B, 1, 1, T) key mask."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (B, T), got {tuple(attention_mask.shape)}")
    return attention_mask.bool()[:, None, None, :]


def prefix_lm_mask(t: int, prefix_lengths: Tensor) -> Tensor:
    """(B, 1, T, T): bidirectional among the first prefix_lengths[b] positions, causal after
    (Raffel et al. 2020, "prefix LM")."""
    pos = torch.arange(t, device=prefix_lengths.device)
    in_prefix = pos[None, :] < prefix_lengths[:, None]  # (B, T) key lies in the prefix
    mask = causal_mask(t, device=prefix_lengths.device)[None] | in_prefix[:, None, :]
    return mask[:, None]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks given (None means no constraint)."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """(B, T) position ids counting real tokens only, so left padding shifts nothing:
    [0, 0, 1, 1, 1] mask -> [0, 0, 0, 1, 2]."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def window_mask(t: int, window: int, *, causal: bool = False, device: torch.device | None = None) -> Tensor:
    """(T, T) local attention: key j is allowed for query i iff |i - j| <= window (causal:
    0 <= i - j <= window); positions are tensor indices.

    >>> window_mask(4, 1).int().tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ValueError(f"window must be an integer >= 0, got {window!r}")
    pos = torch.arange(t, device=device)
    d = pos[:, None] - pos[None, :]  # query minus key
    return (d <= window) & (d >= (0 if causal else -window))


def document_mask(document_ids: Tensor, *, causal: bool = True) -> Tensor:
    """(B, T) document ids of packed rows -> (B, 1, T, T): a query may attend to the keys of its
    own document only (and, causal, to none after it), so no token sees across a boundary.
    A document is a run of equal ids; give neighbouring documents different ids.

    >>> document_mask(torch.tensor([[0, 0, 1]])).int()[0, 0].tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    if document_ids.dim() != 2:
        raise ValueError(f"document_ids must have shape (B, T), got {tuple(document_ids.shape)}")
    same = document_ids[:, :, None] == document_ids[:, None, :]  # (B, Tq, Tk)
    if causal:
        same = same & causal_mask(document_ids.shape[1], device=document_ids.device)
    return same[:, None]


def positions_from_documents(document_ids: Tensor) -> Tensor:
    """(B, T) position ids that restart at 0 where a new document starts (where the id changes),
    so a document packed at any offset sees the positions it would see alone at a row's start:
    [7, 7, 7, 8, 8, 9] -> [0, 1, 2, 0, 1, 0]."""
    if document_ids.dim() != 2:
        raise ValueError(f"document_ids must have shape (B, T), got {tuple(document_ids.shape)}")
    B, T = document_ids.shape
    index = torch.arange(T, device=document_ids.device).expand(B, T)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(starts, index, 0).cummax(-1).values  # (B, T) index of each token's document start
    return index - first
