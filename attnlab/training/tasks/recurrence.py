"""Training and evaluation over consecutive segments: Transformer-XL's recurrence (Dai et al.
2019, https://arxiv.org/abs/1901.02860), the lectures' answer to context fragmentation.

A model trained on independent windows of T tokens sees, at the first tokens of a window,
almost no context; evaluated the same way, every T tokens it starts from nothing again. With a
segment memory (`ModelConfig.memory_len`, `attnlab.nn.kv_cache.SegmentMemory`) each segment also
attends over the previous segments' layer inputs, so the data has to come in order: the token
stream is cut into B parallel streams and step s reads columns [s T, (s + 1) T) of all of them.

    streams = batchify(tokens, batch_size)              # (B, L): row b is the b-th 1/B of the text
    for inputs, targets in segments(streams, seq_len):  # row b of step s + 1 continues row b of step s
        ...
    stream_loss(model, streams, seq_len, mem_len=64)    # per-token loss, read with a memory of 64
    stream_loss(model, streams, seq_len, mem_len=0)     # ... or every segment on its own

    task = RecurrenceTask(train_tokens, valid_tokens, batch_size=16, seq_len=64, mem_len=64)
    Trainer(config, task=task, model=model).fit()      # the one loop; the task carries the memory

The memory lives in the task: the Trainer draws a step's micro-batches in order and computes
their losses in order, so each loss reads the memory the previous one left.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.evaluation import perplexity
from attnlab.models.recurrence import resolve_mem_len
from attnlab.nn.kv_cache import SegmentMemory
from attnlab.nn.losses import linear_cross_entropy
from attnlab.training.tasks.batch_loss import autocast
from attnlab.training.tasks.protocol import StepLoss, Task


def batchify(tokens: Tensor | Any, batch_size: int) -> Tensor:
    """A token stream (N,) cut into `batch_size` parallel streams (B, N // B), row b holding
    tokens [b L, (b + 1) L); the last N mod B tokens are dropped (Transformer-XL's batching).

    Example:
        >>> batchify(torch.arange(7), 2).tolist()
        [[0, 1, 2], [3, 4, 5]]

    Raises:
        ValueError: batch_size < 1, or fewer than 2 tokens per stream (no input/target pair).
    """
    if not isinstance(tokens, Tensor):  # a NumPy array or a token file's read-only memmap: one copy
        tokens = torch.from_numpy(np.array(tokens, dtype=np.int64))
    tokens = tokens.long().reshape(-1)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    length = tokens.numel() // batch_size
    if length < 2:
        raise ValueError(f"{tokens.numel()} tokens make streams of {length} tokens at batch_size={batch_size}; "
                         "each stream needs at least 2 (an input and its target)")
    return tokens[: batch_size * length].view(batch_size, length)


def segments(streams: Tensor, seq_len: int, *, drop_last: bool = False) -> Iterator[tuple[Tensor, Tensor]]:
    """Consecutive (inputs, targets) pieces (B, T) of `streams` (B, L): step s reads columns
    [s T, s T + T) and predicts the column after each, so row b of step s + 1 continues row b
    of step s. The last piece is shorter when T does not divide L - 1 (`drop_last` skips it).

    Example:
        >>> [x.tolist() for x, _ in segments(torch.arange(7)[None], 3)]
        [[[0, 1, 2]], [[3, 4, 5]]]
    """
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    length = streams.shape[1]
    for start in range(0, length - 1, seq_len):
        n = min(seq_len, length - 1 - start)
        if n < seq_len and drop_last:
            return
        yield streams[:, start:start + n], streams[:, start + 1:start + 1 + n]


@torch.no_grad()
def stream_loss(model: nn.Module, streams: Tensor, seq_len: int, mem_len: int = 0, *,
                max_segments: int | None = None, device: torch.device | None = None,
                precision: str = "fp32") -> dict[str, Any]:
    """Per-token cross-entropy of `streams` (B, L) read segment by segment: with a segment
    memory of `mem_len` positions carried from each segment to the next, or (mem_len 0) each
    segment on its own, every T tokens starting from no context (context fragmentation). Both
    score the same tokens with the same segment length, so only the memory differs.

    Returns:
        {"loss": mean over tokens, "ppl", "tokens", "by_position": mean loss at each offset
        0..T-1 within a segment (where fragmentation shows: without memory the first offsets
        have little context)}.
    """
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    total, count = 0.0, 0
    at_offset = torch.zeros(seq_len, dtype=torch.float64)
    at_count = torch.zeros(seq_len, dtype=torch.float64)
    mems = None
    try:
        for i, (inputs, targets) in enumerate(segments(streams, seq_len)):
            if max_segments is not None and i >= max_segments:
                break
            inputs, targets = inputs.to(device), targets.to(device)
            with autocast(precision, device):
                if mem_len:
                    logits, mems = model.segment(inputs, mems, mem_len=mem_len)
                else:
                    logits = model(inputs)
            losses = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")  # (B, T)
            total += float(losses.sum())
            count += losses.numel()
            n = losses.shape[1]
            at_offset[:n] += losses.sum(0).double().cpu()
            at_count[:n] += losses.shape[0]
    finally:
        model.train(was_training)
    loss = total / max(count, 1)
    return {"loss": loss, "ppl": perplexity(loss), "tokens": count,
            "by_position": (at_offset / at_count.clamp(min=1)).tolist()}


class RecurrenceTask(Task):
    """Causal language modelling over consecutive segments with a segment memory, as a task of
    the one Trainer (`attnlab.training.tasks.protocol`).

    Each `train_batch` is the next segment of the B training streams; each `loss` reads the
    memory the previous loss left and leaves its own (detached: gradients stay within a segment).
    At the end of the streams the next epoch starts over from their beginning with an empty
    memory (the batch says so: `reset`). `evaluate` reads the validation streams with the memory
    and without, at the same segment length.

    Args:
        train, valid: token streams (N,) (e.g. a TokenFile's `tokens`).
        batch_size: B parallel streams.
        seq_len: T, tokens per segment.
        mem_len: M, positions kept per layer (default the model's `memory_len`, read at the first
            loss); 0 trains every segment on its own (the baseline without memory, same batches).
        eval_batch_size: parallel validation streams (default batch_size).
        eval_segments: validation segments per evaluation (None: the whole validation stream).
        pipeline: the prepared data the streams come from (its tokenizer is saved with the run).

    Resuming restores the data position (`state_dict`), not the memory: the first step after a
    resume reads none.
    """

    ordered = True  # batches in stream order: not shardable across data-parallel ranks

    def __init__(self, train: Tensor | Any, valid: Tensor | Any, *, batch_size: int, seq_len: int,
                 mem_len: int | None = None, eval_batch_size: int | None = None, eval_segments: int | None = None,
                 pipeline: Any = None):
        self.pipeline = pipeline
        self.streams = batchify(train, batch_size)
        self.valid = batchify(valid, eval_batch_size or batch_size)
        if self.streams.shape[1] <= seq_len:
            raise ValueError(f"training streams of {self.streams.shape[1]} tokens hold no whole segment of "
                             f"seq_len={seq_len} (and its targets); use a smaller batch_size or seq_len")
        self.seq_len, self.mem_len, self.eval_segments = seq_len, mem_len, eval_segments
        self.position, self.epoch = 0, 0
        self.mems: list[Tensor] | None = None

    def train_batch(self, generator: torch.Generator) -> dict[str, Tensor]:
        """The next segment (in order; `generator` is not used: the order is the point)."""
        T = self.seq_len
        if self.position + T + 1 > self.streams.shape[1]:  # a whole segment no longer fits: a new epoch
            self.position, self.epoch = 0, self.epoch + 1
        start = self.position
        self.position += T
        return {"input_ids": self.streams[:, start:start + T], "labels": self.streams[:, start + 1:start + T + 1],
                "reset": torch.tensor(start == 0)}

    def weight(self, batch: dict[str, Tensor]) -> int:
        return batch["labels"].numel()

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> StepLoss:
        """Mean token loss of the segment over the carried memory (the fused output layer and
        loss of `training.tasks.batch_loss`); the new memory is kept for the next segment."""
        mem_len = self._mem_len(model)
        memory = SegmentMemory(mem_len, None if bool(batch["reset"]) else self.mems) if mem_len else None
        hidden = model.features(batch["input_ids"], mems=memory)
        head = model.head
        loss = linear_cross_entropy(head.transform(hidden), head.output_weight, batch["labels"], head.output_bias,
                                    label_smoothing=label_smoothing)
        # a non-finite step (skipped under train.nan_policy=skip) must not hand its memory on
        self.mems = memory.states if memory is not None and bool(torch.isfinite(loss)) else None
        return StepLoss(loss, {})

    def _mem_len(self, model: nn.Module) -> int:
        """M: as given (0: no memory), else the model's memory_len (which must then be > 0)."""
        if self.mem_len is None:
            self.mem_len = resolve_mem_len(model, None)
        return self.mem_len

    def evaluate(self, model: nn.Module, device: torch.device, precision: str) -> dict[str, float]:
        """Validation loss read as trained (`val_loss`, `val_ppl`: with the memory, if any) and
        segment by segment without it (`val_loss_no_memory`), at the training segment length."""
        mem_len = self._mem_len(model)
        kwargs = {"max_segments": self.eval_segments, "device": device, "precision": precision}
        without = stream_loss(model, self.valid, self.seq_len, 0, **kwargs)
        read = stream_loss(model, self.valid, self.seq_len, mem_len, **kwargs) if mem_len else without
        return {"val_loss": read["loss"], "val_ppl": read["ppl"], "val_loss_no_memory": without["loss"]}

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position, self.epoch = int(state.get("position", 0)), int(state.get("epoch", 0))
        self.mems = None
