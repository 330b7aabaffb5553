"""benchmarks/bench_long_attention.py: the matrix-product floor it reports for the sliding window
counts the FLOP that the band kernel really runs, every matrix product seen at dispatch (torch's
own FLOP counter misses the in-place `baddbmm_` the kernel writes most products with)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.nn.kernels.band import band_attention

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))  # it imports its sibling `machine`
    try:
        spec = importlib.util.spec_from_file_location("bench_long_attention", BENCHMARKS / "bench_long_attention.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


class ProductFlops(TorchDispatchMode):
    """2 m n k per product of every mm / bmm (plain, add-, in-place or out=) that runs."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__.rstrip("_")
        if name in ("mm", "bmm", "addmm", "baddbmm"):
            a, b = args[-2], args[-1]  # the two factors come last
            batch = a.shape[0] if a.dim() == 3 else 1
            self.flops += 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
        elif name in ("matmul", "linear", "addbmm", "einsum", "addmv", "mv", "dot"):
            raise AssertionError(f"uncounted product {func}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("T, tile", [(1024, 32), (1000, 32), (1024, 64), (640, 16)])
def test_the_floor_counts_the_band_kernels_products(bench, T, tile):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, bench.H, T, bench.DH, requires_grad=True) for _ in range(3))
    with ProductFlops() as counter:
        out = band_attention(q, k, v, window=bench.WINDOW, causal=True, tile=tile, scale=bench.DH ** -0.5)
        out.backward(torch.randn_like(out))
    assert bench.band_flops(T, tile) == counter.flops


def test_the_tile_is_the_kernels_default_for_today_and_the_baseline(bench):
    from attnlab.nn.kernels.sparse import default_tile

    assert bench.band_tile() == default_tile(bench.WINDOW, banded=True) == 32
