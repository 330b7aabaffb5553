"""`check_run(config)`: what one section of a run config asks of another, checked in one place.

Each section checks itself when it is built (ModelConfig: the kernel against the score, the
positions and the arch; DataConfig: the objective against data.nsp, data.pack, ...). What needs two
sections is checked here, once the whole run config is known (`TrainConfig.__post_init__`, so a
config file, an override or a config built in Python are refused on load, before any data is read):

    data.pack              x the attention kernel (a dense per-row mask) and model.memory_len
    data.seq_len,          x model.position.max_len: the longest row an objective makes (`row_lengths`:
      data.max_pair_len      a pair's side is max_pair_len + 1) must fit a learned or binary table
    the attention kernel   x parallel.tp (heads split over ranks) and parallel.pp (token ids seen
                             by the first stage only)
    parallel.tp / pp       x train.precision fp16, lora, train.compile, model.memory_len, data.nsp /
                             span_boundary; pp x train.activation_checkpointing, data.batch_tokens,
                             parallel.micro_batches against a step's rows (`check_sharded_run`)
    the attention kernel   x data.objective: a bidirectional-only kernel cannot train a decoder
                             (refused where the objective sets model.arch: attnlab.training.config_resolve)

What the layout asks of the model's shape (heads divisible by tp, layers for pp, ...) and the
number of processes are the parallel package's: attnlab.parallel.layout.check_layout.
The library functions that run outside a run keep their own guard (`tensor_parallel`,
`split_stages`, `MultiHeadAttention`, a decoder given `document_ids`): a direct call with a kernel
they cannot run is refused there too.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from attnlab.config.families import traits

from attnlab.config.validate import ConfigError
from attnlab.training.data.objectives import OBJECTIVES

__all__ = ["TABLE_POSITIONS", "check_kernel_layout", "check_packing", "check_positions", "check_run",
           "check_sharded_run", "longest_pair_within"]

# position schemes whose table ends at position.max_len (attnlab.nn.positions)
TABLE_POSITIONS = ("learned", "binary")


def check_run(config: Any) -> None:
    """Every check between the sections of a run config (module docstring).

    Args:
        config: a TrainConfig (its model, data and parallel sections).

    Raises:
        ConfigError: naming the fields that do not go together.
    """
    check_packing(config.data, config.model)
    check_positions(config.data, config.model)
    check_kernel_layout(config.model, config.parallel)
    check_sharded_run(config)


def check_packing(data: Any, model: Any) -> None:
    """What data.pack asks of the model: `pad` and `document_masked` make rows, which a segment
    memory (model.memory_len, read as a stream of consecutive segments) would not see;
    `document_masked` needs a kernel that takes a dense per-row mask (auto, sdpa, eager), not one
    with its own sparse pattern (Supports.pattern). Every position scheme restarts per document:
    absolute ones (sinusoidal, learned, binary) and rotary by the position ids, relative ones
    (relative, alibi, t5_bias) inside the block-diagonal mask.

    Raises:
        ConfigError: naming data.pack and the model field in the way.
    """
    if data.pack == "plain":
        return
    if model.memory_len:
        raise ConfigError("data.pack", f"{data.pack!r} makes rows, but model.memory_len={model.memory_len} reads "
                          "the data as consecutive segments of a stream; use data.pack='plain' or memory_len 0")
    from attnlab.nn.kernels import KERNELS  # the model's registry, read only here

    if data.pack == "document_masked" and KERNELS[model.attention.kernel].supports.pattern:
        dense = ", ".join(n for n, k in KERNELS.items() if k.supports.causal and not k.supports.pattern)
        raise ConfigError("data.pack", f"'document_masked' needs an attention kernel that takes a dense mask "
                          f"({dense}); attention.kernel={model.attention.kernel!r} applies its own sparse "
                          "pattern")


def check_positions(data: Any, model: Any) -> None:
    """A row must fit a position table: `learned` and `binary` positions end at
    model.position.max_len, so longer rows (each objective's `row_lengths`: data.seq_len, or a
    pair's side, data.max_pair_len + 1) failed at the first step, after the corpus was read and
    tokenised.

    Raises:
        ConfigError: naming data.seq_len (data.max_pair_len for pairs) and model.position.max_len.
    """
    position, objective = model.position, OBJECTIVES[data.objective]
    if traits(model.arch).recurrent or position.scheme not in TABLE_POSITIONS:
        return
    longest = max(n for n in objective.row_lengths(data) if n is not None)
    if longest <= position.max_len:
        return
    field = "data.max_pair_len" if objective.pairs else "data.seq_len"
    raise ConfigError(field, f"rows of up to {longest} tokens do not fit {position.scheme} positions of "
                      f"model.position.max_len={position.max_len} (the table ends there); lower {field} or "
                      "raise model.position.max_len")


def longest_pair_within(objective: str, max_len: int, default: int) -> int:
    """The largest data.max_pair_len, at most `default`, whose rows fit a table of `max_len`
    positions (seq2seq: max_pair_len + 1 per side; pairs_lm: source [SEP] target); 1 at least."""
    spec = OBJECTIVES[objective]
    for n in range(default, 0, -1):
        if max(x for x in spec.row_lengths(SimpleNamespace(max_pair_len=n, seq_len=n)) if x is not None) <= max_len:
            return n
    return 1


def check_kernel_layout(model: Any, parallel: Any) -> None:
    """The attention kernel against a tensor- or pipeline-parallel layout: tp splits a layer's
    heads over ranks (Supports.tensor_parallel); pp hands the token ids to the first stage only,
    which a kernel that picks tokens by id (a global token chosen by its id) needs on every stage.

    Raises:
        ConfigError: naming parallel.tp or parallel.pp and the kernel.
    """
    from attnlab.nn.kernels import KERNELS, kernel_class  # the model's registry, read only here

    att, tp, pp = model.attention, parallel.tp, parallel.pp
    if tp > 1 and not KERNELS[att.kernel].supports.tensor_parallel:
        splittable = ", ".join(name for name, kernel in KERNELS.items() if kernel.supports.tensor_parallel)
        raise ConfigError("parallel.tp", f"{tp}: tensor parallel does not support attention.kernel={att.kernel!r}; "
                          f"use {splittable}")
    if pp > 1 and kernel_class(att.kernel).needs_token_ids(att.kernel_options):
        raise ConfigError("parallel.pp", f"{pp}: pipeline parallel (pp={pp}) does not support attention.kernel="
                          f"{att.kernel!r} with these options: it picks tokens by id, which only the first stage "
                          "sees")


def check_sharded_run(config: Any) -> None:
    """What a tensor- or pipeline-parallel layout asks of the rest of the run: no fp16 (a loss
    scaler per rank), LoRA, torch.compile, segment memory (tp) or next-sentence / span-boundary
    head (their losses are not split); under pp, no activation checkpointing (the stages call the
    layers themselves), no data.batch_tokens (batches of varying rows), and micro_batches dividing
    the rows of a step.

    Raises:
        ConfigError: naming the field, its value and the axis that refuses it.
    """
    par, data, run = config.parallel, config.data, config.train
    if not par.sharded:
        return
    axis = f"parallel.tp={par.tp}" if par.pp == 1 else f"parallel.pp={par.pp}" if par.tp == 1 else \
        f"parallel.tp={par.tp} x pp={par.pp}"
    if run.precision == "fp16":
        raise ConfigError("train.precision", f"'fp16' (a loss scaler per rank) is not supported with {axis}; "
                          "use bf16 or fp32")
    if config.lora is not None:
        raise ConfigError("lora", f"adapters are not supported with {axis}; train them with data parallel alone")
    if run.compile:
        raise ConfigError("train.compile", f"true is not supported with {axis}; set it to false")
    if data.nsp or data.span_boundary:
        field = "data.nsp" if data.nsp else "data.span_boundary"
        raise ConfigError(field, f"true is not supported with {axis}: its head's loss is not split over the "
                          "processes; train it with data parallel alone")
    if par.tp > 1 and config.model.memory_len:
        raise ConfigError("model.memory_len", f"{config.model.memory_len} (a segment memory) is not supported with "
                          f"parallel.tp={par.tp}; train it in one process or with data parallel alone")
    if par.pp == 1:
        return
    if run.activation_checkpointing:
        raise ConfigError("train.activation_checkpointing", f"true is not supported with {axis}: the pipeline's "
                          "stages call the layers themselves; set it to false")
    if data.batch_tokens is not None:
        raise ConfigError("data.batch_tokens", f"{data.batch_tokens} is not supported with {axis}: its batches "
                          "hold a varying number of rows, which parallel.micro_batches cannot cut alike; use "
                          "data.batch_size")
    rows = data.batch_size * run.grad_accum
    if rows % par.micro_batches:
        raise ConfigError("parallel.micro_batches", f"{par.micro_batches} does not divide the {rows} rows of a "
                          f"step (data.batch_size={data.batch_size} x train.grad_accum={run.grad_accum})")
