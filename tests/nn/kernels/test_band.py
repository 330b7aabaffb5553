"""The banded fast path (`attnlab.nn.kernels.band`) equals dense attention at its edges: chunk boundaries,
the first and last tiles, T not a multiple of the tile, T shorter than the window, global keys
and queries, BigBird's random blocks, dropout replay, and strided inputs."""

import pytest
import torch

import attnlab.nn.kernels.band_tiles as band_tiles
from attnlab.nn.kernels import attention_weights
from attnlab.nn.kernels.band import band_attention
from attnlab.nn.kernels.bigbird import bigbird_attention, bigbird_mask, bigbird_random_part, bigbird_table
from attnlab.nn.kernels.longformer import longformer_attention, longformer_mask
from attnlab.nn.kernels.sliding_window import sliding_window_attention
from attnlab.nn.masks import window_mask
from tests.nn.gradcheck import assert_directional_derivatives

ATOL = 1e-5


def dense(q, k, v, mask):
    return attention_weights(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, mask) @ v


def qkv(B, H, T, D=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def assert_same(out, ref, inputs, atol=ATOL):
    torch.testing.assert_close(out, ref, atol=atol, rtol=1e-4)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g)):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-4)


@pytest.fixture
def tiny_chunks(monkeypatch):
    """One query tile per chunk, so small T crosses many chunk boundaries."""
    monkeypatch.setattr(band_tiles, "CHUNK_ELEMENTS", 1)  # step = max(1, ...) = 1 tile
    yield


def key_padding(B, T, cut):
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[-1, T - cut:] = False
    keep[0, :2] = False  # left padding too: the first tiles' keys
    return keep


