"""Blockwise long-input kernels equal dense attention under the equivalent bool mask."""

import pytest
import torch

from attnlab.nn.kernels import attention_weights
from attnlab.nn.kernels.bigbird import bigbird_attention, bigbird_mask, bigbird_table
from attnlab.nn.kernels.longformer import longformer_attention, longformer_mask
from attnlab.nn.kernels.sliding_window import sliding_window_attention
from attnlab.nn.kernels.sparse import global_index
from attnlab.nn.masks import causal_mask, window_mask
from tests.nn.gradcheck import assert_directional_derivatives

ATOL = 1e-5


def dense(q, k, v, mask, bias=None):
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    return attention_weights(scores, mask) @ v


def qkv(B, H, T, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g).requires_grad_() for _ in range(3)]


def padding(B, T):
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[1, T - T // 3:] = False  # the second row is right-padded
    return keep[:, None, None, :]


GLOBALS = torch.tensor([0, 5, 33])

# name -> (kernel(q, k, v, causal, **kw), dense mask(T, causal))
KERNELS = {
    "sliding_window": (lambda q, k, v, causal, **kw: sliding_window_attention(q, k, v, window=21, causal=causal, **kw),
                       lambda T, causal: window_mask(T, 21, causal=causal)),
    "sliding_window_tile8": (
        lambda q, k, v, causal, **kw: sliding_window_attention(q, k, v, window=10, causal=causal, tile=8, **kw),
        lambda T, causal: window_mask(T, 10, causal=causal)),
    "longformer": (lambda q, k, v, causal, **kw: longformer_attention(q, k, v, window=7, global_tokens=GLOBALS,
                                                                      causal=causal, **kw),
                   lambda T, causal: longformer_mask(T, 7, GLOBALS, causal=causal)),
    "bigbird": (lambda q, k, v, causal, **kw: bigbird_attention(q, k, v, block=16, window_blocks=1, global_blocks=1,
                                                                random_blocks=2, seed=7, causal=causal, **kw),
                lambda T, causal: bigbird_mask(T, 16, 1, 1, 2, 7, causal=causal)),
}


def assert_same(out, ref, inputs):
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(ref, inputs, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T", [64, 203, 512])
def test_kernel_equals_dense_with_padding(name, causal, T):
    kernel, pattern = KERNELS[name]
    q, k, v = qkv(2, 2, T)
    mask = padding(2, T)
    out = kernel(q, k, v, causal, mask=mask)
    ref = dense(q, k, v, pattern(T, causal) & mask)
    assert_same(out, ref, (q, k, v))


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_with_full_mask_and_learned_bias(name):
    """A decoder's (B, 1, T, T) causal-and-padding mask and a T5-like bias with a gradient."""
    kernel, pattern = KERNELS[name]
    T = 96
    q, k, v = qkv(2, 3, T, seed=1)
    mask = causal_mask(T)[None, None] & padding(2, T)
    bias = (torch.randn(1, 3, T, T) * 0.5).requires_grad_()
    out = kernel(q, k, v, True, mask=mask, bias=bias)
    ref = dense(q, k, v, pattern(T, True) & mask, bias)
    assert_same(out, ref, (q, k, v, bias))


def test_a_query_with_no_key_gets_zeros():
    q, k, v = qkv(1, 1, 64)
    mask = torch.zeros(1, 1, 1, 64, dtype=torch.bool)
    out = sliding_window_attention(q, k, v, window=4, mask=mask)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_dropout_backward_replays_the_forward_mask():
    q, k, v = (torch.randn(1, 2, 40, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        torch.manual_seed(0)  # the kernel draws its dropout seed from the global generator
        return longformer_attention(q, k, v, window=5, global_tokens=torch.tensor([3]), dropout_p=0.3, tile=8)

    assert not torch.equal(f(q, k, v), longformer_attention(q, k, v, window=5, global_tokens=torch.tensor([3]),
                                                            tile=8))
    # directional derivatives by central differences, against the analytic gradient
    assert_directional_derivatives(f, (q, k, v), directions=3)


# ---- the patterns' promises ---------------------------------------------------------------------


def _dependence(out_rows, inputs_v):
    """Which value positions (B, T) the given output rows depend on (nonzero gradient)."""
    (grad,) = torch.autograd.grad(out_rows.sum(), inputs_v, retain_graph=True)
    return grad.abs().sum((1, 3)) > 0


@pytest.mark.parametrize("causal", [False, True])
def test_longformer_global_tokens_see_and_are_seen_by_every_position(causal):
    T = 96
    q, k, v = qkv(2, 2, T, seed=3)
    flags = torch.zeros(2, T, dtype=torch.bool)
    flags[0, [0, 40]] = True  # per-row global tokens, as from `input_ids == cls_id`
    flags[1, [10]] = True
    out = longformer_attention(q, k, v, window=3, global_tokens=flags, causal=causal)
    for b, g in [(0, 0), (0, 40), (1, 10)]:
        seen = _dependence(out[b, :, g], v)[b]
        expected = torch.arange(T) <= g if causal else torch.ones(T, dtype=torch.bool)
        assert torch.equal(seen, expected), (b, g)  # the global query sees every allowed key
        nudged = v.detach().clone()
        nudged[b, :, g] += 1.0
        moved = longformer_attention(q, k, nudged, window=3, global_tokens=flags, causal=causal) - out
        later = torch.arange(T) >= g if causal else torch.ones(T, dtype=torch.bool)
        assert torch.equal(moved[b].abs().sum((0, 2)) > 0, later), (b, g)  # every query sees the global key
    ref = dense(q, k, v, longformer_mask(T, 3, flags, causal=causal))
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)


def test_sliding_window_sees_exactly_its_window():
    T, w = 80, 6
    q, k, v = qkv(1, 1, T, seed=4)
    out = sliding_window_attention(q, k, v, window=w)
    for i in (0, 17, 79):
        seen = _dependence(out[0, :, i], v)[0]
        assert torch.equal(seen, (torch.arange(T) - i).abs() <= w)


def test_bigbird_random_blocks_follow_the_seed():
    a = bigbird_table(1024, 32, 1, 1, 3, seed=11, causal=False)
    assert torch.equal(a, bigbird_table(1024, 32, 1, 1, 3, seed=11, causal=False))
    assert not torch.equal(a, bigbird_table(1024, 32, 1, 1, 3, seed=12, causal=False))
    for row in a.tolist():  # each key block once
        real = [j for j in row if j != a.shape[0]]
        assert len(real) == len(set(real))
    # the kernel uses the seed's blocks: equal to that seed's mask, not another's
    T = 256
    q, k, v = qkv(1, 2, T, seed=5)
    out = bigbird_attention(q, k, v, block=16, random_blocks=2, seed=1)
    torch.testing.assert_close(out, dense(q, k, v, bigbird_mask(T, 16, 1, 1, 2, 1)), atol=ATOL, rtol=1e-4)
    assert (out - dense(q, k, v, bigbird_mask(T, 16, 1, 1, 2, 2))).abs().max() > 1e-3


def test_causal_bigbird_pattern_is_the_same_for_every_prefix():
    full = bigbird_mask(256, 16, 1, 1, 2, 5, causal=True)
    assert torch.equal(bigbird_mask(100, 16, 1, 1, 2, 5, causal=True), full[:100, :100])
    assert torch.equal(full, full & causal_mask(256))


def test_bigbird_global_blocks_see_and_are_seen_everywhere():
    mask = bigbird_mask(128, 16, 1, 2, 1, 0)
    assert mask[:32].all() and mask[:, :32].all()


def test_mask_builders_reject_bad_arguments():
    with pytest.raises(ValueError, match="window"):
        window_mask(8, -1)
    with pytest.raises(ValueError, match="block"):
        bigbird_table(8, 0, 1, 1, 1, 0, False)
    with pytest.raises(ValueError, match="global"):
        global_index(torch.zeros(2, 3, dtype=torch.bool), 4, 2)
    with pytest.raises(ValueError, match="q, k, v"):
        q, k, v = qkv(1, 1, 8)
        sliding_window_attention(q, k[:, :, :4], v, window=2)
