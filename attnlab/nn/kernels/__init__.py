"""Attention kernels: the computation softmax(scale q k^T + bias, mask) v (or an approximation of
it), apart from the projections around it. One file per kernel; `KERNELS` is the registry from
the config string `attention.kernel` to the kernel class.

Adding a kernel: a file named after it with a `Kernel` subclass (its `name`, `supports`,
`Options`, `build`, `forward`; `dense_mask` for a sparse pattern, `cost` when it computes less
than dense attention), and its entry in `KERNELS` (with the import); see `base` for the call and
`tests/nn/kernels/test_registry.py` for a kernel added in a test. Nothing else names a kernel:
the config, the builder, the attention module, tensor parallelism and the cost counters read
`supports` (and `cost`).
"""

from __future__ import annotations

from typing import Any

from attnlab.nn.kernels.auto import AutoKernel
from attnlab.nn.kernels.base import Kernel, KernelCost, KernelSetup, NoOptions, Supports, TokenIds
from attnlab.nn.kernels.bigbird import BigBirdKernel
from attnlab.nn.kernels.eager import EagerKernel, attention_weights, eager_attention
from attnlab.nn.kernels.linformer import LinformerKernel
from attnlab.nn.kernels.local_block import LocalBlockKernel
from attnlab.nn.kernels.longformer import LongformerKernel
from attnlab.nn.kernels.memory_compressed import MemoryCompressedKernel
from attnlab.nn.kernels.sdpa import SdpaKernel, sdpa_attention
from attnlab.nn.kernels.sliding_window import SlidingWindowKernel

KERNELS: dict[str, type[Kernel]] = {
    "auto": AutoKernel,
    "eager": EagerKernel,
    "sdpa": SdpaKernel,
    "sliding_window": SlidingWindowKernel,
    "longformer": LongformerKernel,
    "bigbird": BigBirdKernel,
    "linformer": LinformerKernel,
    "local_block": LocalBlockKernel,
    "memory_compressed": MemoryCompressedKernel,
}


def kernel_class(name: str) -> type[Kernel]:
    """The kernel registered as `name`.

    Raises:
        ValueError: an unknown name, listing the registered ones.
    """
    if name not in KERNELS:
        raise ValueError(f"attention.kernel={name!r} is not one of {', '.join(KERNELS)}")
    return KERNELS[name]


def build_kernel(name: str, options: Any = None, setup: KernelSetup | None = None) -> Kernel:
    """The kernel `name` of one layer, from its options (a mapping or its `Options`; None = the
    defaults) and the layer's `setup` (None: one head of the default size, layer 0)."""
    cls = kernel_class(name)
    if options is None or isinstance(options, dict):
        options = cls.Options(**(options or {}))
    return cls.build(options, setup or KernelSetup(num_heads=1, head_dim=1))


__all__ = ["KERNELS", "Kernel", "KernelCost", "KernelSetup", "NoOptions", "Supports", "TokenIds", "attention_weights",
           "build_kernel", "eager_attention", "kernel_class", "sdpa_attention"]
