"""Distributed training hooks: who this process is in a torchrun run, and what the Trainer does
differently under data parallel (rank 0 prepares the data first, each rank trains on its own
batches, gradients are averaged by DDP, stop decisions are taken together).

    world = pp * dp * tp processes, rank = (pp_rank * dp + dp_rank) * tp + tp_rank

    tp = 2, dp = 2:   tensor groups {0, 1} {2, 3}     (ranks of one group hold shards of one model)
                      data groups   {0, 2} {1, 3}     (ranks of one group hold the same shard,
                                                       see different batches, average gradients)
    tp = 2, pp = 2:   tensor groups {0, 1} {2, 3}; pipeline groups {0, 2} {1, 3} (stage 0 on
                      ranks 0-1, stage 1 on ranks 2-3: the pipeline axis varies slowest, so its
                      point-to-point traffic, the lightest, is the one that crosses machines)

`init_from_env()` reads the variables torchrun sets (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT); without them it returns a one-process context on which every collective is the
identity, so the same training code runs alone or under torchrun. `attnlab.parallel` builds
tensor parallel, FSDP and the process launcher on this context.

The Trainer's hooks:

    ctx = init_from_env()                            # one process unless WORLD_SIZE > 1
    with rank0_first(ctx):                           # rank 0 tokenises and caches, then the others read
        task = ...
    task = shard_task(task, ctx)                     # every rank draws dp batches, keeps its own
    loss_fn = data_parallel_loss(model, ctx, task.loss)   # DDP around the task's loss; plain alone

Data order: at each micro-batch every rank draws dp batches from the same seeded generator and
keeps batch number dp_rank, so N ranks with grad_accum k take exactly the batches (and, with the
token-weighted loss, the gradient) of one process with grad_accum N k. The generator's state in a
checkpoint is the same on every rank, so a run resumes on any world size (bitwise the same run
when N k is kept). Dropout draws from each rank's own generator, seeded alike: ranks share masks
within a step.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn


class CollectiveError(RuntimeError):
    """A collective failed or timed out: usually another rank died or hangs."""


@dataclass
class ParallelContext:
    """A process's place in the run.

    Attributes:
        rank, world_size, local_rank: as torchrun numbers them.
        device: where this rank computes (cuda:LOCAL_RANK under NCCL, else cpu).
        tp_size, dp_size, pp_size: the mesh; tp_rank, dp_rank, pp_rank: this rank's coordinates.
        tp_group, dp_group, pp_group: process groups along each axis (None: the default group or alone).
        timeout_s: the collective timeout given to the process group.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    tp_size: int = 1
    dp_size: int = 1
    tp_group: dist.ProcessGroup | None = None
    dp_group: dist.ProcessGroup | None = None
    timeout_s: float = 300.0
    pp_size: int = 1
    pp_group: dist.ProcessGroup | None = None

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def dp_rank(self) -> int:
        return (self.rank // self.tp_size) % self.dp_size

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline stage."""
        return self.rank // (self.tp_size * self.dp_size)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files and logs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        """Wait for every rank (a no-op alone); raises CollectiveError when a peer is gone."""
        if self.distributed:
            self._guard("barrier", lambda: dist.barrier())

    def all_reduce_mean(self, values: dict[str, float], group: str = "dp") -> dict[str, float]:
        """The mean of each scalar metric over the data-parallel group (or "world").

        Args:
            values: metric name -> float on this rank.
            group: "dp" (ranks that saw different batches) or "world".

        Returns:
            the same keys, averaged.
        """
        size = self.dp_size if group == "dp" else self.world_size
        if size == 1 or not values:
            return dict(values)
        pg = self.dp_group if group == "dp" else None
        t = torch.tensor([float(v) for v in values.values()], dtype=torch.float64, device=self.device)
        self._guard("all_reduce", lambda: dist.all_reduce(t, group=pg))
        return {k: float(v) / size for k, v in zip(values, t.tolist())}

    def _guard(self, what: str, call) -> None:
        try:
            call()
        except Exception as err:  # gloo/NCCL raise RuntimeError subclasses with long messages
            raise CollectiveError(
                f"rank {self.rank} of {self.world_size}: {what} failed or timed out (timeout {self.timeout_s:g} s); "
                f"another rank probably died or hangs -- check its log. Cause: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
            ) from err


def _mesh_groups(world: int, tp: int, pp: int = 1) -> tuple[dist.ProcessGroup | None, ...]:
    """This rank's (tp_group, dp_group, pp_group) on the (pp, dp, tp) mesh, tp varying fastest;
    every rank creates every group, in the same order."""
    rank, dp = dist.get_rank(), world // (tp * pp)

    def at(p: int, d: int, t: int) -> int:
        return (p * dp + d) * tp + t

    axes = {  # axis -> its size and the rank lists of its groups
        "tp": (tp, [[at(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]),
        "dp": (dp, [[at(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)]),
        "pp": (pp, [[at(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)]),
    }
    mine: dict[str, dist.ProcessGroup | None] = {}
    for axis, (size, groups) in axes.items():
        for ranks in groups:
            g = dist.new_group(ranks) if size < world else dist.group.WORLD
            if rank in ranks:
                mine[axis] = g
    return mine["tp"], mine["dp"], mine["pp"]


def mesh_sizes(world: int, tp: int = 1, pp: int = 1, dp: int | None = None) -> int:
    """dp of the layout tp x pp x dp over `world` processes (what tp pp leave when dp is None).

    Raises:
        ValueError: a size that is not a positive integer; tp pp not dividing `world`, or a
            given dp whose product with them is not `world` (the message says how many
            processes the layout needs).
    """
    for name, value in (("tp", tp), ("pp", pp), ("dp", 1 if dp is None else dp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if dp is not None and tp * pp * dp != world:
        raise ValueError(f"the layout tp={tp} x pp={pp} x dp={dp} needs {tp * pp * dp} processes, this run has "
                         f"{world} (WORLD_SIZE, --nproc); start it on {tp * pp * dp} or leave dp unset")
    if world % (tp * pp):
        raise ValueError(f"tp={tp} x pp={pp} = {tp * pp} must divide the number of processes, {world} (WORLD_SIZE, "
                         f"--nproc); start a multiple of {tp * pp} processes" if pp > 1 else
                         f"tp={tp} must divide the number of processes, {world} (WORLD_SIZE, --nproc); start a "
                         f"multiple of {tp} processes")
    return world // (tp * pp)


def init_from_env(tp: int = 1, *, pp: int = 1, dp: int | None = None, backend: str | None = None,
                  timeout_s: float = 300.0) -> ParallelContext:
    """Join the process group torchrun describes in the environment and build the mesh.

    Args:
        tp: tensor-parallel degree.
        pp: pipeline-parallel degree (stages); tp pp must divide WORLD_SIZE.
        dp: data-parallel degree; None: WORLD_SIZE // (tp pp), else tp pp dp must be WORLD_SIZE.
        backend: "gloo" or "nccl"; default NCCL when CUDA is available, else gloo.
        timeout_s: collective timeout: a rank waiting longer than this for its peers raises
            instead of hanging (a dead peer usually fails faster, when its sockets close).

    Returns:
        a ParallelContext (one process, no groups, when WORLD_SIZE is unset or 1).

    Raises:
        ValueError: a layout that does not fit the world size (`mesh_sizes`); a malformed environment.
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as err:
        raise ValueError(f"WORLD_SIZE/RANK/LOCAL_RANK must be integers: {err}") from None
    mesh_sizes(world, tp, pp, dp)
    if world == 1 and not dist.is_initialized():
        return ParallelContext(timeout_s=timeout_s)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r} is not one of gloo, nccl")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    tp_group, dp_group, pp_group = _mesh_groups(world, tp, pp)
    return ParallelContext(rank=rank, world_size=world, local_rank=local_rank, device=device, tp_size=tp,
                           dp_size=world // (tp * pp), tp_group=tp_group, dp_group=dp_group, timeout_s=timeout_s,
                           pp_size=pp, pp_group=pp_group)


