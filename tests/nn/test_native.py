"""The compiled kernels (`attnlab.nn.native`) against their PyTorch references and exact
integer arithmetic, and the ways a machine can lack them: no compiler, a failing build, the
switch off. Each fallback case runs in a fresh process (the kernels load once per process),
with an empty $ATTNLAB_CACHE so that it must build.

The int8 product's reference is bit-exact by construction (its integer sums are exact in
float64), so the kernel must equal it bit for bit; bf16 sums in fp32 in a different order, so it
is held to one bf16 rounding of the exact product.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from attnlab.decoding.quantize import int8_per_channel
from attnlab.nn import native

U_BF16 = 2.0 ** -8


@pytest.fixture(scope="module")
def ops():
    built = native.kernels()
    assert built is not None, "the native kernels did not build on this machine (see the warning)"
    return built


def _int8_case(N, K, O, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, s = int8_per_channel(torch.randn(O, K, generator=g))
    x = torch.randn(N, K, generator=g) * torch.rand(N, 1, generator=g) * 10
    return x, q, s, torch.randn(O, generator=g)


# widths with tails after the 32-column blocks, and beyond one int32 lane's 8,192 columns
# (and rows in and beyond the blocks of 4 that a prompt's rows take)
SHAPES = [(1, 384, 1152), (3, 100, 7), (4, 1024, 300), (1, 37, 5), (2, 9000, 3), (5, 64, 33), (1, 20001, 2),
          (7, 31, 1), (9, 9000, 3)]


@pytest.mark.parametrize("N,K,O", SHAPES)
def test_int8_kernel_is_its_reference_bit_for_bit(ops, N, K, O):
    x, q, s, b = _int8_case(N, K, O)
    x[0, :5] = 0
    for bias in (b, None):
        y = ops.int8_rows(x, q, s, bias)
        assert torch.equal(y, native.int8_rows_reference(x, q, s, bias))
        exact = x.double() @ (q.double() * s.double()[:, None]).t() + (b.double() if bias is not None else 0)
        # each activation moved by at most half its int16 step
        reach = x.abs().amax(1, keepdim=True).double() / 32767 / 2 * (q.double().abs().sum(1) * s.double())
        assert bool(((y.double() - exact).abs() <= reach + 1e-6 * (1 + exact.abs())).all())


def test_int8_sums_are_exact_where_int32_would_overflow(ops):
    """All activations at their row's maximum, all weights 127, 20,001 columns: 32767 * 127 *
    20001 = 8.3e10 overflows int32 many times over; the result is the exact product, for one row
    and for rows taken four at a time."""
    K = 20001
    q = torch.full((2, K), 127, dtype=torch.int8)
    q[1] = -127
    for rows in (1, 5):
        x = torch.full((rows, K), 3.0)
        y = ops.int8_rows(x, q, torch.ones(2), None)
        assert y.tolist() == [[3.0 * 127 * K, -3.0 * 127 * K]] * rows


def test_int8_rows_of_zeros_inf_and_nan(ops):
    q = torch.randint(-127, 128, (4, 64), dtype=torch.int8)
    s, b = torch.rand(4), torch.randn(4)
    x = torch.randn(4, 64)
    x[1] = 0
    x[2, 3] = float("nan")
    x[3, 5] = float("inf")
    y = ops.int8_rows(x, q, s, b)
    assert torch.equal(y[1], b), "a row of zeros gives the bias"
    assert bool(y[2:].isnan().all()), "a row holding NaN or inf gives NaN"
    assert bool(native.int8_rows_reference(x, q, s, b)[2:].isnan().all())
    assert torch.equal(y[:2], native.int8_rows_reference(x, q, s, b)[:2])


def test_the_same_bits_on_any_number_of_threads(ops):
    x, q, s, b = _int8_case(3, 1024, 4096)
    xb, w = x.bfloat16(), torch.randn(4096, 1024).bfloat16()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.int8_rows(x, q, s, b), ops.bf16_rows(xb, w)
        torch.set_num_threads(2)
        two = ops.int8_rows(x, q, s, b), ops.bf16_rows(xb, w)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.mark.parametrize("N,K,O", [(1, 384, 1152), (3, 100, 7), (4, 1024, 300), (1, 37, 5), (2, 33, 65)])
def test_bf16_kernel_within_one_rounding_of_the_exact_product(ops, N, K, O):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(N, K, generator=g).bfloat16(), torch.randn(O, K, generator=g).bfloat16()
    y = ops.bf16_rows(x, w)
    assert y.dtype == torch.bfloat16 and y.shape == (N, O)
    exact = x.double() @ w.double().t()
    assert bool(((y.double() - exact).abs() <= U_BF16 * exact.abs() + 1e-5 * (1 + exact.abs())).all())
    close = native.bf16_rows_reference(x, w)
    assert (y != close).float().mean() < 0.01, "the fp32 sums' order changes the rounding of a few values at most"


def test_bad_input_is_refused_naming_the_problem(ops):
    q = torch.zeros(3, 8, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="x has|x \\(N, K\\) and q \\(O, K\\)"):
        ops.int8_rows(torch.zeros(1, 9), q, torch.ones(3), None)
    with pytest.raises(RuntimeError, match="x fp32, q int8 and scale fp32"):
        ops.int8_rows(torch.zeros(1, 8, dtype=torch.float64), q, torch.ones(3), None)
    with pytest.raises(RuntimeError, match="scale and bias need 3 fp32 values"):
        ops.int8_rows(torch.zeros(1, 8), q, torch.ones(2), None)
    with pytest.raises(RuntimeError, match="x and w bf16"):
        ops.bf16_rows(torch.zeros(1, 8), torch.zeros(3, 8, dtype=torch.bfloat16))


def test_the_dispatchers_take_the_kernel_on_a_cpu(ops, monkeypatch):
    x, q, s, b = _int8_case(2, 96, 40)
    calls = []
    real = native.int8_rows_reference
    monkeypatch.setattr(native, "int8_rows_reference", lambda *a: calls.append(a) or real(*a))
    assert torch.equal(native.int8_rows(x, q, s, b), ops.int8_rows(x, q, s, b))
    assert not calls, "the kernel ran, not the reference"
    monkeypatch.setattr(native, "kernels", lambda: None)
    assert torch.equal(native.int8_rows(x, q, s, b), ops.int8_rows(x, q, s, b))
    assert len(calls) == 1


# ---------------------------------------------------------------- machines without the kernels

PROBE = textwrap.dedent("""
    import warnings, torch
    warnings.simplefilter("always")
    from attnlab.decoding import generate, quantize_weights
    from attnlab.decoding.quantize import int8_per_channel
    from attnlab import ModelConfig, build_model
    from attnlab.nn import native
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = native.kernels(), native.kernels()
        torch.manual_seed(0)
        model = build_model(ModelConfig(arch="decoder", vocab_size=40, d_model=32, num_layers=1, num_heads=2,
                                        d_ff=64)).eval()
        ids = torch.tensor([[3, 4, 5]])
        out = generate(quantize_weights(model, "int8"), ids, 5)
        x, (q, s) = torch.randn(2, 96), int8_per_channel(torch.randn(7, 96))
        same = torch.equal(native.int8_rows(x, q, s, None), native.int8_rows_reference(x, q, s, None))
    print("KERNELS", first is None, second is None, out.shape[1], same)
    for w in caught:
        print("WARNING", w.category.__name__, str(w.message).replace("\\n", " "))
