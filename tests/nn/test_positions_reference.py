"""Position schemes against references: each formula written out from its paper in a few lines of
plain torch, and the Hugging Face implementation of the same scheme where there is one.

The property tests beside these (tests/nn/test_positions.py) hold for any frequencies, slopes or
tables; these pin the numbers themselves.
"""

import math

import pytest
import torch

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.positions import ALiBi, RelativePositions, RotaryEmbedding, T5RelativeBias, alibi_slopes

# ---- rotary (Su et al. 2021) ---------------------------------------------------------------------


def rotary_formula(x: torch.Tensor, positions: list[int], rotary_dim: int, base: float) -> torch.Tensor:
    """x (B, H, T, Dh): the pair (i, i + R/2), i < R/2, of position t rotated by t * base^(-2i/R);
    features from R on untouched. Plain float64 arithmetic, one pair at a time."""
    out = x.double().clone()
    half = rotary_dim // 2
    for ti, t in enumerate(positions):
        for i in range(half):
            angle = t * base ** (-2 * i / rotary_dim)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[..., ti, i].double(), x[..., ti, i + half].double()
            out[..., ti, i] = a * c - b * s
            out[..., ti, i + half] = a * s + b * c
    return out


@pytest.mark.parametrize("head_dim, rotary_dim, base", [(8, None, 10000.0), (8, 4, 10000.0), (16, 6, 500.0),
                                                        (12, 12, 1e6)])
def test_rotary_equals_the_formula(head_dim, rotary_dim, base):
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim, rotary_dim, base)
    x = torch.randn(2, 3, 5, head_dim)
    positions = [0, 1, 7, 30, 200]
    got = rope.rotate(x, torch.tensor([positions]))
    expected = rotary_formula(x, positions, rotary_dim or head_dim, base)
    torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-5)
    r = rotary_dim or head_dim
    assert torch.equal(got[..., r:], x[..., r:])  # features past rotary_dim untouched, bit for bit


def test_the_rotary_scheme_builds_its_module_from_the_configured_base_and_dim():
    """POSITION_SCHEMES["rotary"] is how a config's `position` section becomes each layer's rotation:
    its rotary_base and rotary_dim must reach the module (a dropped base rotates by 10000's)."""
    from attnlab.config.model import PositionConfig
    from attnlab.nn.positions import POSITION_SCHEMES, Sizes

    options = PositionConfig(scheme="rotary", rotary_base=500.0, rotary_dim=4)
    rope = POSITION_SCHEMES["rotary"].build(options, Sizes(16, 2, 8, True))
    torch.manual_seed(2)
    x = torch.randn(1, 2, 4, 8)
    positions = [0, 3, 17, 90]
    expected = rotary_formula(x, positions, 4, 500.0)
    torch.testing.assert_close(rope.rotate(x, torch.tensor([positions])).double(), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rotary_equals_transformers_llama(base):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    Dh, H = 16, 2
    config = LlamaConfig(hidden_size=Dh * H, num_attention_heads=H, num_key_value_heads=H, rope_theta=base,
                         max_position_embeddings=256)
    hf = LlamaRotaryEmbedding(config)
    torch.manual_seed(1)
    q, k = torch.randn(2, H, 6, Dh), torch.randn(2, H, 6, Dh)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [3, 9, 27, 81, 120, 200]])
    cos, sin = hf(q, pos)  # (B, T, Dh)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding(Dh, None, base)
    # the same half-split pairing (i, i + Dh/2) as Llama's rotate_half: compared directly (fp32
    # angles up to 200 rad differ in their last bits between the two ways of computing them)
    torch.testing.assert_close(rope.rotate(q, pos), hf_q, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rope.rotate(k, pos), hf_k, atol=1e-4, rtol=1e-4)


def test_rotary_cos_sin_feed_the_decoding_step_the_same_rotation():
    rope = RotaryEmbedding(8, 6, 500.0)
    x = torch.randn(3, 2, 1, 8)
    pos = torch.tensor([[4], [11], [0]])
    cos, sin = rope.cos_sin(pos, x.dtype)
    expected = torch.stack([rotary_formula(x[b:b + 1], [int(pos[b, 0])], 6, 500.0)[0] for b in range(3)])
    torch.testing.assert_close(rope.apply_rotation(x, cos, sin).double(), expected, atol=1e-5, rtol=1e-5)


# ---- ALiBi (Press et al. 2022) --------------------------------------------------------------------


