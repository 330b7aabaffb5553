"""Grouped-query attention against its definition: query head h of H reads key/value head
h // (H / G) of G (Ainslie et al. 2023, https://arxiv.org/abs/2305.13245), checked against a
per-head loop and against torch's own grouped SDPA (`enable_gqa`), on every path: the kernels,
the generic scoring path, cross-attention, the KV cache and the decoding step."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import LayerKV, Step
from attnlab.nn.positions import RelativePositions

D, H, Dh = 48, 6, 8


def per_head_reference(attn: MultiHeadAttention, x: torch.Tensor, context: torch.Tensor | None = None,
                       causal: bool = False) -> torch.Tensor:
    """A loop over query heads, each attending with its group's key/value head, in float64."""
    G, B, Tq = attn.num_kv_heads, x.shape[0], x.shape[1]
    x = x.double()
    if context is None:
        q, k, v = F.linear(x, attn.qkv_proj.weight.double(), attn.qkv_proj.bias.double()).split(
            [H * Dh, G * Dh, G * Dh], dim=-1)
    else:
        q = F.linear(x, attn.q_proj.weight.double(), attn.q_proj.bias.double())
        k, v = F.linear(context.double(), attn.kv_proj.weight.double(), attn.kv_proj.bias.double()).chunk(2, -1)
    Tk = k.shape[1]
    heads = []
    for h in range(H):
        g = h // (H // G)  # the group of query head h
        qh, kh, vh = q[..., h * Dh:(h + 1) * Dh], k[..., g * Dh:(g + 1) * Dh], v[..., g * Dh:(g + 1) * Dh]
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(Dh)  # (B, Tq, Tk)
        if causal:
            scores = scores.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).triu(Tk - Tq + 1), float("-inf"))
        heads.append(scores.softmax(-1) @ vh)
    out = torch.cat(heads, dim=-1)  # (B, Tq, H Dh)
    return F.linear(out, attn.out_proj.weight.double(), attn.out_proj.bias.double())


def _attention(G, **kw):
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, head_dim=Dh, num_kv_heads=G, **kw).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)  # distinct heads, scores far from uniform
    return attn


@pytest.mark.parametrize("G", [1, 2, 3])
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_self_attention_groups_equal_the_per_head_loop(kernel, G):
    attn = _attention(G, kernel=kernel)
    x = torch.randn(2, 7, D)
    out, _ = attn(x)
    torch.testing.assert_close(out.double(), per_head_reference(attn, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("G", [2, 3])
def test_scoring_path_groups_equal_the_per_head_loop(G):
    # a term on the values takes the generic scoring path (its own repeat of the key/value heads);
    # with zero tables Shaw's terms add nothing, so it must equal plain grouped attention
    attn = _attention(G, kernel="eager", relative=RelativePositions(Dh, max_distance=2, values=True))
    with torch.no_grad():
        attn.relative.key_table.zero_()
        attn.relative.value_table.zero_()
    x = torch.randn(2, 5, D)
    pos = torch.arange(5)[None]
    out, _ = attn(x, q_pos=pos, k_pos=pos)
    torch.testing.assert_close(out.double(), per_head_reference(attn, x), atol=1e-5, rtol=1e-5)


def test_grouped_kernel_equals_torch_enable_gqa():
    attn = _attention(2, kernel="eager")
    x = torch.randn(2, 7, D)
    q, k, v = attn.qkv_proj(x).view(2, 7, H + 4, Dh).transpose(1, 2).split([H, 2, 2], dim=1)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    got, _ = attn(x, mask=mask)
    torch.testing.assert_close(got, attn.out_proj(expected.transpose(1, 2).reshape(2, 7, H * Dh)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_cross_attention_groups_equal_the_per_head_loop(kernel):
    attn = _attention(2, kernel=kernel, cross_attention=True)
    x, memory = torch.randn(2, 4, D), torch.randn(2, 9, D)
    out, _ = attn(x, memory)
    torch.testing.assert_close(out.double(), per_head_reference(attn, x, memory), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_cached_forward_and_decoding_step_group_like_the_full_loop(kernel):
    attn = _attention(3, kernel=kernel, causal=True)
    x = torch.randn(2, 6, D)
    expected = per_head_reference(attn, x, causal=True)  # (B, T, D)
    kv = LayerKV(max_len=6)
    pos = torch.arange(6)[None]
    with torch.no_grad():
        prompt, _ = attn(x[:, :4], mask=torch.ones(4, 4, dtype=torch.bool).tril(), q_pos=pos[:, :4],
                         k_pos=pos[:, :4], cache=kv)
        cached, _ = attn(x[:, 4:5], cache=kv)  # one token over the cached keys: no mask needed
        stepped = attn.step(x[:, 5], kv, Step(6, pos[:, 5:6].expand(2, 1), pos.expand(2, 6)))
    torch.testing.assert_close(prompt.double(), expected[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cached[:, 0].double(), expected[:, 4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stepped.double(), expected[:, 5], atol=1e-5, rtol=1e-5)
