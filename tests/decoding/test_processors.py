"""The per-step filters, checked against their definitions written out by hand."""

import pytest
import torch

from attnlab.decoding import no_repeat_ngram, repetition_penalty, top_k_filter, top_p_filter


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    probs = torch.tensor([[0.05, 0.4, 0.3, 0.15, 0.1]])
    logits = probs.log()
    for p, kept in [(0.4, {1}), (0.41, {1, 2}), (0.7, {1, 2}), (0.71, {1, 2, 3}), (0.85, {1, 2, 3}),
                    (0.86, {1, 2, 3, 4}), (1.0, {0, 1, 2, 3, 4}), (1e-6, {1})]:
        out = top_p_filter(logits, p)
        assert set(torch.isfinite(out[0]).nonzero()[:, 0].tolist()) == kept, p
        assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])  # kept scores unchanged


def test_top_p_matches_a_sorted_loop_on_random_rows():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20, 30, generator=g) * 2
    for p in (0.1, 0.5, 0.9):
        out = top_p_filter(logits, p)
        for row, filtered in zip(logits, out):
            probs = row.softmax(-1)
            kept, mass = set(), 0.0
            for i in probs.argsort(descending=True).tolist():
                kept.add(i)
                mass += float(probs[i])
                if mass >= p:
                    break
            assert set(torch.isfinite(filtered).nonzero()[:, 0].tolist()) == kept


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, False, True, False]]
    assert torch.equal(top_k_filter(logits, 10), logits)


def test_repetition_penalty_divides_positive_and_multiplies_negative_scores():
    scores = torch.tensor([[2.0, -1.0, 0.5, -3.0, 4.0], [1.0, 1.0, -1.0, 1.0, 1.0]])
    seen = torch.tensor([[0, 1, 1], [2, 2, 2]])  # repeats count once
    out = repetition_penalty(scores, seen, 2.0)
    expected = scores.clone()
    for row, ids in enumerate(seen.tolist()):
        for i in set(ids):
            s = scores[row, i]
            expected[row, i] = s / 2.0 if s > 0 else s * 2.0
    assert torch.equal(out, expected)
    assert torch.equal(scores[0], torch.tensor([2.0, -1.0, 0.5, -3.0, 4.0]))  # input untouched
    assert torch.equal(repetition_penalty(scores, seen, 1.0), scores)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_bans_exactly_the_completing_tokens(n):
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 4, (6, 12), generator=g)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, :3] = False  # left padding in the first row
    out = no_repeat_ngram(torch.zeros(6, 4), ids, n, valid)
    for row in range(6):
        seq = ids[row].tolist()
        start = 3 if row == 0 else 0
        tail = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
        banned = {seq[i + n - 1] for i in range(start, len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == tail}
        assert set(torch.isinf(out[row]).nonzero()[:, 0].tolist()) == banned


def test_padding_is_neither_penalised_nor_part_of_an_ngram():
    from attnlab.decoding.search import DecodeOptions, apply_processors

    scores = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
    ids = torch.tensor([[0, 0, 2, 3]])
    valid = torch.tensor([[False, False, True, True]])
    out = apply_processors(scores, ids, valid, 0, DecodeOptions(repetition_penalty=2.0))
    assert out.tolist() == [[1.0, 2.0, -2.0, 0.25]]  # token 0 only appears as padding
    ids = torch.tensor([[3, 1, 0, 3]])  # the bigram (3, 1) starts in the padding
    out = apply_processors(scores, ids, torch.tensor([[False, True, True, True]]), 0,
                           DecodeOptions(no_repeat_ngram_size=2))
    assert torch.isfinite(out).all()
    assert torch.isinf(apply_processors(scores, ids, None, 0, DecodeOptions(no_repeat_ngram_size=2))[0, 1])
