"""The hooks `attnlab.training.Trainer` calls to train data-parallel under torchrun.

    ctx = init_from_env()                            # one process unless WORLD_SIZE > 1
    with rank0_first(ctx):                           # rank 0 tokenises and caches, then the others read
        pipeline = Pipeline.build(...)
    pipeline = ShardedPipeline(pipeline, ctx)        # every rank draws dp batches, keeps its own
    loss_fn = data_parallel_loss(model, ctx)         # DDP around batch_loss; plain batch_loss alone

Data order: at each micro-batch every rank draws dp batches from the same seeded generator and
keeps batch number dp_rank, so N ranks with grad_accum k take exactly the batches (and the mean
gradient) of one process with grad_accum N k. The generator's state in a checkpoint is the same
on every rank, so a run resumes on any world size (bitwise the same run when N k is kept).
Dropout draws from each rank's own generator, seeded alike: ranks share masks within a step.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from attnlab.parallel.context import ParallelContext
from attnlab.parallel.data import LossModule, wrap_model


@contextmanager
def rank0_first(ctx: ParallelContext) -> Iterator[None]:
    """Run the block on rank 0, then on the other ranks (files rank 0 writes are then ready)."""
    if not ctx.is_main:
        ctx.barrier()
    yield
    if ctx.is_main:
        ctx.barrier()


class ShardedPipeline:
    """A training Pipeline whose `train_batch` gives this data-parallel rank its own batch.

    Every other attribute (eval batches, tokenizer, ...) is the wrapped pipeline's.
    """

    def __init__(self, pipeline: Any, ctx: ParallelContext):
        self._pipeline = pipeline
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)

    def train_batch(self, generator: torch.Generator) -> dict[str, Tensor]:
        batches = [self._pipeline.train_batch(generator) for _ in range(self._ctx.dp_size)]
        return batches[self._ctx.dp_rank]


def shard_pipeline(pipeline: Any, ctx: ParallelContext) -> Any:
    """`ShardedPipeline(pipeline, ctx)` under data parallel, the pipeline itself alone."""
    return ShardedPipeline(pipeline, ctx) if ctx.dp_size > 1 else pipeline


def data_parallel_loss(model: nn.Module, ctx: ParallelContext, loss_fn=None) -> nn.Module:
    """A module computing `loss_fn(model, batch, **kwargs)` (default `batch_loss`), wrapped in
    DistributedDataParallel when dp > 1 so that backward averages the gradients over ranks."""
    if loss_fn is None:
        from attnlab.training.steps import batch_loss as loss_fn
    return wrap_model(LossModule(model, loss_fn), ctx)


def any_rank(flag: bool, ctx: ParallelContext) -> bool:
    """True on every rank when `flag` is true on any (keeps stop decisions in step)."""
    if not ctx.distributed:
        return flag
    return ctx.all_reduce_mean({"flag": float(flag)}, group="world")["flag"] > 0