def alibi_slopes_formula(n: int) -> list[float]:
    """Head h of n (n a power of two): 2^(-8 (h + 1) / n). Otherwise the m = 2^floor(log2 n) slopes
    of m heads, then 2^(-8 (2j + 1) / (2m)) for j < n - m: the odd-numbered slopes of 2m heads."""
    m = 2 ** math.floor(math.log2(n))
    slopes = [2 ** (-8 * (h + 1) / m) for h in range(m)]
    slopes += [2 ** (-8 * (2 * j + 1) / (2 * m)) for j in range(n - m)]
    return slopes


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 8, 12, 16, 20, 24, 31, 32])
def test_alibi_slopes_equal_the_formula_and_bloom(num_heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    ours = alibi_slopes(num_heads).double()
    torch.testing.assert_close(ours, torch.tensor(alibi_slopes_formula(num_heads), dtype=torch.float64),
                               atol=0, rtol=1e-6)
    # BLOOM's bias is slope_h * key position: at key position 1 it is the slope itself
    bloom = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float64)  # (H, 1, 2)
    torch.testing.assert_close(ours, bloom[:, 0, 1], atol=0, rtol=1e-6)


def test_alibi_bias_differs_from_bloom_by_a_per_query_constant():
    # softmax is shift-invariant per row: -slope |i - j| and BLOOM's slope * j agree on j <= i up
    # to slope * i, so a causal model gives the same weights with either
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    H, T = 6, 7
    ours = ALiBi(H)(torch.arange(T)[None], torch.arange(T)[None])[0]  # (H, T, T)
    bloom = build_alibi_tensor(torch.ones(1, T), H, torch.float32)[:, 0]  # (H, T) over keys
    slopes = alibi_slopes(H)
    for i in range(T):
        torch.testing.assert_close(ours[:, i, :i + 1] + slopes[:, None] * i, bloom[:, :i + 1])


# ---- T5 relative bias (Raffel et al. 2020) ---------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_equals_transformers_compute_bias(bidirectional):
    # the bucket function is checked alone in test_positions.py; this checks the bias built from it:
    # the distance taken as key - query, one scalar per (bucket, head)
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    H, buckets, max_distance = 4, 16, 40
    config = T5Config(d_model=16, d_kv=4, num_heads=H, relative_attention_num_buckets=buckets,
                      relative_attention_max_distance=max_distance, is_decoder=not bidirectional)
    hf = T5Attention(config, has_relative_attention_bias=True)
    ours = T5RelativeBias(H, buckets, max_distance, bidirectional=bidirectional)
    torch.manual_seed(2)
    with torch.no_grad():
        ours.weight.normal_()
        hf.relative_attention_bias.weight.copy_(ours.weight)
    T = 60
    expected = hf.compute_bias(T, T)  # (1, H, T, T)
    pos = torch.arange(T)[None]
    torch.testing.assert_close(ours(pos, pos), expected)


# ---- Shaw et al. 2018 relative positions, inside attention ----------------------------------------


def test_shaw_attention_equals_the_formula():
    """e_ij = q_i (k_j + a^K_clip(j-i))^T / sqrt(Dh), z_i = sum_j softmax(e)_ij (v_j + a^V_clip(j-i)),
    one table of 2k + 1 rows shared by the heads; computed here with explicit (Tq, Tk, Dh) tensors."""
    torch.manual_seed(3)
    D, H, T, k = 16, 2, 7, 2
    Dh = D // H
    rel = RelativePositions(Dh, max_distance=k, values=True)
    with torch.no_grad():
        rel.key_table.normal_()
        rel.value_table.normal_()
    attn = MultiHeadAttention(D, H, relative=rel, bias=False, kernel="eager").eval()
    x = torch.randn(2, T, D)
    pos = torch.arange(T)[None]
    got, _ = attn(x, q_pos=pos, k_pos=pos)

    q, key, v = (x @ attn.qkv_proj.weight.T).split(D, dim=-1)
    q, key, v = (t.view(2, T, H, Dh).transpose(1, 2) for t in (q, key, v))  # (B, H, T, Dh)
    clip = [[min(max(j - i, -k), k) + k for j in range(T)] for i in range(T)]
    a_k, a_v = rel.key_table[torch.tensor(clip)], rel.value_table[torch.tensor(clip)]  # (T, T, Dh)
    scores = (q[:, :, :, None, :] * (key[:, :, None, :, :] + a_k)).sum(-1) / math.sqrt(Dh)  # (B, H, T, T)
    w = scores.softmax(-1)
    z = (w[..., None] * (v[:, :, None, :, :] + a_v)).sum(-2)  # (B, H, T, Dh)
    expected = z.transpose(1, 2).reshape(2, T, D) @ attn.out_proj.weight.T
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
