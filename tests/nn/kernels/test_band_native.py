"""The band kernel's fused elementwise passes (`attnlab.nn.native`, band.cpp) against their
PyTorch form: the ops alone (exp2 against float64, the softmax and the weights against the
separate torch operations), and the whole kernel with the fused passes and without them, both
against dense attention. Where they apply (fp32, CPU, the window alone, no dropout) and where
they do not, seen in the profiler."""

import pytest
import torch
from torch.profiler import profile

import attnlab.nn.kernels.band as band
import attnlab.nn.kernels.band_tiles as band_tiles
from attnlab.nn import native
from attnlab.nn.kernels.longformer import longformer_attention
from attnlab.nn.kernels.sliding_window import sliding_window_attention
from attnlab.nn.masks import window_mask
from tests.nn.kernels.test_band import assert_same, dense, key_padding, qkv

ULP = 2.0 ** -23  # fp32's spacing at 1, relative


@pytest.fixture(scope="module")
def ops():
    built = native.kernels()
    assert built is not None, "the native kernels did not build on this machine (see the warning)"
    return built


@pytest.fixture(params=["fused", "pytorch"])
def passes(request, monkeypatch):
    """Each kernel test runs twice: with the fused passes, and with `_fused_ops` answering None
    (the PyTorch passes, as on a machine without a compiler)."""
    if request.param == "pytorch":
        monkeypatch.setattr(band, "_fused_ops", lambda *args: None)
    else:
        assert native.kernels() is not None
    return request.param


@pytest.mark.parametrize("n", [100_000, 100_007, 7])  # 8 at a time; then a scalar tail of 7; the tail alone
def test_exp2_is_within_one_ulp_of_float64(ops, n):
    x = torch.linspace(-126, 127.4, n)
    y = ops.exp2_(x.clone())
    exact = torch.exp2(x.double())
    assert bool(((y.double() - exact).abs() <= ULP * exact).all())


def test_exp2_edges(ops):
    x = torch.tensor([float("nan"), float("-inf"), -1e38, -126.5, float("inf"), 128.0, 127.6, 0.0, -1.0])
    for y in (ops.exp2_(x.clone()), ops.exp2_(x[:7].clone())):  # 8 at once, then the scalar tail
        assert torch.isnan(y[0]) and y[1] == 0 and y[2] == 0 and y[3] == 0
        assert torch.isinf(y[4]) and torch.isinf(y[5]) and torch.isinf(y[6])
    assert ops.exp2_(x.clone())[7:].tolist() == [1.0, 0.5]


