import torch

from attnlab.nn.masks import causal_mask, combine, padding_mask, positions_from_mask, prefix_lm_mask


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())


def test_causal_mask_with_cached_keys_lets_queries_see_the_past():
    m = causal_mask(2, 5)  # the last two of five positions
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_prefix_lm_mask():
    m = prefix_lm_mask(5, torch.tensor([2, 0]))
    assert m.shape == (2, 1, 5, 5)
    # inside the prefix every position sees the whole prefix, the rest is causal
    assert m[0, 0, 0].tolist() == [True, True, False, False, False]
    assert m[0, 0, 3].tolist() == [True, True, True, True, False]
    assert torch.equal(m[1, 0], causal_mask(5))


def test_padding_mask_and_positions():
    am = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert padding_mask(am).shape == (2, 1, 1, 5)
    assert positions_from_mask(am).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    assert combine(None, None) is None
    assert torch.equal(combine(causal_mask(3), None), causal_mask(3))
