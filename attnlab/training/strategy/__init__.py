"""How a step runs over processes (see attnlab.training.strategy.base): one process, data parallel
under torchrun, or a model split over a tensor x pipeline mesh; `choose_strategy` picks one from
the run's `parallel` section and the environment torchrun sets."""

from __future__ import annotations

from typing import Any

import torch

from attnlab.training.strategy.base import DataParallel, SingleProcess
from attnlab.training.strategy.distributed import init_from_env
from attnlab.training.strategy.mesh import MeshStrategy

__all__ = ["DataParallel", "MeshStrategy", "SingleProcess", "choose_strategy"]


def choose_strategy(config: Any, device: torch.device, mesh: Any = None) -> SingleProcess:
    """The strategy for a run (a TrainConfig: its `parallel` section) on `device`.

    Args:
        config: the run; `parallel` gives tp, pp, dp.
        device: the run's device (a CUDA run computes on cuda:LOCAL_RANK under torchrun).
        mesh: the hooks of a split model (attnlab.parallel.mesh.MeshTraining), needed when tp or
            pp is above 1 and unused otherwise (attnlab.parallel sits above training: it is passed in).

    Raises:
        ValueError: tp or pp above 1 without `mesh`; a layout that does not fit the processes.
    """
    parallel = config.parallel
    if parallel.sharded and mesh is None:
        raise ValueError(f"parallel.tp={parallel.tp}, parallel.pp={parallel.pp} split the model over processes: pass "
                         "the mesh hooks, Trainer(config, mesh=attnlab.parallel.mesh.MeshTraining) (attnlab train "
                         "--nproc N does)")
    ctx = init_from_env(parallel.tp, pp=parallel.pp, dp=parallel.dp)  # one process unless torchrun started this
    device = ctx.device if ctx.distributed and device.type == "cuda" else device
    if parallel.sharded:
        mesh.check_layout(config, ctx.world_size)  # before any data is prepared
        return MeshStrategy(ctx, device, mesh)
    return DataParallel(ctx, device) if ctx.distributed else SingleProcess(ctx, device)