def _scores(c=3, b=8, K=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(c, b, K, generator=g) * 8
    bias = torch.where(torch.rand(b, K, generator=g) < 0.3, torch.finfo(torch.float32).min / 4, 0.0)
    bias[2] = torch.finfo(torch.float32).min / 4  # a row the band masks entirely
    return s, bias


def test_band_softmax_is_max_exp2_and_sum(ops):
    s, bias = _scores()
    top, total = torch.empty(3, 8, 1), torch.empty(3, 8, 1)
    x = s.clone()
    ops.band_softmax_(x, bias, top, total)
    ref = s + bias
    m = ref.amax(-1, keepdim=True)
    e = torch.exp2((ref - m).double())
    assert torch.equal(top, m)
    torch.testing.assert_close(x.double(), e, rtol=2 * ULP, atol=0)
    torch.testing.assert_close(total.double(), e.sum(-1, keepdim=True), rtol=1e-6, atol=0)


def test_band_weights_write_their_strided_views_only(ops):
    """p and dS go into pitched buffers (`band_tiles.Pitched`): rows K + 1 apart per tile, the
    spare values between them never written."""
    s, bias = _scores(seed=1)
    dp = torch.randn(3, 8, 40)
    pbuf, dsbuf = torch.full((3 * 8 * 41,), 7.0), torch.full((3 * 8 * 41,), 7.0)
    p, ds = (buf.as_strided((3, 8, 40), (8 * 41, 40, 1)) for buf in (pbuf, dsbuf))
    ops.band_weights(s, bias, dp, p, ds)
    exact = torch.exp2((s + bias).double())
    torch.testing.assert_close(p.double(), exact, rtol=2 * ULP, atol=0)
    torch.testing.assert_close(ds, p * dp, rtol=0, atol=0)
    for buf in (pbuf, dsbuf):  # 8 values after each tile of 8 x 40
        assert bool((buf.view(3, 8 * 41)[:, 8 * 40:] == 7.0).all())


def test_bad_inputs_are_refused_by_name(ops):
    s, bias = _scores()
    top, total = torch.empty(24), torch.empty(24)
    with pytest.raises(RuntimeError, match="scores must be float32"):
        ops.band_softmax_(s.double(), bias, top, total)
    with pytest.raises(RuntimeError, match="bias must be a contiguous float32"):
        ops.band_softmax_(s, bias[:4], top, total)
    with pytest.raises(RuntimeError, match="contiguous in its last dimension"):
        ops.band_softmax_(s.transpose(1, 2).contiguous().transpose(1, 2), bias, top, total)
    with pytest.raises(RuntimeError, match="max and sum"):
        ops.band_softmax_(s, bias, torch.empty(23), total)
    with pytest.raises(RuntimeError, match="dp must be"):
        ops.band_weights(s, bias, torch.empty(3, 8, 41), s.clone(), s.clone())


@pytest.mark.parametrize("T", [37, 100, 300])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [0, 8, 40, 300])
@pytest.mark.parametrize("padded", [False, True])
def test_sliding_window_equals_dense_either_way(passes, monkeypatch, T, causal, window, padded):
    monkeypatch.setattr(band_tiles, "CHUNK_ELEMENTS", 1 << 10)  # several chunks
    q, k, v = qkv(2, 2, T, seed=T + window)
    keep = key_padding(2, T, T // 3) if padded else torch.ones(2, T, dtype=torch.bool)
    out = sliding_window_attention(q, k, v, window=window, causal=causal, mask=keep[:, None, None, :])
    assert_same(out, dense(q, k, v, window_mask(T, window, causal=causal) & keep[:, None, None, :]), (q, k, v))


def test_the_fused_and_pytorch_passes_agree(monkeypatch):
    q, k, v = qkv(1, 3, 700, D=32, seed=3)
    g = torch.randn(1, 3, 700, 32)
    runs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(band, "_fused_ops", lambda *args: None)
        out = sliding_window_attention(q, k, v, window=256, causal=True)
        runs.append([out, *torch.autograd.grad(out, (q, k, v), g)])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _native_calls(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages() if e.key.startswith("attnlab_native::")}


def test_where_the_fused_passes_run(ops):
    q, k, v = qkv(1, 2, 200, seed=4)
    g = torch.randn(1, 2, 200, 8)

    def run(fn, *inputs):
        return lambda: torch.autograd.grad(fn(*inputs), inputs, g[..., :inputs[0].shape[-1]].to(inputs[0].dtype))

    window = lambda q, k, v: sliding_window_attention(q, k, v, window=40, causal=True)  # noqa: E731
    assert _native_calls(run(window, q, k, v)) == {"attnlab_native::band_softmax_", "attnlab_native::band_weights"}
    # global keys share the softmax with the window; dropout and other dtypes keep the PyTorch passes
    glob = lambda q, k, v: longformer_attention(q, k, v, window=40, global_tokens=torch.tensor([0]))  # noqa: E731
    assert _native_calls(run(glob, q, k, v)) == set()
    drop = lambda q, k, v: sliding_window_attention(q, k, v, window=40, dropout_p=0.1)  # noqa: E731
    assert _native_calls(run(drop, q, k, v)) == set()
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    assert _native_calls(run(window, q64, k64, v64)) == set()