@pytest.mark.parametrize("T", [5, 37, 100])  # < tile, < window, ragged last tile
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [0, 8, 40, 4096])  # 8 = the tile; 4096: wider than any T (clamped)
def test_sliding_window_edges_equal_dense(tiny_chunks, T, causal, window):
    q, k, v = qkv(2, 2, T, seed=T + window)
    keep = key_padding(2, T, T // 3)
    out = sliding_window_attention(q, k, v, window=window, causal=causal, mask=keep[:, None, None, :], tile=8)
    ref = dense(q, k, v, window_mask(T, window, causal=causal) & keep[:, None, None, :])
    assert_same(out, ref, (q, k, v))


@pytest.mark.parametrize("chunk", [1, 1 << 19])
def test_chunking_does_not_change_results(monkeypatch, chunk):
    monkeypatch.setattr(band_tiles, "CHUNK_ELEMENTS", chunk)
    q, k, v = qkv(1, 3, 203, seed=1)
    out = sliding_window_attention(q, k, v, window=21, causal=True, tile=16)
    assert_same(out, dense(q, k, v, window_mask(203, 21, causal=True)), (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_longformer_globals_near_the_edges(tiny_chunks, causal):
    """Global tokens at the first and last position and inside the first window; one batch row
    with a padded global (never seen, never seeing) and one with none at all."""
    T = 45
    q, k, v = qkv(3, 2, T, seed=2)
    flags = torch.zeros(3, T, dtype=torch.bool)
    flags[0, [0, 3, T - 1]] = True
    flags[1, [20, T - 2]] = True
    keep = torch.ones(3, T, dtype=torch.bool)
    keep[1, T - 5:] = False  # pads the global token at T - 2
    out = longformer_attention(q, k, v, window=6, global_tokens=flags, causal=causal, tile=8,
                               mask=keep[:, None, None, :])
    ref = dense(q, k, v, longformer_mask(T, 6, flags, causal=causal) & keep[:, None, None, :])
    assert_same(out, ref, (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,block,W,G,R", [(100, 16, 1, 1, 2), (64, 8, 0, 2, 3), (30, 16, 1, 1, 3),
                                             (200, 16, 2, 0, 1)])
def test_bigbird_fast_path_equals_dense_and_the_general_kernel(tiny_chunks, causal, T, block, W, G, R):
    q, k, v = qkv(2, 2, T, seed=T + R)
    keep = key_padding(2, T, T // 4)[:, None, None, :]
    kw = dict(block=block, window_blocks=W, global_blocks=G, random_blocks=R, seed=3, causal=causal)
    out = bigbird_attention(q, k, v, mask=keep, **kw)
    assert_same(out, dense(q, k, v, bigbird_mask(T, block, W, G, R, 3, causal=causal) & keep), (q, k, v))
    # a (B, 1, T, T) mask takes the general block kernel: the two paths agree
    general = bigbird_attention(q, k, v, mask=keep.expand(2, 1, T, T), **kw)
    torch.testing.assert_close(out, general, atol=ATOL, rtol=1e-4)


def test_bigbird_random_part_lists_exactly_the_random_blocks():
    for causal in (False, True):
        table = bigbird_table(512, 16, 1, 2, 3, seed=4, causal=causal)
        nq = table.shape[0]
        part = bigbird_random_part(table, 1, 2, causal)
        for i in range(nq):
            real = [j for j in table[i].tolist() if j != nq]
            window = set(range(max(0, i - 1), (i if causal else min(nq - 1, i + 1)) + 1))
            expected = sorted(j for j in real if j not in window and j >= 2)
            assert [j for j in part[i].tolist() if j != nq] == expected
        assert part.shape[1] == 3


def test_strided_inputs_and_float64(tiny_chunks):
    """q, k, v as the heads view of a (B, T, H, Dh) projection (not contiguous), in float64."""
    B, T, H, D = 2, 50, 3, 4
    x = [torch.randn(B, T, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    q, k, v = (t.transpose(1, 2) for t in x)
    globals_ = torch.tensor([[1, 60], [49, 60]])  # 60 >= T: an empty slot
    out = band_attention(q, k, v, window=7, causal=False, tile=8, scale=D ** -0.5, global_keys=globals_,
                         global_queries=globals_)
    flags = torch.zeros(B, T, dtype=torch.bool)
    flags[0, 1] = flags[1, 49] = True
    mask = longformer_mask(T, 7, flags)  # every row has a key: a plain float64 softmax is the reference
    # (`attention_weights` takes its softmax in float32)
    scores = (q @ k.transpose(-1, -2) * D ** -0.5).masked_fill(~mask, float("-inf"))
    assert_same(out, torch.softmax(scores, -1) @ v, x, atol=1e-10)


def test_global_queries_replay_dropout():
    """Directional derivatives of the dropped-out kernel (global keys and queries, random blocks)
    by central differences, against the analytic gradient."""
    q, k, v = qkv(1, 2, 40, D=4, seed=6, dtype=torch.float64)

    def f(q, k, v):
        torch.manual_seed(0)  # the kernel draws its dropout seed from the global generator
        return bigbird_attention(q, k, v, block=8, window_blocks=1, global_blocks=1, random_blocks=2, seed=1,
                                 dropout_p=0.3)

    plain = bigbird_attention(q, k, v, block=8, window_blocks=1, global_blocks=1, random_blocks=2, seed=1)
    assert (f(q, k, v) - plain).abs().max() > 1e-3  # dropout is on, in the global rows too
    assert (f(q, k, v)[:, :, :8] - plain[:, :, :8]).abs().max() > 1e-3
    assert_directional_derivatives(f, (q, k, v), directions=2)


def test_band_attention_rejects_bad_arguments():
    q, k, v = qkv(1, 1, 16)
    with pytest.raises(ValueError, match="window_blocks"):
        band_attention(q, k, v, window=2, window_blocks=1, causal=False, tile=8, scale=1.0)
    with pytest.raises(ValueError, match="global_keys"):
        band_attention(q, k, v, window=2, causal=False, tile=8, scale=1.0, global_keys=torch.tensor([1]))
    with pytest.raises(ValueError, match="random_blocks"):
        band_attention(q, k, v, window=None, window_blocks=1, causal=False, tile=8, scale=1.0,
                       random_blocks=torch.zeros(5, 1, dtype=torch.long))


# ---- the recomputing backward: log-sum-exp, weights by key tile, gradients written once ----------------


def dense64(q, k, v, mask):
    """A float64 reference: softmax over the allowed keys (a row with none gets zeros, and no NaN
    in its gradient), times v."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), -1)
    return torch.where(mask.any(-1, keepdim=True), weights, 0.0) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,window,tile", [(203, 21, 16), (203, 64, 16), (77, 5, 4), (1000, 256, 64)])
@pytest.mark.parametrize("tiles_per_chunk", [1, 3, 1000])  # fewer tiles than the carried n - 1, more, all
def test_sliding_window_equals_dense_in_float64(monkeypatch, causal, T, window, tile, tiles_per_chunk):
    """Forward and q/k/v gradients against a float64 dense reference, tightly: odd T (a ragged last
    tile), windows a multiple of the tile and not, padding on both sides, chunk boundaries."""
    side = -(-window // tile)
    K = (side + 1 if causal else 2 * side + 1) * tile
    monkeypatch.setattr(band_tiles, "CHUNK_ELEMENTS", tiles_per_chunk * tile * K)
    q, k, v = qkv(2, 2, T, D=16, seed=T + window, dtype=torch.float64)
    keep = key_padding(2, T, T // 5)
    out = sliding_window_attention(q, k, v, window=window, causal=causal, mask=keep[:, None, None, :], tile=tile)
    ref = dense64(q, k, v, window_mask(T, window, causal=causal) & keep[:, None, None, :])
    assert_same(out, ref, (q, k, v), atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_gradcheck(tiny_chunks, causal):
    """torch.autograd.gradcheck (every input direction) in float64: window 5 in tiles of 4 (3
    tiles carried from chunk to chunk, one tile per chunk), T = 19, a padded key."""
    q, k, v = qkv(1, 2, 19, D=3, seed=9, dtype=torch.float64)
    keep = torch.ones(1, 1, 1, 19, dtype=torch.bool)
    keep[..., 4] = False

    def f(q, k, v):
        return sliding_window_attention(q, k, v, window=5, causal=causal, mask=keep, tile=4)

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles_per_chunk", [1, 2, 1000])
def test_every_output_and_gradient_row_is_written(monkeypatch, causal, tiles_per_chunk):
    """The kernel writes out, dq, dk and dv into memory it never zeroes: fill every tensor it
    allocates uninitialised with NaN, and the results must still equal dense attention."""
    monkeypatch.setattr(band_tiles, "CHUNK_ELEMENTS", tiles_per_chunk * 8 * 48)
    empty, new_empty, empty_like = torch.empty, torch.Tensor.new_empty, torch.empty_like

    def nan(x):
        return x.fill_(float("nan")) if x.is_floating_point() else x

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan(empty(*a, **kw)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **kw: nan(new_empty(self, *a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: nan(empty_like(*a, **kw)))
    q, k, v = qkv(2, 2, 61, seed=4)
    out = sliding_window_attention(q, k, v, window=20, causal=causal, tile=8)
    assert_same(out, dense(q, k, v, window_mask(61, 20, causal=causal)), (q, k, v))


def test_large_scores_stay_exact():
    """Scores of several hundred (a peaked softmax): the row maximum and the log-sum-exp keep the
    weights exact, forward and backward, and nothing overflows."""
    q, k, v = qkv(1, 2, 150, D=16, seed=5, dtype=torch.float64)
    with torch.no_grad():
        q.mul_(40)
    for causal in (False, True):
        out = sliding_window_attention(q, k, v, window=30, causal=causal, tile=16)
        assert_same(out, dense64(q, k, v, window_mask(150, 30, causal=causal)), (q, k, v), atol=1e-9)
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    out = sliding_window_attention(q32, k32, v32, window=30, causal=True, tile=16)
    out.backward(torch.ones_like(out))
    assert all(torch.isfinite(x).all() for x in (out, q32.grad, k32.grad, v32.grad))


@pytest.mark.parametrize("window,tile,causal", [(256, 64, True), (256, 64, False), (100, 64, True), (21, 16, False),
                                                (0, 8, True), (3, 8, False)])
def test_band_mask_is_added_where_the_band_masks(window, tile, causal):
    """The band mask goes only onto its ragged edge columns: every column outside them is seen by
    every query of the tile, and a window that is a multiple of the tile has less than a tile of edge per side."""
    side = -(-window // tile)
    lay = band_tiles.Layout(100, tile, side, window, causal, torch.ones(1, 100, dtype=torch.bool), torch.float32)
    edged = torch.zeros(lay.K, dtype=torch.bool)
    for lo, hi in lay.edges:
        edged[lo:hi] = True
    assert lay.band_ok[:, ~edged].all()
    if window % tile == 0 and window:  # two triangles of b (b - 1) / 2 masked scores each
        assert lay.edges == [(0, tile - 1), (lay.K - tile + 1, lay.K)]


@pytest.mark.parametrize("kernel", ["sliding_window", "bigbird"])
def test_bf16_inputs_keep_their_statistics_in_fp32(kernel):
    """bf16 q, k, v (what projections under bf16 autocast give): the row maxima, sums and
    log-sum-exp stay in fp32, so output and gradients stay within bf16's rounding of the fp32
    dense reference."""
    q, k, v = qkv(2, 2, 150, D=32, seed=8)
    if kernel == "sliding_window":
        def run(q, k, v):
            return sliding_window_attention(q, k, v, window=40, causal=True, tile=16)
        mask = window_mask(150, 40, causal=True)
    else:
        def run(q, k, v):
            return bigbird_attention(q, k, v, block=16, window_blocks=1, global_blocks=1, random_blocks=2, seed=3)
        mask = bigbird_mask(150, 16, 1, 1, 2, 3)
    g = torch.randn(2, 2, 150, 32)
    ref = dense(q, k, v, mask)
    want = torch.autograd.grad(ref, (q, k, v), g)
    low = [x.detach().bfloat16().requires_grad_() for x in (q, k, v)]
    out = run(*low)
    got = torch.autograd.grad(out, low, g.bfloat16())
    assert out.dtype == torch.bfloat16
    for a, b in zip((out, *got), (ref, *want)):
        assert (a.float() - b).abs().max() <= 0.02 * b.abs().max()


def test_dropout_under_bf16_follows_the_fp32_draws():
    """The keep-scales take the inputs' dtype (bf16 dropout used to fail on a float32 mask): the
    same seed drops the same weights as in fp32, global rows included."""
    q, k, v = qkv(1, 2, 90, D=16, seed=11)

    def run(q, k, v):
        torch.manual_seed(0)  # the kernel draws its dropout seed from the global generator
        return bigbird_attention(q, k, v, block=16, window_blocks=1, global_blocks=1, random_blocks=1, seed=2,
                                 dropout_p=0.3)

    want = run(q, k, v)
    low = [x.detach().bfloat16().requires_grad_() for x in (q, k, v)]
    got = run(*low)
    assert (got.float() - want).abs().max() <= 0.02 * want.abs().max()
    got.sum().backward()
    assert all(torch.isfinite(x.grad.float()).all() for x in low)
