"""Compiled CPU kernels where PyTorch has none fast enough, built on first use and cached.

Two sources, built together into one library (`kernels.cpp` includes both). `weight_only.cpp`
holds the two products of weight-only decoding (`attnlab.decoding.quantize`): rows of
activations against a matrix stored as int8 or bf16, reading each weight once and widening it in
registers (AVX2 where the CPU has it, else plain C++), so that a decoding step streams 1 or 2
bytes per weight from memory instead of 4.
`band.cpp` fuses the elementwise passes of the banded attention kernel
(`attnlab.nn.kernels.band`; `band_softmax_`, `band_weights`, its docstring and the source say
what they compute): each reads a chunk's scores once, where PyTorch would take one pass per
operation. Output rows are split among torch's own intra-op threads. What the products compute,
kernel or not:

    int8_rows(x, q, s, b):  y[n, o] = fp32(sum_k xq[n, k] q[o, k]) * sx[n] * s[o] + b[o]
        x (N, K) fp32, q (O, K) int8, s and b (O,) fp32; each row of x in int16,
        sx[n] = max_k |x[n, k]| / 32767 (1 for a row of zeros), xq = round(x / sx);
        the sum is exact (integers), so it does not depend on the order of summing;
        a row of x holding inf or NaN gives a row of NaN
    bf16_rows(x, w):        y = bf16(x @ w^T), x (N, K) and w (O, K) bf16, summed in fp32

Each fp32 operation rounds once (the compiler may not fuse a multiply and an add), so the int8
product of the kernel and of its reference are the same bits; bf16 agree up to the order of
the fp32 sums.

Building: the first process that needs them compiles the sources with the machine's C++
compiler (`$CXX`, else `c++`) against this torch's headers, once (about 15 s), into
`$ATTNLAB_CACHE/native/<key>/` (default `~/.cache/attnlab`); the key hashes the sources, the
flags, the compiler and the torch version, so a new torch or a new source builds afresh. The
library is written under a temporary name and renamed when complete, so an interrupted build
leaves nothing that looks finished. With no compiler or a failed build, `kernels()` is None
after one warning, and `int8_rows` / `bf16_rows` take the PyTorch references, the band kernel
its PyTorch passes (slower; a GPU tensor takes them too); `ATTNLAB_NATIVE=0` chooses that
without a warning.

    from attnlab.nn import native
    y = native.int8_rows(x, q, scale, bias)     # the kernel where it is built, else the reference
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.io.cache import cache_dir
from attnlab.io.files import atomic_file

SOURCES = tuple(Path(__file__).with_name(name) for name in ("weight_only.cpp", "band.cpp", "simd.h"))
UNIT = Path(__file__).with_name("kernels.cpp")  # includes the sources: torch's headers parsed once
_DISABLE = "ATTNLAB_NATIVE"  # "0": never build or load, take the references (no warning)


INT16_MAX = 32767
_EXACT_CHUNK_BYTES = 64 << 20  # fp64 weights converted at a time by the int8 reference


def int8_rows(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """The int8 product (module docstring): the compiled kernel for CPU tensors where it is
    built, else `int8_rows_reference`; the same bits either way. x (N, K) fp32 -> (N, O) fp32."""
    ops = kernels() if x.device.type == "cpu" else None
    if ops is None:
        return int8_rows_reference(x, q, scale, bias)
    return ops.int8_rows(x.float().contiguous(), q, scale, bias)


def int8_rows_reference(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """The int8 product in PyTorch: the integer sums in float64 (exact while below 2^53, that is
    for any K up to 2^53 / (32767 * 127) = 2.2e9), the same fp32 operations after."""
    top = x.abs().amax(dim=1, keepdim=True)
    sx = torch.where(top > 0, top / INT16_MAX, torch.ones_like(top))
    xq = torch.round(x / sx).clamp_(-INT16_MAX, INT16_MAX).double()
    rows = max(1, _EXACT_CHUNK_BYTES // (8 * q.shape[1]))
    sums = torch.cat([F.linear(xq, q[i:i + rows].double()) for i in range(0, q.shape[0], rows)], dim=1)
    y = sums.float() * sx * scale
    return y + bias if bias is not None else y


def bf16_rows(x: Tensor, w: Tensor) -> Tensor:
    """The bf16 product (module docstring): the compiled kernel for CPU tensors where it is
    built, else `bf16_rows_reference`. x (N, K) bf16 -> (N, O) bf16."""
    ops = kernels() if x.device.type == "cpu" else None
    if ops is None:
        return bf16_rows_reference(x, w)
    return ops.bf16_rows(x.contiguous(), w)


def bf16_rows_reference(x: Tensor, w: Tensor) -> Tensor:
    """The bf16 product through fp32 BLAS: bf16 times bf16 is exact in fp32, so this equals the
    kernel up to the order of the fp32 sums."""
    return F.linear(x.float(), w.float()).to(torch.bfloat16)


def _simd_flags() -> list[str]:
    """AVX2 + FMA where torch found them on this CPU (it checks the OS enables them too)."""
    if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in ("AVX2",
                                                                                                           "AVX512"):
        return ["-mavx2", "-mfma"]
    return []


def _command(compiler: list[str], output: Path) -> list[str]:
    """The one compiler call that builds SOURCES (through UNIT) into `output` against this torch."""
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libraries = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [*compiler, "-O3", "-ffp-contract=off", "-std=c++20", "-fPIC", "-shared", "-fopenmp",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *_simd_flags(), *includes, str(UNIT),
            *[f"-L{p}" for p in libraries], *[f"-Wl,-rpath,{p}" for p in libraries],
            "-ltorch", "-ltorch_cpu", "-lc10", "-o", str(output)]


def _compiler() -> list[str] | None:
    """The C++ compiler's command: `$CXX` (its first word found on PATH; the rest, such as a
    wrapper's compiler or flags, kept), else `c++`; None when it is not found."""
    named = shlex.split(os.environ.get("CXX", "c++")) or ["c++"]
    found = shutil.which(named[0])
    return [found, *named[1:]] if found else None


