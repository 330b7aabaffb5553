import math

import pytest
import torch

from attnlab.nn.positions import (ALiBi, BinaryPositions, LearnedPositions, RelativePositions, RotaryEmbedding,
                                  SinusoidalPositions, alibi_slopes, t5_bucket)


def test_sinusoidal_formula():
    d = 16
    pe = SinusoidalPositions(d)(torch.arange(50)[None])[0]
    for t in (0, 7, 49):
        for i in range(d // 2):
            angle = t / 10000 ** (2 * i / d)
            assert pe[t, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[t, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_offset_is_a_linear_map():
    # PE(t + k) = M_k PE(t) for one matrix M_k and every t
    pe = SinusoidalPositions(16)(torch.arange(100)[None])[0].double()
    k = 5
    M = torch.linalg.lstsq(pe[:-k], pe[k:]).solution
    torch.testing.assert_close(pe[:-k] @ M, pe[k:], atol=1e-5, rtol=0)  # fp32 table


def test_binary_positions_are_bits():
    code = BinaryPositions(8, max_len=16)(torch.tensor([[0, 5, 15]]))[0]
    assert code[1, :4].tolist() == [1, -1, 1, -1]  # 5 = 0b0101, bit 0 first
    assert code[2, :4].tolist() == [1, 1, 1, 1]
    assert (code[:, 4:] == 0).all()
    with pytest.raises(ValueError, match="max_len"):
        BinaryPositions(8, max_len=16)(torch.tensor([[16]]))


def test_learned_positions_refuse_positions_beyond_the_table():
    with pytest.raises(ValueError, match="max_len=4"):
        LearnedPositions(4, 8)(torch.arange(5)[None])


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_rotary_scores_depend_on_offset_only(rotary_dim):
    rope = RotaryEmbedding(8, rotary_dim)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(s, t):
        return (rope.rotate(q, torch.tensor([[s]])) * rope.rotate(k, torch.tensor([[t]]))).sum().item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-4)
    rotated = rope.rotate(q, torch.tensor([[5]]))
    assert rotated.norm().item() == pytest.approx(q.norm().item(), rel=1e-5)  # a rotation


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8).tolist() == pytest.approx([2 ** -(i + 1) for i in range(8)])
    twelve = alibi_slopes(12).tolist()
    assert twelve[:8] == pytest.approx([2 ** -(i + 1) for i in range(8)])
    assert twelve[8:] == pytest.approx([2 ** -(i + 0.5) for i in range(4)])
    bias = ALiBi(8)(torch.arange(4)[None], torch.arange(4)[None])
    assert bias[0, 0, 3].tolist() == pytest.approx([-1.5, -1.0, -0.5, 0.0])


def test_t5_bucket_equals_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention
    rel = torch.arange(-300, 300)[None, :]
    for bidirectional in (True, False):
        for buckets, max_distance in ((32, 128), (16, 64)):
            expected = T5Attention._relative_position_bucket(rel, bidirectional, buckets, max_distance)
            assert torch.equal(t5_bucket(rel, bidirectional, buckets, max_distance), expected)


def test_shaw_terms_equal_the_formula():
    torch.manual_seed(0)
    rel = RelativePositions(4, max_distance=2, values=True)
    q, weights = torch.randn(2, 3, 5, 4), torch.softmax(torch.randn(2, 3, 5, 5), -1)
    pos = torch.arange(5)[None]
    index = rel.distance_index(pos, pos)
    a_k = rel.key_table[index[0]]  # (Tq, Tk, Dh), built naively
    a_v = rel.value_table[index[0]]
    naive_bias = torch.einsum("bhqd,qkd->bhqk", q, a_k) * 0.5
    naive_values = torch.einsum("bhqk,qkd->bhqd", weights, a_v)
    torch.testing.assert_close(rel.score_bias(q, index, 0.5), naive_bias)
    torch.testing.assert_close(rel.value_term(weights, index), naive_values)
    assert index[0, 0].tolist() == [2, 3, 4, 4, 4]  # distances clipped at +-2
