"""What a run's `parallel` section asks of the rest of its config, checked before any process
starts: `attnlab train CONFIG --nproc N` calls `check_layout(cfg, N)` once, and each rank's
Trainer again with the world torchrun gives it.

    sizes     tp x pp x dp = N (dp, when unset, is what tp pp leave)    attnlab.training.strategy.distributed.mesh_sizes
    model     tp: heads, kv heads and d_ff divisible, a kernel that splits by heads, no mixture of
              experts, no RNN (attnlab.parallel.tensor.check_supported); pp: at least pp layers
              (an encoder-decoder's encoder and decoder layers together), a decoder, encoder or
              encoder-decoder with a per-token head (attnlab.parallel.stages.check_pipeline_supported)
    run       what the layout asks of the other sections without N (no fp16, LoRA, torch.compile,
              segment memory, NSP / SBO heads under tp or pp; micro_batches dividing a step's rows,
              no activation checkpointing or data.batch_tokens under pp; the attention kernel) is
              refused when the config is read: attnlab.training.run_checks.check_run

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

