"""How causal-LM rows are cut from a token file (`data.pack`), as pure functions of the file.

Notation: B rows, T = data.seq_len, a window holds T + 1 tokens (inputs and labels overlap by
all but one). Documents end with EOS in the token stream (attnlab.data.tokenized).

    plain            windows at random starts in the stream: a row holds the end of one document,
                     EOS, the start of the next, ... and every token attends to all before it,
                     across documents (GPT-2; the objective's own batches, not made here)
    document_masked  the same windows, but a token attends within its own document only and
                     positions restart at 0 at each document's start (the row's first piece counts
                     from 0 too); the prediction that crosses a boundary (a document's EOS ->
                     the next document's first token) takes no loss
    pad              one document per row (a long one cut into pieces of T + 1 tokens that overlap
                     by one), padded at the end to the longest row of the batch

    a row of 9 inputs (E = EOS; the window's 10th token, h, is a label only; - = no loss)
    inputs     a b c E d e E f g
    document   0 0 0 0 1 1 1 2 2
    position   0 1 2 3 0 1 2 0 1        plain: 0 1 2 3 4 5 6 7 8
    label      b c E - e E - g h        plain: b c E d e E f g h

Why the boundary label is dropped: under document masking a document's EOS sees that document
only, so predicting the next document's first token from it is a prediction of one document
from another, the one dependence across documents the masking leaves (its gradient would
train the first document's tokens on the second's). Inside a document every prediction
stays, its EOS included (where to stop). The same tokens take a loss as under `pad`: each
document's tokens after its first.

The batch carries `document_ids` (B, T); the decoder makes the block-diagonal causal mask and the
restarting positions from them (attnlab.nn.masks.document_mask, positions_from_documents), so
the fused sdpa kernel runs with a (B, 1, T, T) bool mask.

    batch = train_batch("document_masked", files, 32, 256, generator, pad_id=0)
    batch["input_ids"], batch["labels"], batch["document_ids"]       # (B, T) each
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from attnlab.data.objectives import IGNORE
from attnlab.data.tokenized import TokenFile

PACKINGS = ("plain", "document_masked", "pad")  # the values of data.pack


def document_masked_batch(windows: Tensor, documents: Tensor) -> dict[str, Tensor]:
    """A causal-LM batch whose documents stay apart.

    Args:
        windows: (B, T + 1) consecutive token ids.
        documents: (B, T + 1) the document of each token (any ids, equal within a document).

    Returns:
        `input_ids` (B, T), `labels` (B, T) with IGNORE where the next token starts another
        document, `document_ids` (B, T) numbering each row's documents from 0.

    Example:
        >>> b = document_masked_batch(torch.tensor([[5, 6, 2, 7, 8]]), torch.tensor([[0, 0, 0, 1, 1]]))
        >>> b["labels"].tolist(), b["document_ids"].tolist()
        ([[6, 2, -100, 8]], [[0, 0, 0, 1]])
    """
    if windows.shape != documents.shape or windows.dim() != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows and documents must both be (B, T + 1) with T >= 1, got {tuple(windows.shape)} "
                         f"and {tuple(documents.shape)}")
    labels = windows[:, 1:].clone()
    labels[documents[:, 1:] != documents[:, :-1]] = IGNORE
    return {"input_ids": windows[:, :-1].contiguous(), "labels": labels,
            "document_ids": (documents[:, :-1] - documents[:, :1]).contiguous()}


def padded_batch(rows: Sequence[np.ndarray | Tensor], pad_id: int) -> dict[str, Tensor]:
    """A causal-LM batch of one document (piece) per row, padded at the end.

    Args:
        rows: token ids of each row, each at least 2 long.
        pad_id: fills the inputs after a row's end (masked out, no loss).

    Returns:
        `input_ids`, `labels` (IGNORE on padding) and `attention_mask` (1 on real tokens), each
        (B, L) with L = the longest row - 1.

    Example:
        >>> b = padded_batch([np.array([5, 6, 7]), np.array([8, 9])], pad_id=0)
        >>> b["input_ids"].tolist(), b["labels"].tolist()
        ([[5, 6], [8, 0]], [[6, 7], [9, -100]])
    """
    if not rows or min(len(r) for r in rows) < 2:
        raise ValueError("padded_batch needs at least one row, each of 2 or more tokens")
    L = max(len(r) for r in rows) - 1
    input_ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), L), IGNORE, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), L, dtype=torch.long)
    for i, row in enumerate(rows):
        row = torch.as_tensor(np.asarray(row, dtype=np.int64))
        n = len(row) - 1
        input_ids[i, :n], labels[i, :n], attention_mask[i, :n] = row[:-1], row[1:], 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def _chunks(files: TokenFile, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    starts, lengths = files.chunks(seq_len + 1)
    if not len(starts):
        raise ValueError(f"{files.prefix.name}: no document of 2 or more tokens to fill a row")
    return starts, lengths


def train_batch(pack: str, files: TokenFile, batch_size: int, seq_len: int, generator: torch.Generator, *,
                pad_id: int) -> dict[str, Tensor]:
    """One training batch of `batch_size` rows packed as `pack` (`document_masked` or `pad`):
    windows at uniform random starts (the draws of plain packing), or document pieces drawn
    uniformly (so every token is as likely to be trained on).

    Raises:
        ValueError: an unknown `pack`, or a file too short for one row.
    """
    if pack == "document_masked":
        starts = files.random_starts(batch_size, seq_len + 1, generator)
        return document_masked_batch(files.windows(starts, seq_len + 1), files.document_index(starts, seq_len + 1))
    if pack == "pad":
        starts, lengths = _chunks(files, seq_len)
        index = torch.randint(0, len(starts), (batch_size,), generator=generator).numpy()
        return padded_batch([files.window(int(starts[i]), int(lengths[i])) for i in index], pad_id)
    raise ValueError(f"pack must be 'document_masked' or 'pad' here (plain rows are the objective's), got {pack!r}")


def eval_batches(pack: str, files: TokenFile, batch_size: int, seq_len: int, num_batches: int, *,
                 pad_id: int) -> Iterator[dict[str, Tensor]]:
    """Up to `num_batches` validation batches, the same every time: the file walked in order, by
    consecutive windows (`document_masked`, as plain packing's validation) or document pieces (`pad`)."""
    limit = num_batches * batch_size
    if pack == "document_masked":
        starts = files.sequential_starts(seq_len + 1, limit=limit)
        for i in range(0, len(starts), batch_size):
            part = starts[i: i + batch_size]
            yield document_masked_batch(files.windows(part, seq_len + 1), files.document_index(part, seq_len + 1))
        return
    if pack == "pad":
        starts, lengths = _chunks(files, seq_len)
        for i in range(0, min(len(starts), limit), batch_size):
            end = min(i + batch_size, limit, len(starts))
            yield padded_batch([files.window(int(s), int(n)) for s, n in zip(starts[i:end], lengths[i:end])], pad_id)
        return
    raise ValueError(f"pack must be 'document_masked' or 'pad' here (plain rows are the objective's), got {pack!r}")


__all__ = ["PACKINGS", "document_masked_batch", "eval_batches", "padded_batch", "train_batch"]
