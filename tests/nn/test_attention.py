"""Multi-head attention: the properties that define it, fused == eager, and torch's reference."""

import itertools

import pytest
import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.nn.positions import ALiBi, RelativePositions, RotaryEmbedding, T5RelativeBias
from attnlab.nn.scores import build_score

D, H = 32, 4


def mha(score="scaled_dot", kernel="auto", **kw):
    return MultiHeadAttention(D, H, score=build_score(score, H, D // H), kernel=kernel, **kw)


def test_weights_are_a_distribution_and_masked_keys_get_zero():
    attn = mha(kernel="eager")
    x = torch.randn(2, 6, D)
    am = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    mask = causal_mask(6)[None, None] & padding_mask(am)
    _, w = attn(x, mask=mask, need_weights=True)
    assert w.shape == (2, H, 6, 6)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 6))
    assert (w.masked_select(~mask.expand_as(w)) == 0).all()  # exactly zero, not merely small


def test_one_head_with_identity_projections_outputs_lie_in_the_values_convex_hull():
    attn = MultiHeadAttention(8, 1, bias=True, kernel="eager")
    with torch.no_grad():
        attn.qkv_proj.weight.copy_(torch.eye(8).repeat(3, 1))  # q, k and v: each the identity
        attn.out_proj.weight.copy_(torch.eye(8))
        for proj in (attn.qkv_proj, attn.out_proj):
            proj.bias.zero_()
    x = torch.randn(3, 5, 8) * 3
    out, w = attn(x, need_weights=True)
    torch.testing.assert_close(out, w[:, 0] @ x)  # a convex combination of the values (= x)...
    lo, hi = x.min(1, keepdim=True).values, x.max(1, keepdim=True).values
    assert ((out >= lo - 1e-5) & (out <= hi + 1e-5)).all()  # ...so inside their bounding box


def test_self_attention_without_positions_is_permutation_equivariant():
    attn = mha()
    x = torch.randn(2, 7, D)
    perm = torch.randperm(7)
    out, _ = attn(x)
    out_perm, _ = attn(x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)


def test_rotary_breaks_permutation_equivariance():
    attn = mha(rotary=RotaryEmbedding(D // H))
    x = torch.randn(1, 7, D)
    perm = torch.tensor([1, 0, 2, 3, 4, 5, 6])
    pos = torch.arange(7)[None]
    out, _ = attn(x, q_pos=pos, k_pos=pos)
    out_perm, _ = attn(x[:, perm], q_pos=pos, k_pos=pos)
    assert not torch.allclose(out_perm, out[:, perm], atol=1e-4)


def test_fully_masked_query_gives_zeros_not_nan(device):
    x = torch.randn(1, 3, D).to(device)
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, True]], device=device)
    for kernel in ("eager", "sdpa"):
        attn = mha(kernel=kernel, bias=False).to(device)
        out, _ = attn(x, mask=mask)
        assert torch.isfinite(out).all()
        assert (out[0, 0] == 0).all()


# ---- fused kernel == eager kernel, for every variant where both apply ----------------------

FUSED_SCORES = ["scaled_dot", "dot", "cosine", "general", "gaussian"]
POSITIONS = ["none", "rotary", "relative_keys", "alibi", "t5_bias"]


