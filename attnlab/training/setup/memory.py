"""Peak memory of a training run, estimated before its first batch, against the memory there is.

    estimate = estimate_training_memory(model, rows=32, seq_len=256)  # MemoryEstimate, in bytes
    free = available_memory(torch.device("cpu"))                      # Available(bytes, source): free_memory
    check_training_memory(model, config, device)                      # ConfigError where it cannot fit

Why: a batch too large for the machine used to be found by the kernel's OOM killer, after
minutes of swapping and no message (data.batch_size 100000000 grew to 18.6 GB drawing the data
pipeline's first batch). The Trainer now calls `check_training_memory` once the model is built
and before the pipeline draws a batch, and refuses such a run in one line that names the
estimate, the memory available and the largest data.batch_size that fits (train.check_memory
false skips it).

This is the one cost model of training memory: `attnlab parallel plan` (attnlab.parallel.plan)
reads its functions per pipeline stage and tensor-parallel rank; the Trainer reads them for the
whole model on one process, and each pipeline rank for its own stage (`check_stage_memory`,
before the stage's weights are made). What one process holds at the peak of a step:

    weights       4 p        p: the model's parameters, fp32 (autocast keeps them so)
    gradients     4 t        t: the parameters that train (LoRA: its adapters; frozen ones none)
    Adam          8 t        its two fp32 moments
    activations   b a s k    one micro-batch of b rows (the micro-batches run one after the other):
                             a = the elements one row's forward produces, as attnlab.inspect.cost
                             counts them (q, k, v, the attention weights a kernel keeps, the
                             feed-forward hidden, the layer outputs, embeddings, logits:
                             `stage_activations`); s = 4 bytes (2 under bf16 / fp16 autocast);
                             k = AUTOGRAD_FACTOR = 6. Measured on CPU (peak RSS growth of a step):
                             autograd keeps about 2 bytes per counted byte (norm inputs and
                             outputs, dropout masks, the activation function's input, softmax
                             statistics), backward's gradients bring it to about 3, and the
                             allocator to about 4.5 from the second micro-batch of a step on (the
                             blocks one micro-batch frees are not all reused by the next); 6
                             leaves a margin (tests/training/setup/test_memory.py)
    batches       b m c 8    the token ids of the step's m = train.grad_accum micro-batches (drawn
                             before the first one runs), c = BATCH_TENSORS (B, T) tensors of int64
                             per position (ids, labels, masks) and what drawing them costs

A row is data.seq_len tokens (each objective's row lengths: `Objective.row_lengths`); with
data.batch_tokens, a batch of sentence pairs holds at most that many padded tokens, counted as
rows of the longest pair. The estimate is meant to be on the high side, within about 2x of the
measured peak. Not counted: the kernels' workspace, evaluation (no gradients: less than a step),
a segment memory (model.memory_len), and the activations of a model the cost model does not
cover (a recurrent encoder-decoder, a vision encoder) or of a task with batches of its own (a
fine-tuning head's): there weights, gradients and Adam alone are checked.
train.activation_checkpointing is not credited: on CPU it saved a third of the peak of an
8-layer model, far less than its theory, so the estimate stays that of a run without it.

Available memory (attnlab.training.setup.free_memory): on a CPU the least of the cgroup's room (v2
or v1), MemAvailable and the room under `ulimit -v`; on a GPU its free memory. Weights already
on the device count as available (they are part of the estimate). Under torchrun on a CPU, the
LOCAL_WORLD_SIZE processes of the machine share it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.config.validate import ConfigError
from attnlab.models.families import family
from attnlab.training.setup.free_memory import Available, available_memory

PARAM_BYTES = 4  # fp32 weights and gradients
ADAM_BYTES = 8  # two fp32 moments per parameter
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # per activation value, by resolved precision (autocast)
AUTOGRAD_FACTOR = 6  # bytes held per byte of the outputs the cost model counts (module docstring; measured in tests)
BATCH_TENSORS = 6  # int64 (B, T) tensors per micro-batch and what drawing them costs (module docstring)
LayerKey = tuple[str, int]  # (stack prefix "", "encoder." or "decoder.", layer index)
_LAYER_ROW = re.compile(r"^(encoder\.|decoder\.)?layers\.(\d+)\.(.*)$")  # a cost_table row of one layer


# ---------------------------------------------------------------- the cost model
def layer_keys(config: ModelConfig) -> list[LayerKey]:
    """Every layer as (stack, index), an encoder-decoder's encoder first: the one stack that the
    pipeline's stages cut in order."""
    return [(stack, i) for stack, layers in family(config).stacks(config) for i in range(layers)]


