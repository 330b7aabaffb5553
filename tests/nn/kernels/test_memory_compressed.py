"""Local attention in blocks and memory-compressed attention (Liu et al. 2018): each equals its
reference (values and gradients), is causal in a decoder, decodes through a KV cache exactly as
the full forward, and the DMCA decoder alternates the two."""

import math

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.decoding import generate
from attnlab.nn.kernels import attention_weights, build_kernel
from attnlab.nn.kernels.base import KernelSetup
from tests.models.helpers import assert_cached_steps_equal_full

ATOL = 1e-5
V = 50


def qkv(B, H, Tq, Tk, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g).requires_grad_()
    return [q] + [torch.randn(B, H, Tk, D, generator=g).requires_grad_() for _ in range(2)]


def assert_same(out, ref, inputs):
    """Values and gradients (along one random output direction) agree."""
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g)):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)


def key_padding(B, Tk, cut):
    """(B, 1, 1, Tk): the last row right-padded by `cut` keys, the first left-padded by 2."""
    keep = torch.ones(B, Tk, dtype=torch.bool)
    keep[-1, Tk - cut:] = False
    keep[0, :2] = False
    return keep[:, None, None, :]


# ---- local_block -----------------------------------------------------------------------------


def dense_local(q, k, v, block, causal, mask=None, bias=None):
    """Eager attention under the block-diagonal (and causal) pattern, built by position loops."""
    Tq, Tk = q.shape[2], k.shape[2]
    allowed = torch.zeros(Tq, Tk, dtype=torch.bool)
    for row in range(Tq):
        i = Tk - Tq + row  # the queries are the last Tq positions
        for j in range(Tk):
            allowed[row, j] = j // block == i // block and (j <= i or not causal)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    return attention_weights(scores, allowed if mask is None else allowed & mask) @ v


