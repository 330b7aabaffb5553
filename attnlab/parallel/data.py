"""Data parallelism: one model replica per rank, different rows of each batch, averaged gradients.

    ctx = init_from_env()                      # under torchrun (gloo on CPU, NCCL on GPU)
    model = wrap_model(model, ctx)             # DistributedDataParallel over ctx.dp_group
    for batch in shard_batches(batches, ctx):  # rank k keeps rows [k B/N, (k+1) B/N) of each batch
        loss = loss_fn(model, batch); loss.backward(); opt.step()
    metrics = all_reduce_metrics({"loss": float(loss)}, ctx)   # the mean over ranks

N ranks with B/N rows each take the same steps as one process with B rows: DDP averages the
gradients of per-rank mean losses (exact when every rank holds the same number of loss tokens;
otherwise rows are weighted per rank). Only `is_main(ctx)` writes checkpoints and logs; every
rank loads the same checkpoint, so a run resumes on any world size.

For a trainer whose loss reads the model's submodules directly (`batch_loss` calls
`model.features` and the head's weight), wrap a `LossModule` instead of the model, so that the
forward pass goes through DDP and its gradient hooks are armed.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from attnlab.training.strategy.distributed import LossModule, ParallelContext


def wrap_model(model: nn.Module, ctx: ParallelContext, *, find_unused_parameters: bool = False,
               fsdp: bool = False) -> nn.Module:
    """DistributedDataParallel over the data-parallel group, or `model` itself when dp = 1.

    Args:
        model: on `ctx.device` already; tensor-parallel or not (FSDP: not).
        ctx: from `init_from_env`.
        find_unused_parameters: let DDP skip parameters a step does not use (a pooler, the unused
            half of a model); costs a graph walk per step.
        fsdp: shard parameters, gradients and optimizer state over the data-parallel ranks instead
            (`torch.distributed.fsdp.fully_shard` on each Transformer layer, then the whole model;
            Zhao et al. 2023, https://arxiv.org/abs/2304.11277), for models larger than one device.
            The model is changed in place and returned; save it with `save_full_checkpoint`.

    Returns:
        the wrapped module (the original stays reachable as `.module` under DDP).
    """
    if ctx.dp_size == 1:
        return model
    if fsdp:
        return _fully_shard(model, ctx)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, process_group=ctx.dp_group,
                                   find_unused_parameters=find_unused_parameters)


def _fully_shard(model: nn.Module, ctx: ParallelContext) -> nn.Module:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from attnlab.nn.layers import TransformerLayer

    if getattr(model, "tp_size", 1) > 1:
        raise ValueError("fsdp=True with a tensor-parallel model is not supported; use DDP (fsdp=False) on the mesh")
    mesh = DeviceMesh.from_group(ctx.dp_group, ctx.device.type)
    for layer in [m for m in model.modules() if isinstance(m, TransformerLayer)]:
        fully_shard(layer, mesh=mesh)  # one all-gather / reduce-scatter unit per layer
    fully_shard(model, mesh=mesh)  # the rest: embeddings, final norm, head
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP / LossModule wrappers."""
    while isinstance(model, (DistributedDataParallel, LossModule)):
        model = model.module if isinstance(model, DistributedDataParallel) else model.model
    return model


def shard_batch(batch: Any, ctx: ParallelContext) -> Any:
    """This data-parallel rank's rows of a batch (a tensor, or a dict/list/tuple of them).

    Raises:
        ValueError: a batch whose first dimension the data-parallel size does not divide.
    """
    if ctx.dp_size == 1:
        return batch
    if isinstance(batch, dict):
        return {k: shard_batch(v, ctx) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(shard_batch(v, ctx) for v in batch)
    if not isinstance(batch, Tensor):
        return batch
    if batch.shape[0] % ctx.dp_size:
        raise ValueError(f"batch size {batch.shape[0]} is not divisible by the data-parallel size {ctx.dp_size}; "
                         "choose a global batch size that is a multiple of it")
    return batch.chunk(ctx.dp_size, dim=0)[ctx.dp_rank]


def shard_batches(batches: Iterable[Any], ctx: ParallelContext) -> Iterator[Any]:
    """Each batch of `batches` (the same global stream on every rank) cut to this rank's rows."""
    for batch in batches:
        yield shard_batch(batch, ctx)


def all_reduce_metrics(values: dict[str, float], ctx: ParallelContext) -> dict[str, float]:
    """The mean of scalar metrics over the data-parallel ranks (identity alone)."""
    return ctx.all_reduce_mean(values, group="dp")


def is_main(ctx: ParallelContext | None) -> bool:
    """Whether this process writes files and logs (rank 0, or no parallel context)."""
    return ctx is None or ctx.is_main


def all_reduce_gradients(model: nn.Module, ctx: ParallelContext) -> None:
    """Average .grad over the data-parallel group by hand (for loops that do not use DDP)."""
    if ctx.dp_size == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    ctx._guard("all_reduce", lambda: torch.distributed.all_reduce(flat, group=ctx.dp_group))
    flat /= ctx.dp_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