""")


def _probe(tmp_path, **env):
    environ = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"), **env}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=environ, timeout=300)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stdout.splitlines() if line.startswith("WARNING")]
    return done.stdout, warned, done.stderr


def test_no_compiler_takes_the_reference_after_one_warning(tmp_path):
    out, warned, _ = _probe(tmp_path, CXX=str(tmp_path / "no-such-compiler"))
    assert "KERNELS True True 8 True" in out
    assert len(warned) == 1, warned
    assert "no C++ compiler found" in warned[0] and "no-such-compiler" in warned[0]
    assert "slower PyTorch path" in warned[0]


def test_a_failing_build_warns_with_its_exit_and_leaves_nothing_that_looks_built(tmp_path):
    out, warned, err = _probe(tmp_path, CXX="false")  # a "compiler" that exits 1
    assert "KERNELS True True 8 True" in out
    assert len(warned) == 1 and "exited with 1" in warned[0], warned
    assert "compiling the native kernels" in err
    built = [p.name for p in (tmp_path / "cache" / "native").rglob("*") if p.is_file()]
    assert built == [], built


def test_switched_off_without_a_warning(tmp_path):
    out, warned, err = _probe(tmp_path, ATTNLAB_NATIVE="0")
    assert "KERNELS True True 8 True" in out and warned == []
    assert not (tmp_path / "cache" / "native").exists()


THREADS = textwrap.dedent("""
    import threading, warnings
    warnings.simplefilter("error")
    from attnlab.nn import native
    got = []
    threads = [threading.Thread(target=lambda: got.append(native.kernels())) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print("GOT", len(got), sum(k is not None for k in got))
""")


def test_a_build_is_made_once_and_reused(tmp_path, ops):
    """A fresh cache and eight threads asking at once (a server's first requests): one build, said
    once, and every thread gets the kernels (no second load of the library failing into the
    fallback); a second process loads the cached library without compiling."""
    environ = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, env=environ, timeout=300)
    assert done.returncode == 0 and "GOT 8 8" in done.stdout, (done.stdout, done.stderr)
    assert done.stderr.count("compiling the native kernels") == 1, done.stderr
    libraries = list((tmp_path / "cache" / "native").rglob("*.so"))
    assert len(libraries) == 1 and not libraries[0].name.startswith(".")
    again, warned, err = _probe(tmp_path)
    assert "KERNELS False False 8 True" in again and warned == [] and "compiling" not in err


def test_cxx_names_the_compiler_and_may_carry_words_after_it(monkeypatch, tmp_path):
    """`$CXX` as build tools read it: its first word found on PATH, the rest (a wrapper's compiler,
    flags) passed on; missing, `c++`; a first word not on PATH, no compiler."""
    import shutil

    monkeypatch.setenv("CXX", "g++ -DNDEBUG")
    assert native._compiler() == [shutil.which("g++"), "-DNDEBUG"]
    assert native._command(native._compiler(), tmp_path / "x.so")[:2] == [shutil.which("g++"), "-DNDEBUG"]
    monkeypatch.delenv("CXX")
    assert native._compiler() == [shutil.which("c++")]
    monkeypatch.setenv("CXX", str(tmp_path / "absent") + " -O2")
    assert native._compiler() is None