def layer_activations(config: ModelConfig, seq_len: int, tgt_len: int, tp: int = 1) -> dict[LayerKey, int]:
    """Activation elements per layer for one row, on one of `tp` tensor-parallel ranks: each
    layer's rows of `attnlab.inspect.cost.cost_table`, the per-head and hidden parts split tp
    ways, the (T, d_model) outputs of the projections and the feed-forward not.

    Args:
        config: a Transformer (arch decoder, encoder or encoder_decoder).
        seq_len: S, the source (or only) length.
        tgt_len: Tt, an encoder-decoder's target length (seq_len otherwise).
        tp: tensor-parallel ranks.

    Returns:
        {(stack, index): elements}.
    """
    from attnlab.inspect.cost import cost_table

    encdec = family(config).traits.has_source
    rows = cost_table(config, tgt_len if encdec else seq_len, src_len=seq_len if encdec else None)
    D = config.d_model
    out: dict[LayerKey, int] = {}
    for row in rows:
        match = _LAYER_ROW.match(row.name)
        if match is None:
            continue
        stack, index, part = match.group(1) or "", int(match.group(2)), match.group(3)
        queries = tgt_len if stack == "decoder." else seq_len
        whole = queries * D if part.endswith("projections") or part == "ffn" else 0  # the (T, d) output
        out[(stack, index)] = out.get((stack, index), 0) + whole + (row.activations - whole) // tp
    return out


