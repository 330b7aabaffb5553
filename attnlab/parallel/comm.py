"""The conjugate communication operators of Megatron-LM tensor parallelism, as autograd Functions.

Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053, section 3: a column-parallel matrix is
entered through f and a row-parallel one is left through g.

    f  copy_to_parallel:      forward identity          backward all-reduce (sum)
    g  reduce_from_parallel:  forward all-reduce (sum)  backward identity
       gather_from_parallel:  forward all-gather (last dim)  backward keep the local chunk

Every operator is the identity when the group has one member (or torch.distributed is not
initialised), so a tensor-parallel model with tp = 1 is the plain model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def group_size(group: dist.ProcessGroup | None) -> int:
    """Members of `group` (the default group when None); 1 without torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    """This process's rank inside `group`; 0 without torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group)


def all_reduce_sum(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """A new tensor holding the sum of x over `group` (x itself is left untouched)."""
    if group_size(group) == 1:
        return x
    out = x.contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def all_gather_last(x: Tensor, group: dist.ProcessGroup | None, dim: int = -1) -> Tensor:
    """Concatenate x from every member of `group` along `dim`, in rank order."""
    n = group_size(group)
    if n == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def local_chunk(x: Tensor, group: dist.ProcessGroup | None, dim: int = -1) -> Tensor:
    """This rank's chunk of x split evenly along `dim` over `group`."""
    n = group_size(group)
    if n == 1:
        return x
    if x.shape[dim] % n:
        raise ValueError(f"cannot split size {x.shape[dim]} (dim {dim}) into {n} equal chunks")
    return x.chunk(n, dim=dim)[group_rank(group)].contiguous()


class _CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return all_reduce_sum(grad, ctx.group), None


class _ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _GatherFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return all_gather_last(x, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return local_chunk(grad, ctx.group), None


def copy_to_parallel(x: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """f: identity forward, all-reduce of the gradient backward (enters a parallel region)."""
    return x if group_size(group) == 1 else _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """g: all-reduce forward, identity backward (leaves a parallel region with partial sums)."""
    return x if group_size(group) == 1 else _ReduceFromParallel.apply(x, group)


def gather_from_parallel(x: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """All-gather the last dimension forward; the local chunk of the gradient backward."""
    return x if group_size(group) == 1 else _GatherFromParallel.apply(x, group)
