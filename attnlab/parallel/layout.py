"""What a run's `parallel` section asks of the rest of its config, checked before any process
starts: `attnlab train CONFIG --nproc N` calls `check_layout(cfg, N)` once, and each rank's
Trainer again with the world torchrun gives it.

    sizes     tp x pp x dp = N (dp, when unset, is what tp pp leave)    attnlab.training.strategy.distributed.mesh_sizes
    model     tp: heads, kv heads and d_ff divisible, a kernel that splits by heads, no mixture of
              experts, no RNN (attnlab.parallel.tensor.check_supported); pp: at least pp layers
              (an encoder-decoder's encoder and decoder layers together), a decoder, encoder or
              encoder-decoder with a per-token head (attnlab.parallel.stages.check_pipeline_supported)
    data      pp: every objective and packing (their masks and target ids go to every stage), with
              batch_size x grad_accum rows divisible by micro_batches (so no data.batch_tokens,
              whose batches vary in rows); tp and pp: no next-sentence or span-boundary head
              (their losses are not split)
    run       tp and pp: no fp16 loss scaling, LoRA, torch.compile or segment memory; pp: no
              activation checkpointing (the stages call the layers themselves)

A vocabulary tp does not divide needs no check: tensor parallel pads it (attnlab.parallel.tensor).
Every error is a ConfigError naming the field, the value and the axis that refuses it.
"""

from __future__ import annotations

from attnlab.config.validate import ConfigError
from attnlab.training.config import TrainConfig
from attnlab.training.strategy.distributed import mesh_sizes

def check_layout(config: TrainConfig, world_size: int) -> tuple[int, int, int]:
    """Check `config.parallel` against `world_size` processes and the rest of `config`.

    Args:
        config: the run.
        world_size: N, the processes of the run (`--nproc`, WORLD_SIZE).

    Returns:
        (tp, pp, dp).

    Raises:
        ConfigError: the first problem found, naming the field (see the module docstring).
    """
    par = config.parallel
    try:
        dp = mesh_sizes(world_size, par.tp, par.pp, par.dp)
    except ValueError as err:
        raise ConfigError("parallel", str(err)) from None
    if par.sharded:
        _check_model(config)
        _check_run(config)
    return par.tp, par.pp, dp


def _check_model(config: TrainConfig) -> None:
    from attnlab.parallel.stages import check_pipeline_supported
    from attnlab.parallel.tensor import check_supported

    tp, pp = config.parallel.tp, config.parallel.pp
    model = config.model_config()
    if tp > 1:
        try:
            check_supported(model, tp)
        except ValueError as err:
            raise ConfigError("parallel.tp", f"{tp}: {err}") from None
    try:
        check_pipeline_supported(model, pp)
    except ValueError as err:
        raise ConfigError("parallel.pp", f"{pp}: {err}") from None
    if model.memory_len:
        raise ConfigError("model.memory_len", f"{model.memory_len} (a segment memory) is not supported with "
                          f"parallel.tp={tp}; train it in one process or with data parallel alone")


def _check_run(config: TrainConfig) -> None:
    par, data, run = config.parallel, config.data, config.train
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