def stage_activations(config: ModelConfig, layers: list[LayerKey], per_layer: dict[LayerKey, int], seq_len: int,
                      tgt_len: int, *, tp: int = 1, last: bool = True) -> int:
    """Activation elements one row holds in a part of the model: its `layers` (`per_layer`, from
    `layer_activations`), the embeddings where a stack starts (S d; an encoder-decoder's decoder:
    Tt d), and on the `last` part the head's output (LM: Tt V / tp logits; MLM: its transform's
    S d and S V / tp logits). The whole model on one process: `layer_keys(config)`, last=True."""
    D, S, Tt = config.d_model, seq_len, tgt_len
    act = sum(per_layer[key] for key in layers)
    act += S * D * (("", 0) in layers or ("encoder.", 0) in layers)
    act += Tt * D * (("decoder.", 0) in layers)
    vocab = -(-config.vocab_size // tp)  # a rank's slice (padded when tp does not divide V)
    if last and config.head == "lm":
        act += Tt * vocab
    elif last and config.head == "mlm":
        act += S * D + S * vocab
    return act


# ---------------------------------------------------------------- the estimate
@dataclass(frozen=True)
class MemoryEstimate:
    """What a training step holds at its peak, in bytes (module docstring): weights, gradients
    and Adam whatever the batch, and `per_row` for each of the `rows` rows of a micro-batch
    (activations and the step's token ids; 0 for a model the cost model does not cover)."""

    weights: int
    gradients: int
    optimizer: int
    per_row: int
    rows: int

    @property
    def fixed(self) -> int:
        """Bytes whatever the batch: weights, gradients, Adam."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.fixed + self.rows * self.per_row

    def largest_rows(self, room: int) -> int:
        """The most rows per micro-batch whose estimate fits in `room` bytes (0: not even one)."""
        if room < self.fixed:
            return 0
        return (room - self.fixed) // self.per_row if self.per_row else self.rows

    def describe(self) -> str:
        """`weights 12 MiB, gradients 12 MiB, Adam 24 MiB, activations and batches 3.2 GiB`."""
        parts = [f"weights {size(self.weights)}", f"gradients {size(self.gradients)}", f"Adam {size(self.optimizer)}"]
        if self.per_row:
            parts.append(f"activations and batches {size(self.rows * self.per_row)}")
        return ", ".join(parts)


def row_bytes(config: ModelConfig, seq_len: int, tgt_len: int | None = None, *, grad_accum: int = 1,
              precision: str = "fp32") -> int:
    """Bytes one row of a micro-batch adds at the peak of a step: its activations (`stage_activations`
    of the whole model, ACTIVATION_BYTES[precision] each, times AUTOGRAD_FACTOR) and its token ids
    in the step's `grad_accum` micro-batches.

    Raises:
        ValueError: a recurrent encoder-decoder (the cost model counts Transformers).
    """
    encdec = family(config).traits.has_source
    Tt = (tgt_len or seq_len) if encdec else seq_len
    keys = layer_keys(config)
    act = stage_activations(config, keys, layer_activations(config, seq_len, Tt), seq_len, Tt)
    tokens = seq_len + (Tt if encdec else 0)
    return act * ACTIVATION_BYTES[precision] * AUTOGRAD_FACTOR + 8 * BATCH_TENSORS * tokens * grad_accum


def estimate_training_memory(model: nn.Module, *, rows: int, seq_len: int, tgt_len: int | None = None,
                             grad_accum: int = 1, precision: str = "fp32") -> MemoryEstimate:
    """The peak memory of a training step of `model` on micro-batches of `rows` rows (module docstring).

    Args:
        model: the model to train, counted as it is (the parameters of a LoRA model's frozen
            base hold no gradient and no Adam state). A model with a Transformer `ModelConfig`
            (`model.config`) has its activations counted (`row_bytes`); any other only its
            weights, gradients and Adam states.
        rows: rows per micro-batch.
        seq_len: tokens per row (an encoder-decoder's source).
        tgt_len: an encoder-decoder's target tokens per row (default seq_len).
        grad_accum: micro-batches per step (their token ids are drawn together).
        precision: the run's resolved precision (fp32, bf16, fp16: autocast's activations).

    Returns:
        the MemoryEstimate.

    Raises:
        ValueError: rows, seq_len, tgt_len or grad_accum not a positive integer.
    """
    for name, value in (("rows", rows), ("seq_len", seq_len), ("tgt_len", tgt_len or 1), ("grad_accum", grad_accum)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    unique = {id(p): p for p in model.parameters()}.values()
    params = sum(p.numel() for p in unique)
    trained = sum(p.numel() for p in unique if p.requires_grad)
    config = getattr(model, "config", None)
    covered = isinstance(config, ModelConfig) and bool(family(config).stacks(config))  # Transformer layers
    per_row = row_bytes(config, seq_len, tgt_len, grad_accum=grad_accum, precision=precision) if covered else 0
    return MemoryEstimate(weights=PARAM_BYTES * params, gradients=PARAM_BYTES * trained,
                          optimizer=ADAM_BYTES * trained, per_row=per_row, rows=rows)


# ---------------------------------------------------------------- the check
def size(n: float) -> str:
    """`512 KiB`, `12 MiB`, `3.2 GiB`, `1,234 GiB`."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if n >= scale:
            value = n / scale
            return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{n / 1024:,.0f} KiB"


@dataclass(frozen=True)
class BatchShape:
    """What sets a micro-batch: `field` (data.batch_size or data.batch_tokens) and its `value`,
    `rows` of at most `seq_len` (and an encoder-decoder's `tgt_len`) tokens each."""

    field: str
    value: int
    rows: int
    seq_len: int
    tgt_len: int | None

    @property
    def row_tokens(self) -> int:
        return self.seq_len + (self.tgt_len or 0)

    def value_for(self, rows: int) -> int:
        """The field's value for micro-batches of `rows` rows."""
        return rows * self.row_tokens if self.field == "data.batch_tokens" else rows


def batch_shape(data: Any) -> BatchShape:
    """The micro-batch of a DataConfig: data.batch_size rows, or with data.batch_tokens as many
    rows of the longest pair as that budget holds (the attention's T x T terms grow with the
    longest rows, so this bounds a budget of shorter ones too). Row lengths: the objective's
    `row_lengths` (attnlab.training.data.objectives)."""
    from attnlab.training.data.objectives import OBJECTIVES

    S, Tt = OBJECTIVES[data.objective].row_lengths(data)
    if data.batch_tokens is not None:
        rows = max(-(-data.batch_tokens // (S + (Tt or 0))), 1)
        return BatchShape("data.batch_tokens", data.batch_tokens, rows, S, Tt)
    return BatchShape("data.batch_size", data.batch_size, data.batch_size, S, Tt)


def check_training_memory(model: nn.Module, config: Any, device: torch.device, *, precision: str = "fp32",
                          task: Any = None, available: Available | None = None) -> MemoryEstimate | None:
    """Refuse a run whose training step cannot fit in the memory there is (module docstring),
    before its first batch. The Trainer calls it once the model is built (LoRA adapters added,
    layers frozen) and before the data pipeline draws a batch.

    Args:
        model: the model to train, on the CPU or already on `device`.
        config: the run's TrainConfig: train.check_memory false skips the check; a parallel
            layout that splits the model (parallel.tp or pp > 1) is skipped here: under pp each
            rank checks its own stage before making it (`check_stage_memory`). Under torchrun on a CPU, the LOCAL_WORLD_SIZE processes of
            this machine share its memory: each is counted.
        device: where it trains.
        precision: the run's resolved precision (attnlab.training.setup.precision.resolve_precision).
        task: the task the batches come from: one with a data pipeline (`task.pipeline.cfg`)
            has its batches counted; any other (a fine-tuning head's) only weights, gradients and
            Adam. None: config.data.
        available: the memory there is (default `available_memory(device)`).

    Returns:
        the estimate, or None where nothing was checked (switched off, a split model, the
        memory unknown).

    Raises:
        ConfigError: naming data.batch_size (data.batch_tokens), or `model` where not even the
            weights, gradients and Adam fit; the message gives the estimate and its parts, the
            memory available and where that figure comes from, the largest value that fits, and
            the switch that skips the check.
    """
    if not config.train.check_memory or config.parallel.sharded:
        return None
    available = available or available_memory(device)
    if available is None:
        return None
    data = config.data if task is None else getattr(getattr(task, "pipeline", None), "cfg", None)
    shape, run = batch_shape(data) if data is not None else None, config.train
    if shape is None:  # a task with batches of its own: weights, gradients and Adam alone
        estimate = dataclasses.replace(estimate_training_memory(model, rows=1, seq_len=1), per_row=0, rows=0)
    else:
        estimate = estimate_training_memory(model, rows=shape.rows, seq_len=shape.seq_len, tgt_len=shape.tgt_len,
                                            grad_accum=run.grad_accum, precision=precision)
    first = next(iter(model.parameters()), None)
    resident = estimate.weights if first is not None and first.device.type == device.type else 0  # already held
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    room = (available.bytes + resident) // max(processes, 1)  # per process, its weights given back
    if estimate.total <= room:
        return estimate
    raise _too_large(estimate, shape, room, available, resident, processes)


def check_stage_memory(estimate: MemoryEstimate, device: torch.device, *, stage: str,
                       available: Available | None = None) -> MemoryEstimate | None:
    """Refuse a pipeline stage (parallel.pp > 1) whose step cannot fit in this rank's memory,
    before its weights are made: `estimate` counts the stage's own parameters (not the whole
    model's), their gradients and Adam states, and the activations the schedule keeps
    (`attnlab parallel plan`'s figures). `stage` names it in the message ("stage 1 of 2").
    Under torchrun on a CPU, the LOCAL_WORLD_SIZE processes of this machine share its memory.

    Returns:
        the estimate, or None where the memory is unknown.

    Raises:
        ConfigError: naming parallel.pp, the estimate and its parts, the memory available and
            where that figure comes from, and the switch that skips the check.
    """
    available = available or available_memory(device)
    if available is None:
        return None
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    room = available.bytes // max(processes, 1)
    if estimate.total <= room:
        return estimate
    shared = f", shared by {processes} processes" if processes > 1 else ""
    raise ConfigError("parallel.pp", f"{stage} needs about {size(estimate.total)} at the peak of a training step "
                      f"({estimate.describe()}), but {size(available.bytes)} is available ({available.source}{shared}); "
                      "use more stages or a smaller model or batch, or set train.check_memory to false to skip this "
                      "estimate")


def _too_large(estimate: MemoryEstimate, shape: BatchShape | None, room: int, available: Available, resident: int,
               processes: int) -> ConfigError:
    """The one-line refusal of `check_training_memory`: the batch field with the largest value
    that fits, or the model when not even one row does."""
    shared = f", shared by {processes} processes" if processes > 1 else ""
    there = f"{size(available.bytes + resident)} is available ({available.source}{shared})"
    skip = "or set train.check_memory to false to skip this estimate"
    rows = estimate.largest_rows(room)
    if shape is not None and rows > 0:
        return ConfigError(shape.field, f"{shape.value:,} ({shape.rows:,} rows of up to {shape.row_tokens:,} tokens) "
                           f"need about {size(estimate.total)} at the peak of a training step "
                           f"({estimate.describe()}), but {there}; the largest {shape.field} that fits is "
                           f"{shape.value_for(rows):,}: lower it, {skip}")
    one = dataclasses.replace(estimate, rows=min(estimate.rows, 1))
    batches = " with batches of one row" if shape is not None else ""
    return ConfigError("model", f"training it{batches} needs about {size(one.total)} ({one.describe()}), but {there}: "
                       f"choose a smaller model, {skip}")


__all__ = ["ACTIVATION_BYTES", "ADAM_BYTES", "AUTOGRAD_FACTOR", "BatchShape", "MemoryEstimate", "PARAM_BYTES",
           "batch_shape", "check_stage_memory", "check_training_memory", "estimate_training_memory", "layer_activations", "layer_keys",
           "row_bytes", "size", "stage_activations"]