def shutdown() -> None:
    """Leave the process group (safe to call when there is none)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- the Trainer's hooks
class LossModule(nn.Module):
    """forward(batch) = loss_fn(model, batch): the unit DDP wraps when the loss is not model(x)
    (a loss that reads the model's submodules directly, as the fused LM loss does, must run
    inside DDP's forward so that its gradient hooks are armed)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., Any]):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any, **kwargs) -> Any:
        return self.loss_fn(self.model, batch, **kwargs)


def data_parallel_loss(model: nn.Module, ctx: ParallelContext, loss_fn: Callable[..., Any]) -> nn.Module:
    """A module computing `loss_fn(model, batch, **kwargs)`, wrapped in DistributedDataParallel
    over the data-parallel group when dp > 1 (backward then averages the gradients over ranks)."""
    module = LossModule(model, loss_fn)
    if ctx.dp_size == 1:
        return module
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, process_group=ctx.dp_group)


@contextmanager
def rank0_first(ctx: ParallelContext) -> Iterator[None]:
    """Run the block on rank 0, then on the other ranks (files rank 0 writes are then ready)."""
    if not ctx.is_main:
        ctx.barrier()
    yield
    if ctx.is_main:
        ctx.barrier()


class ShardedTask:
    """A training task whose `train_batch` gives this data-parallel rank its own batch.

    Every other attribute (evaluation, loss, state, ...) is the wrapped task's.
    """

    def __init__(self, task: Any, ctx: ParallelContext):
        self._task = task
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def train_batch(self, generator: torch.Generator) -> dict[str, Tensor]:
        batches = [self._task.train_batch(generator) for _ in range(self._ctx.dp_size)]
        return batches[self._ctx.dp_rank]


def shard_task(task: Any, ctx: ParallelContext) -> Any:
    """`ShardedTask(task, ctx)` under data parallel, the task itself alone.

    Raises:
        ValueError: a task whose batches must stay in order (a segment memory's streams), which
            ranks drawing their own batches would break.
    """
    if ctx.dp_size > 1 and getattr(task, "ordered", False):
        raise ValueError(f"{type(task).__name__} reads its data in order (model.memory_len carries a memory from "
                         "one segment to the next); data parallel would give each rank other segments: train it "
                         "in one process")
    return ShardedTask(task, ctx) if ctx.dp_size > 1 else task


def any_rank(flag: bool, ctx: ParallelContext) -> bool:
    """True on every rank when `flag` is true on any (keeps stop decisions in step)."""
    if not ctx.distributed:
        return flag
    return ctx.all_reduce_mean({"flag": float(flag)}, group="world")["flag"] > 0


def all_reduce_sum(value: float, ctx: ParallelContext) -> float:
    """The sum of a number over the data-parallel ranks (the number itself alone)."""
    if ctx.dp_size == 1:
        return value
    return ctx.all_reduce_mean({"v": value})["v"] * ctx.dp_size