def _build(compiler: list[str]) -> Path:
    """The compiled library, from the cache or built now; raises on a failed build. The library
    is written under a temporary name and renamed when whole (`atomic_file`, which also clears
    what a killed build left), so two processes building at once each leave a whole file."""
    sources = [p.read_text(encoding="utf-8") for p in (UNIT, *SOURCES)]
    key_text = "\n".join([*sources, torch.__version__, sys.version, *_command(compiler, Path("out.so"))])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    library = cache_dir() / "native" / key / "attnlab_native.so"
    if library.is_file():
        return library
    print(f"attnlab: compiling the native kernels once (about 15 s) into {library.parent}",
          file=sys.stderr, flush=True)
    with atomic_file(library) as tmp:
        done = subprocess.run(_command(compiler, tmp), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise RuntimeError(f"{shlex.join(compiler)} exited with {done.returncode}:\n{tail}")
    return library


_LOADING = threading.Lock()  # the first callers of kernels() from several threads: one builds and loads
_UNSET = object()
_ops = _UNSET  # what kernels() returns, once decided (read without the lock on every later call)


def kernels():
    """`torch.ops.attnlab_native` (`int8_rows`, `bf16_rows`, `band_softmax_`, `band_weights`, and
    `exp2_`, the band ops' exp2 for the tests), built and loaded once per process;
    None where they cannot be (one warning saying why and what runs instead) or where
    `ATTNLAB_NATIVE=0`."""
    global _ops
    if _ops is _UNSET:
        with _LOADING:
            if _ops is _UNSET:
                _ops = _load()
    return _ops


def _load():
    if os.environ.get(_DISABLE, "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        _fallback(f"no C++ compiler found (CXX={os.environ.get('CXX', 'c++')!r} is not on PATH)")
        return None
    try:
        torch.ops.load_library(str(_build(compiler)))
    except (OSError, RuntimeError) as err:
        _fallback(f"building or loading them failed: {err}")
        return None
    return torch.ops.attnlab_native


def _fallback(why: str) -> None:
    warnings.warn(f"attnlab's native kernels are unavailable, {why}; int8/bf16 decoding weights and the "
                  "sliding-window kernels' elementwise passes take the slower PyTorch path (install g++ to build "
                  f"them, or set {_DISABLE}=0 to silence this)", RuntimeWarning, stacklevel=4)


__all__ = ["INT16_MAX", "SOURCES", "UNIT", "bf16_rows", "bf16_rows_reference", "int8_rows", "int8_rows_reference",
           "kernels"]