@pytest.mark.parametrize("T,block", [(13, 4), (8, 8), (5, 16), (6, 1)])  # ragged, one block, T < b, b = 1
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", ["none", "padding", "bias"])
def test_local_block_equals_dense_under_its_pattern(T, block, causal, extra):
    q, k, v = qkv(2, 3, T, T, seed=T + block)
    kernel = build_kernel("local_block", {"block_size": block})
    mask = key_padding(2, T, T // 3) if extra == "padding" else None
    bias = torch.randn(1, 3, T, T) if extra == "bias" else None
    out, weights = kernel(q, k, v, scale=8 ** -0.5, mask=mask, bias=bias, causal=causal)
    assert weights is None
    assert_same(out, dense_local(q, k, v, block, causal, mask, bias), (q, k, v))
    pattern = kernel.dense_mask(T, causal)  # the dense reference's mask is the same pattern
    torch.testing.assert_close(out, attention_weights(q @ k.transpose(-1, -2) * 8 ** -0.5 + (
        0 if bias is None else bias), pattern if mask is None else pattern & mask) @ v, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("Tq", [1, 3, 6])
def test_local_block_queries_after_a_cache_see_their_block_so_far(Tq):
    """q = the last Tq of Tk positions: query i sees the keys in [b (i // b), i]."""
    q, k, v = qkv(2, 2, Tq, 11, seed=Tq)
    mask = key_padding(2, 11, 2)
    out, _ = build_kernel("local_block", {"block_size": 4})(q, k, v, scale=8 ** -0.5, mask=mask, causal=True)
    assert_same(out, dense_local(q, k, v, 4, True, mask), (q, k, v))


# ---- memory_compressed -----------------------------------------------------------------------


def compressed_kernel(c, H=2, D=8, seed=0):
    torch.manual_seed(seed)
    return build_kernel("memory_compressed", {"compression": c, "alternate": False}, KernelSetup(H, D))


def reference_compressed(kernel, q, k, v, causal, keep=None):
    """One query at a time: the compressed blocks it may see (complete before it when causal,
    holding a real key), each block's key and value summed from its positions (padding zeroed)."""
    B, H, Tq, D = q.shape
    Tk, c = k.shape[2], kernel.compression
    rows = []
    for b in range(B):
        for h in range(H):
            for row in range(Tq):
                i = Tk - Tq + row
                keys, values = [], []
                for j in range(math.ceil(Tk / c)):
                    positions = [p for p in range(c * j, c * j + c) if p < Tk]
                    real = [p for p in positions if keep is None or keep[b, p]]
                    if (causal and c * j + c - 1 > i) or not real:
                        continue
                    keys.append(kernel.k_conv_bias[h] + sum(k[b, h, p] @ kernel.k_conv_weight[h, p - c * j]
                                                            for p in real))
                    values.append(kernel.v_conv_bias[h] + sum(v[b, h, p] @ kernel.v_conv_weight[h, p - c * j]
                                                              for p in real))
                if not keys:
                    rows.append(torch.zeros(D))  # no visible block: zeros
                    continue
                w = torch.softmax(torch.stack(keys) @ q[b, h, row] * D ** -0.5, dim=0)
                rows.append(w @ torch.stack(values))
    return torch.stack(rows).view(B, H, Tq, D)


@pytest.mark.parametrize("T,c", [(12, 3), (7, 3), (9, 4), (5, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_memory_compressed_equals_its_reference(T, c, causal, padded):
    kernel = compressed_kernel(c, seed=T)
    q, k, v = qkv(2, 2, T, T, seed=c)
    mask = key_padding(2, T, 2) if padded else None
    out, _ = kernel(q, k, v, scale=8 ** -0.5, mask=mask, causal=causal)
    keep = None if mask is None else mask[:, 0, 0]
    params = [kernel.k_conv_weight, kernel.k_conv_bias, kernel.v_conv_weight, kernel.v_conv_bias]
    assert_same(out, reference_compressed(kernel, q, k, v, causal, keep), (q, k, v, *params))


@pytest.mark.parametrize("Tq", [1, 4])
def test_memory_compressed_after_a_cache_equals_its_reference(Tq):
    """q = the last Tq of Tk positions; the decoder's cached mask (causal rows AND padding)."""
    kernel = compressed_kernel(3, seed=Tq)
    q, k, v = qkv(2, 2, Tq, 11, seed=Tq)
    keep = key_padding(2, 11, 3)
    rows = torch.ones(Tq, 11, dtype=torch.bool).tril(diagonal=11 - Tq)
    out, _ = kernel(q, k, v, scale=8 ** -0.5, mask=keep & rows, causal=True)
    assert_same(out, reference_compressed(kernel, q, k, v, True, keep[:, 0, 0]), (q, k, v))


def test_memory_compressed_weights_are_over_the_blocks_and_reach_the_convolutions():
    kernel = compressed_kernel(3)
    q, k, v = qkv(1, 2, 10, 10)
    out, weights = kernel(q, k, v, scale=1.0, causal=True, need_weights=True)
    assert weights.shape == (1, 2, 10, 4)  # ceil(10 / 3) blocks
    assert weights[0, :, :2].abs().sum() == 0 and (out[0, :, :2] == 0).all()  # no complete block yet
    torch.testing.assert_close(weights[0, :, 2:].sum(-1), torch.ones(2, 8))
    assert weights[0, :, :, 3].abs().sum() == 0  # the partial last block is never visible to a decoder
    out.sum().backward()
    assert kernel.k_conv_weight.grad.abs().sum() > 0 and kernel.v_conv_bias.grad.abs().sum() > 0


# ---- through the model -----------------------------------------------------------------------


def model(kernel, arch="decoder", scheme="rotary", **options):
    cfg = ModelConfig(arch=arch, vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm_placement="pre", position={"scheme": scheme, "max_len": 64},
                      attention={"kernel": kernel, "kernel_options": options, "num_kv_heads": 2})
    torch.manual_seed(0)
    return build_model(cfg).eval()


DECODERS = [("local_block", "alibi", {"block_size": 4}),
            ("memory_compressed", "rotary", {"compression": 3, "block_size": 4}),
            ("memory_compressed", "learned", {"compression": 2, "alternate": False})]


@pytest.mark.parametrize("kernel,scheme,options", DECODERS)
def test_decoder_is_causal(kernel, scheme, options):
    m = model(kernel, scheme=scheme, **options)
    x = torch.randint(1, V, (2, 14))
    t = 9
    y = x.clone()
    y[:, t:] = torch.randint(1, V, (2, 14 - t))
    with torch.no_grad():
        a, b = m(x), m(y)
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=1e-6, rtol=0)
    assert (a[:, t:] - b[:, t:]).abs().max() > 1e-4  # the perturbation is seen from position t on


@pytest.mark.parametrize("kernel,scheme,options", DECODERS)
def test_cached_decoding_equals_the_full_forward(kernel, scheme, options):
    m = model(kernel, scheme=scheme, **options)
    x = torch.randint(1, V, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    assert_cached_steps_equal_full(m, x, mask, steps=6)


@pytest.mark.parametrize("kernel,scheme,options", DECODERS)
def test_generate_steps_equal_the_full_forward(kernel, scheme, options):
    """The decoding fast path (`step`: one token per row, a (N, 1, 1, L) mask or ALiBi's bias)
    and beam reordering give what re-running the full sequence gives."""
    m = model(kernel, scheme=scheme, **options)
    x = torch.randint(1, V, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0
    for beams in (1, 2):
        fast = generate(m, x, 8, attention_mask=mask, num_beams=beams, return_scores=True)
        slow = generate(m, x, 8, attention_mask=mask, num_beams=beams, return_scores=True, use_cache=False)
        assert torch.equal(fast.sequences, slow.sequences)
        torch.testing.assert_close(fast.scores, slow.scores, atol=1e-4, rtol=1e-5)


def test_dmca_alternates_local_and_compressed_layers():
    """Layer 0 attends within blocks (no parameters), layer 1 to the compressed memory; with
    alternate=False both compress."""
    m = model("memory_compressed", compression=2, block_size=3)
    local, compressed = (layer.self_attn.kernel for layer in m.layers)
    assert list(local.parameters()) == [] and len(list(compressed.parameters())) == 4
    q, k, v = qkv(1, 4, 8, 8)
    out, _ = local(q, k, v, scale=8 ** -0.5, causal=True)
    torch.testing.assert_close(out, dense_local(q, k, v, 3, True), atol=ATOL, rtol=1e-4)
    out, weights = compressed(q, k, v, scale=8 ** -0.5, causal=True, need_weights=True)
    assert weights.shape == (1, 4, 8, 4)
    torch.testing.assert_close(out, reference_compressed(compressed, q, k, v, True), atol=ATOL, rtol=1e-4)
    every = model("memory_compressed", compression=2, alternate=False)
    assert all(len(list(layer.self_attn.kernel.parameters())) == 4 for layer in every.layers)
    names = [n for n in m.state_dict() if "conv" in n]
    assert names and all(n.startswith("layers.1.") for n in names)


def test_encoder_sees_every_block_and_ignores_right_padding():
    m = model("memory_compressed", arch="encoder", scheme="learned", compression=3, alternate=False)
    x = torch.randint(1, V, (2, 10))
    y = x.clone()
    y[:, -1] = (x[:, -1] % (V - 1)) + 1  # change the last token: every position sees its block
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    z = x.clone()
    z[1, 7:] = torch.randint(1, V, (3,))  # other padded tokens
    with torch.no_grad():
        a, b = m(x), m(y)
        assert (a[:, 0] - b[:, 0]).abs().max() > 1e-4
        torch.testing.assert_close(m(x, mask)[1, :7], m(z, mask)[1, :7], atol=1e-6, rtol=0)


def test_bad_options_and_uses_name_the_field():
    for kernel, options, field in [("memory_compressed", {"compression": 0}, "compression"),
                                   ("memory_compressed", {"block_size": 0}, "block_size"),
                                   ("memory_compressed", {"alternate": "yes"}, "alternate"),
                                   ("local_block", {"block_size": 0}, "block_size")]:
        with pytest.raises(ValueError, match=f"attention.kernel_options.{field}"):
            ModelConfig(arch="decoder", attention={"kernel": kernel, "kernel_options": options})
    with pytest.raises(ValueError, match="attention.kernel"):  # no (query, key) bias over compressed keys
        ModelConfig(arch="decoder", position={"scheme": "alibi"}, attention={"kernel": "memory_compressed"})
    with pytest.raises(ValueError, match="position bias"):
        q, k, v = qkv(1, 2, 6, 6)
        compressed_kernel(3)(q, k, v, scale=1.0, bias=torch.zeros(1, 2, 6, 6), causal=True)