def _variant(score, position, num_kv_heads, device):
    kw = dict(num_kv_heads=num_kv_heads)
    if position == "rotary":
        kw["rotary"] = RotaryEmbedding(D // H, rotary_dim=4)
    if position == "relative_keys":
        kw["relative"] = RelativePositions(D // H, max_distance=3, values=False)
    eager, fused = mha(score, "eager", **kw), mha(score, "sdpa", **kw)
    fused.load_state_dict(eager.state_dict())
    return eager.to(device), fused.to(device)


@pytest.mark.parametrize("score, position, num_kv_heads",
                         list(itertools.product(FUSED_SCORES, POSITIONS, [None, 2, 1])))
def test_sdpa_equals_eager(score, position, num_kv_heads, device):
    eager, fused = _variant(score, position, num_kv_heads, device)
    assert fused.uses_fused_kernel() and not eager.uses_fused_kernel()
    x = torch.randn(2, 9, D).to(device).requires_grad_()
    am = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    mask = (causal_mask(9)[None, None] & padding_mask(am)).to(device)
    pos = torch.arange(9)[None].to(device)
    bias = None
    if position == "alibi":
        bias = ALiBi(H).to(device)(pos, pos)
    if position == "t5_bias":
        bias = T5RelativeBias(H, 32, 128, bidirectional=False).to(device)(pos, pos)
    outs, grads = [], []
    for attn in (eager, fused):
        out, _ = attn(x, mask=mask, bias=bias, q_pos=pos, k_pos=pos)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), [x, *attn.parameters()]))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for g_eager, g_fused in zip(*grads):
        torch.testing.assert_close(g_eager, g_fused, atol=1e-5, rtol=1e-4)


def test_cross_attention_sdpa_equals_eager(device):
    eager, fused = mha(kernel="eager", cross_attention=True), mha(kernel="sdpa", cross_attention=True)
    fused.load_state_dict(eager.state_dict())
    eager, fused = eager.to(device), fused.to(device)
    x, mem = torch.randn(2, 4, D).to(device), torch.randn(2, 7, D).to(device)
    mem_mask = padding_mask(torch.tensor([[1] * 7, [1] * 3 + [0] * 4])).to(device)
    torch.testing.assert_close(eager(x, mem, mask=mem_mask)[0], fused(x, mem, mask=mem_mask)[0], atol=1e-5, rtol=1e-5)


def test_sdpa_kernel_refuses_additive_scores():
    with pytest.raises(ValueError, match="sdpa"):
        mha("additive", "sdpa")


def test_additive_and_relative_values_run_eager_and_are_distributions():
    attn = mha("additive", "auto", relative=RelativePositions(D // H, 2, values=True))
    assert not attn.uses_fused_kernel()
    pos = torch.arange(5)[None]
    out, w = attn(torch.randn(2, 5, D), q_pos=pos, k_pos=pos, need_weights=True)
    assert out.shape == (2, 5, D)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 5))


def test_general_score_starts_as_scaled_dot():
    general, scaled = mha("general", "eager"), mha("scaled_dot", "eager")
    scaled.load_state_dict(general.state_dict(), strict=False)
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(general(x)[0], scaled(x)[0], atol=1e-6, rtol=1e-5)


# ---- reference: torch.nn.MultiheadAttention with copied weights ----------------------------

@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_equals_torch_multihead_attention(kernel):
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    ours, cross = mha(kernel=kernel).eval(), mha(kernel=kernel, cross_attention=True).eval()
    with torch.no_grad():  # torch's in_proj is q | k | v fused, as our qkv_proj; cross: q_proj and kv_proj
        wq, wkv = ref.in_proj_weight.split([D, 2 * D])
        bq, bkv = ref.in_proj_bias.split([D, 2 * D])
        for proj, w, b in ((ours.qkv_proj, ref.in_proj_weight, ref.in_proj_bias), (cross.q_proj, wq, bq),
                           (cross.kv_proj, wkv, bkv), (ours.out_proj, ref.out_proj.weight, ref.out_proj.bias),
                           (cross.out_proj, ref.out_proj.weight, ref.out_proj.bias)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
    x, mem = torch.randn(3, 6, D), torch.randn(3, 8, D)
    am = torch.tensor([[1] * 8, [1] * 5 + [0] * 3, [1] * 2 + [0] * 6])
    expected, expected_w = ref(x, mem, mem, key_padding_mask=~am.bool(), average_attn_weights=False)
    out, w = cross(x, mem, mask=padding_mask(am), need_weights=kernel == "eager")
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if w is not None:
        torch.testing.assert_close(w, expected_w, atol=1e-6, rtol=1e-5)
    # self-attention with torch's float causal mask (True there = not allowed)
    expected, _ = ref(x, x, x, attn_mask=~causal_mask(6))
    torch.testing.assert_close(ours(x, mask=causal_mask(6))[0], expected, atol=1e-5, rtol=1e-5)
