"""Local attention in blocks and memory-compressed attention (Liu et al. 2018): each equals its
reference (values and gradients), is causal in a decoder, decodes through a KV cache exactly as
the full forward, and the DMCA decoder alternates the two."""

import math

import pytest
import torch
import torch.nn.functional as F

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
    holding a real key), each block's key and value summed from its positions (padding zeroed).
    Query head h reads key/value head h G / H (of the G heads k holds) with the convolution of
    head h G' / H (of the G' the kernel holds: G, or H for a kernel built without num_kv_heads)."""
    B, H, Tq, D = q.shape
    Tk, c = k.shape[2], kernel.compression
    G, Gw = k.shape[1], kernel.k_conv_weight.shape[0]
    rows = []
    for b in range(B):
        for h in range(H):
            kh, wh = h * G // H, h * Gw // H
            for row in range(Tq):
                i = Tk - Tq + row
                keys, values = [], []
                for j in range(math.ceil(Tk / c)):
                    positions = [p for p in range(c * j, c * j + c) if p < Tk]
                    real = [p for p in positions if keep is None or keep[b, p]]
                    if (causal and c * j + c - 1 > i) or not real:
                        continue
                    keys.append(kernel.k_conv_bias[wh] + sum(k[b, kh, p] @ kernel.k_conv_weight[wh, p - c * j]
                                                             for p in real))
                    values.append(kernel.v_conv_bias[wh] + sum(v[b, kh, p] @ kernel.v_conv_weight[wh, p - c * j]
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


# ---- grouped key/value heads -----------------------------------------------------------------


def conv_reference(kernel, q, k, v, causal, keep=None, scale=None):
    """A dense computation of the same definition, written apart from the kernel: each key/value
    head's keys and values compressed by torch's own strided Conv1d (kernel = stride = c, the
    last block zero-padded), the G compressed heads repeated to the H query heads, then eager
    softmax attention over the blocks a query may see (complete before it when causal, holding
    a real key); a query that sees none gets zeros."""
    B, H, Tq, D = q.shape
    G, Tk, c = k.shape[1], k.shape[2], kernel.compression
    nb = math.ceil(Tk / c)
    if keep is not None:
        k, v = k * keep[:, None, :, None], v * keep[:, None, :, None]

    def conv(x, weight, bias):  # (B, G, Tk, D) -> (B, G, NB, D)
        heads = []
        for g in range(G):
            signal = F.pad(x[:, g].transpose(1, 2), (0, nb * c - Tk))  # (B, D, NB c): features as channels
            w = weight[g].permute(2, 1, 0)  # (c, D_in, D_out) -> Conv1d's (D_out, D_in, c)
            heads.append(F.conv1d(signal, w, bias[g], stride=c).transpose(1, 2))
        return torch.stack(heads, 1)

    kc = conv(k, kernel.k_conv_weight, kernel.k_conv_bias).repeat_interleave(H // G, 1)
    vc = conv(v, kernel.v_conv_weight, kernel.v_conv_bias).repeat_interleave(H // G, 1)
    i = torch.arange(Tk - Tq, Tk)[:, None]
    j = torch.arange(nb)[None, :]
    allowed = (c * j + c - 1 <= i) if causal else torch.ones(Tq, nb, dtype=torch.bool)
    allowed = allowed[None, None].expand(B, 1, Tq, nb)
    if keep is not None:
        real = F.pad(keep, (0, nb * c - Tk)).view(B, nb, c).any(-1)  # (B, NB): a block with a real key
        allowed = allowed & real[:, None, None, :]
    scale = D ** -0.5 if scale is None else scale
    scores = (q @ kc.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)  # a row with no block: zeros
    return weights @ vc


def grouped_kernel(c, H, G, D=8, seed=0):
    torch.manual_seed(seed)
    return build_kernel("memory_compressed", {"compression": c, "alternate": False}, KernelSetup(H, D, num_kv_heads=G))


@pytest.mark.parametrize("H,G", [(4, 2), (4, 1), (6, 3), (2, 2)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_grouped_kv_heads_compress_per_kv_head_exactly(H, G, causal, padded):
    """G sets of convolutions, one per key/value head, each shared by its H / G query heads:
    equal (values and gradients) to the loop reference and to Conv1d + eager attention."""
    T, c = 10, 3
    kernel = grouped_kernel(c, H, G, seed=H + G)
    assert kernel.k_conv_weight.shape == (G, c, 8, 8) and kernel.v_conv_bias.shape == (G, 8)
    g = torch.Generator().manual_seed(H * G)
    q = torch.randn(2, H, T, 8, generator=g).requires_grad_()
    k, v = (torch.randn(2, G, T, 8, generator=g).requires_grad_() for _ in range(2))
    mask = key_padding(2, T, 2) if padded else None
    out, _ = kernel(q, k, v, scale=8 ** -0.5, mask=mask, causal=causal)
    keep = None if mask is None else mask[:, 0, 0]
    params = [kernel.k_conv_weight, kernel.k_conv_bias, kernel.v_conv_weight, kernel.v_conv_bias]
    assert_same(out, conv_reference(kernel, q, k, v, causal, keep), (q, k, v, *params))
    torch.testing.assert_close(out, reference_compressed(kernel, q, k, v, causal, keep), atol=ATOL, rtol=1e-4)


def test_a_per_query_head_mask_reaches_the_grouped_compression():
    """A (B, H, Tq, Tk) mask that pads the same keys in every head equals the (B, 1, 1, Tk) one;
    one whose heads of a group differ keeps a key that any of them may see."""
    kernel = grouped_kernel(3, 4, 2, seed=2)
    q, _, _ = qkv(2, 4, 9, 9, seed=5)
    _, k, v = qkv(2, 2, 9, 9, seed=6)
    pad = key_padding(2, 9, 3)  # (B, 1, 1, Tk)
    a, _ = kernel(q, k, v, scale=0.3, mask=pad, causal=False)
    b, _ = kernel(q, k, v, scale=0.3, mask=pad.expand(2, 4, 9, 9), causal=False)
    torch.testing.assert_close(a, b)
    per_head = pad.expand(2, 4, 9, 9).clone()
    per_head[:, 1, :, 8] = True  # head 1 (group 0) may see key 8: group 0 compresses it
    c, _ = kernel(q, k, v, scale=0.3, mask=per_head, causal=False)
    torch.testing.assert_close(c[:, 2:], a[:, 2:])  # group 1 unchanged
    assert not torch.allclose(c[1, :2], a[1, :2])  # row 1 padded key 8; group 0 now reads it


def test_a_grouped_kernel_is_the_per_query_head_one_with_weights_shared_in_each_group():
    """The old layout (one convolution per query head) with each group's weights copied to its
    query heads computes what the grouped kernel computes: the sharing is by group, h // (H / G)."""
    H, G = 6, 2
    grouped = grouped_kernel(3, H, G, seed=1)
    per_query = build_kernel("memory_compressed", {"compression": 3, "alternate": False}, KernelSetup(H, 8))
    with torch.no_grad():
        for name in ("k_conv_weight", "k_conv_bias", "v_conv_weight", "v_conv_bias"):
            getattr(per_query, name).copy_(getattr(grouped, name).repeat_interleave(H // G, 0))
    q, _, _ = qkv(2, H, 9, 9, seed=3)
    _, k, v = qkv(2, G, 9, 9, seed=4)
    a, wa = grouped(q, k, v, scale=0.3, causal=True, need_weights=True)
    b, wb = per_query(q, k, v, scale=0.3, causal=True, need_weights=True)  # repeats k, v to H first
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(wa, wb)
    k_rep, v_rep = (x.repeat_interleave(H // G, 1) for x in (k, v))
    torch.testing.assert_close(b, conv_reference(per_query, q, k_rep, v_rep, True, scale=0.3))


def test_multi_head_attention_gives_its_kernel_the_kv_heads():
    """MultiHeadAttention(kernel='memory_compressed', num_kv_heads=G) tells its kernel G; with a
    compressed kernel of G heads its forward equals the reference on its own projections."""
    from attnlab.nn.attention import MultiHeadAttention

    by_name = MultiHeadAttention(32, 4, num_kv_heads=2, kernel="memory_compressed")  # default options: layer 0 local
    assert (by_name.kernel.num_heads, by_name.kernel.num_kv_heads) == (4, 2)
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, num_kv_heads=2, kernel=grouped_kernel(3, 4, 2), causal=True).eval()
    x = torch.randn(2, 11, 32)
    with torch.no_grad():
        out, weights = attn(x, need_weights=True)
        q, k, v = attn._heads(attn.qkv_proj(x), 8).split([4, 2, 2], dim=1)
        ref = conv_reference(attn.kernel, q, k, v, True)
        torch.testing.assert_close(out, attn.out_proj(ref.transpose(1, 2).reshape(2, 11, 32)), atol=ATOL, rtol=1e-4)
    assert weights.shape == (2, 4, 11, 4)


def test_grouped_kernel_errors_name_the_heads():
    kernel = grouped_kernel(3, 4, 2)
    q, k, v = qkv(1, 4, 6, 6)  # keys of 4 heads for a kernel of 2 key/value heads
    with pytest.raises(ValueError, match="convolutions for 2 key/value heads, got keys of 4 heads"):
        kernel(q, k, v, scale=1.0, causal=True)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive integer dividing num_heads=4"):
        KernelSetup(4, 8, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads=4 must divide num_heads=6"):
        from attnlab.nn.kernels.memory_compressed import MemoryCompressedKernel
        MemoryCompressedKernel(6, 8, num_kv_heads=4)


def test_build_model_gives_the_kernel_the_kv_heads():
    m = model("memory_compressed", compression=3, alternate=False)  # num_heads 4, num_kv_heads 2
    assert all(layer.self_attn.kernel.k_conv_weight.shape[0] == 2 for layer in m.layers)


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
    q, _, _ = qkv(1, 4, 8, 8)
    _, k, v = qkv(1, 2, 8, 8, seed=1)  # the model's 2 key/value heads
    out, _ = local(q, k, v, scale=8 ** -0.5, causal=True)
    k_rep, v_rep = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    torch.testing.assert_close(out, dense_local(q, k_rep, v_rep, 3, True), atol=ATOL, rtol=1e-4)
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
