import numpy as np
import pytest
import torch

from attnlab.data import objectives as obj

IGNORE = obj.IGNORE


def test_causal_lm_shifts_by_one():
    w = torch.arange(20).reshape(2, 10)
    b = obj.causal_lm(w)
    assert torch.equal(b["input_ids"], w[:, :-1]) and torch.equal(b["labels"], w[:, 1:])


def test_mlm_statistics_over_100k_tokens():
    g = torch.Generator().manual_seed(0)
    V, special = 1000, [0, 1, 2, 3]
    ids = torch.randint(4, V, (200, 500), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    b = obj.masked_lm(ids, g, vocab_size=V, mask_id=3, special_ids=special)
    picked = b["labels"] != IGNORE
    eligible = ~torch.isin(ids, torch.tensor(special))
    rate = picked.sum().item() / eligible.sum().item()
    assert abs(rate - 0.15) < 0.005
    assert not picked[~eligible].any()  # special tokens are never picked
    assert torch.equal(b["labels"][picked], ids[picked])
    out = b["input_ids"][picked]
    n = picked.sum().item()
    to_mask = (out == 3).sum().item() / n
    same = (out == ids[picked]).sum().item() / n
    to_random = 1 - to_mask - same
    assert abs(to_mask - 0.8) < 0.01 and abs(same - 0.1) < 0.01 and abs(to_random - 0.1) < 0.01
    assert not torch.isin(b["input_ids"][picked & (b["input_ids"] != 3)], torch.tensor([0, 1, 2])).any()
    assert torch.equal(b["input_ids"][~picked], ids[~picked])  # unpicked positions untouched


def test_mlm_whole_word_masks_all_pieces_of_a_word():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (50, 64), generator=g)
    starts = torch.rand(50, 64, generator=g) < 0.5
    starts[:, 0] = True
    b = obj.masked_lm(ids, g, vocab_size=100, mask_id=4, special_ids=[0, 1, 2, 3, 4], word_starts=starts)
    picked = b["labels"] != IGNORE
    word = torch.cumsum(starts.long(), 1)
    for r in range(50):
        for w in word[r].unique():
            members = picked[r][word[r] == w]
            assert members.all() or not members.any()
    assert 0.12 < picked.float().mean() < 0.18


def test_mlm_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mask_prob"):
        obj.masked_lm(torch.zeros(1, 4, dtype=torch.long), torch.Generator(), vocab_size=10, mask_id=1, mask_prob=0)


@pytest.mark.parametrize("density,mean_len", [(0.15, 3.0), (0.3, 5.0), (0.5, 2.0)])
def test_span_corruption_matches_its_settings_and_reconstructs(density, mean_len):
    g = torch.Generator().manual_seed(0)
    L, sentinels, eos = 200, list(range(1000, 900, -1)), 1
    ids = torch.randint(10, 800, (64, L), generator=g)
    b = obj.span_corruption(ids, g, sentinel_ids=sentinels, eos_id=eos, noise_density=density,
                            mean_span_length=mean_len)
    noise_total, span_lengths = 0, []
    for row, inp, tgt in zip(ids.tolist(), b["input_ids"].tolist(), b["labels"].tolist()):
        assert inp[-1] == eos and tgt[-1] == eos
        # rebuild the original from inputs + targets via the sentinels
        spans, current = {}, None
        for t in tgt[:-1]:
            if t in sentinels:
                current = t
                spans[current] = []
            else:
                spans[current].append(t)
        rebuilt = []
        for t in inp[:-1]:
            rebuilt.extend(spans[t] if t in sentinels else [t])
        assert rebuilt == row
        assert [t for t in inp if t in sentinels] == sentinels[: len(spans) - 1]  # numbered in order
        lengths = [len(v) for v in spans.values()][:-1]
        noise_total += sum(lengths)
        span_lengths += lengths
    assert abs(noise_total / (64 * L) - density) < 0.01
    assert abs(sum(span_lengths) / len(span_lengths) - mean_len) / mean_len < 0.05


def test_prefix_lm_masks_the_prefix_loss():
    g = torch.Generator().manual_seed(0)
    w = torch.arange(2 * 33).reshape(2, 33)
    b = obj.prefix_lm(w, g)
    for row in range(2):
        p = int(b["prefix_lengths"][row])
        assert 1 <= p <= 31
        assert (b["labels"][row, : p - 1] == IGNORE).all()
        assert torch.equal(b["labels"][row, p - 1:], w[row, p:])


def test_next_sentence_labels_and_segments():
    g = torch.Generator().manual_seed(0)
    a = torch.full((4000, 3), 7)
    second = torch.full((4000, 2), 8)
    rand = torch.full((4000, 2), 9)
    b = obj.next_sentence(a, second, rand, g, cls_id=1, sep_id=2)
    assert abs(b["nsp_labels"].float().mean().item() - 0.5) < 0.03
    assert torch.equal(b["input_ids"][:, 5] == 9, b["nsp_labels"].bool())
    assert b["token_type_ids"][0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert b["input_ids"][0, 0] == 1 and b["input_ids"][0, 4] == 2 and b["input_ids"][0, -1] == 2


def test_seq2seq_collation():
    b = obj.seq2seq([[5, 6, 7], [5]], [[8], [9, 9]], pad_id=0, bos_id=1, eos_id=2)
    assert b["src_ids"].tolist() == [[5, 6, 7, 2], [5, 2, 0, 0]]
    assert b["src_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert b["tgt_ids"].tolist() == [[1, 8, 0], [1, 9, 9]]
    assert b["labels"].tolist() == [[8, 2, IGNORE], [9, 9, 2]]


# ----------------------------------------------------------------------------- SpanBERT span masking

def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of True in a 1-D bool array as (start, end) with end exclusive."""
    edges = np.diff(np.concatenate([[0], row.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def _truncated_geometric(p: float, n: int) -> tuple[list[float], float]:
    """P(L = k), k = 1..n, of a geometric(p) cut at n and renormalised, and its mean in closed form."""
    q = 1 - p
    probs = [p * q ** (k - 1) / (1 - q ** n) for k in range(1, n + 1)]
    mean = (1 - (n + 1) * q ** n + n * q ** (n + 1)) / (p * (1 - q ** n))
    return probs, mean


def test_span_length_probs_is_the_truncated_geometric():
    probs, mean = _truncated_geometric(0.2, 10)
    assert obj.span_length_probs(0.2, 10).tolist() == pytest.approx(probs, rel=1e-12)
    assert mean == pytest.approx(3.797, abs=1e-3)  # SpanBERT's "mean span length 3.8"
    assert obj.span_length_probs(1.0, 4).tolist() == [1.0, 0.0, 0.0, 0.0]
    for p, n in ((0.0, 10), (0.2, 0)):
        with pytest.raises(ValueError):
            obj.span_length_probs(p, n)


def test_span_masked_lm_statistics_over_200k_tokens():
    """Whole-word spans of geometric length, ~15% of the maskable tokens, one 80/10/10 choice per
    span, nothing special masked; spans never touch, so the masked runs are the spans."""
    g = torch.Generator().manual_seed(0)
    B, T, V, MASK, special = 400, 512, 1000, 4, [0, 1, 2, 3, 4]
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    sprinkled = torch.rand(B, T, generator=g) < 0.02
    ids[sprinkled] = 3  # [SEP]s inside the rows too
    starts = torch.rand(B, T, generator=g) < 0.6  # words of 1.67 pieces on average
    b = obj.span_masked_lm(ids, g, vocab_size=V, mask_id=MASK, special_ids=special, word_starts=starts)
    is_special = torch.isin(ids, torch.tensor(special))
    words = starts | is_special  # the test's own word starts: specials are words, and so is what follows them
    words[:, 1:] |= is_special[:, :-1]
    words[:, 0] = True
    picked = b["labels"] != IGNORE
    assert not picked[is_special].any()
    assert torch.equal(b["labels"][picked], ids[picked])
    assert torch.equal(b["input_ids"][~picked], ids[~picked])

    probs, mean = _truncated_geometric(0.2, 10)
    lengths, kinds = [], {"mask": 0, "same": 0, "random": 0}
    for r in range(B):
        row_words, out, orig = words[r].numpy(), b["input_ids"][r].numpy(), ids[r].numpy()
        spans = _runs(picked[r].numpy())
        for s, e in spans:
            assert row_words[s] and (e == T or row_words[e]), "a span covers whole words"
            lengths.append(int(row_words[s:e].sum()))
            if (out[s:e] == MASK).all():
                kinds["mask"] += 1
            elif (out[s:e] == orig[s:e]).all():
                kinds["same"] += 1
            else:
                assert not np.isin(out[s:e], special).any(), "random replacements are never special"
                kinds["random"] += 1
        # the budget rule: at least round(15%) of the maskable tokens, and less than one span more
        maskable = int((~is_special[r]).sum())
        budget = int(0.15 * maskable + 0.5)
        masked = int(picked[r].sum())
        assert budget <= masked < budget + max(e - s for s, e in spans)
    n = len(lengths)
    assert n > 4000
    assert abs(sum(lengths) / n - mean) < 0.12  # 3.797
    counts = np.bincount(lengths, minlength=12)
    assert counts[0] == 0 and counts[11] == 0
    for k in range(1, 11):
        assert abs(counts[k] / n - probs[k - 1]) < 0.015, k
    assert abs(kinds["mask"] / n - 0.8) < 0.02 and abs(kinds["same"] / n - 0.1) < 0.015
    assert abs(kinds["random"] / n - 0.1) < 0.015
    # the last span of a row overshoots the budget by half a span on average: 15% and a little
    ratio = picked.sum().item() / (~is_special).sum().item()
    assert 0.15 < ratio < 0.165


def test_span_masked_lm_without_word_starts_spans_tokens_and_skips_padding():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (300, 256), generator=g)
    attention = torch.ones_like(ids)
    attention[:, 200:] = 0  # padding: never masked, and no span runs into it
    b = obj.span_masked_lm(ids, g, vocab_size=100, mask_id=4, special_ids=[0, 1, 2, 3, 4], attention_mask=attention)
    picked = b["labels"] != IGNORE
    assert not picked[:, 200:].any()
    lengths = [e - s for r in range(300) for s, e in _runs(picked[r].numpy())]
    _, mean = _truncated_geometric(0.2, 10)
    assert max(lengths) <= 10 and abs(sum(lengths) / len(lengths) - mean) < 0.15


def test_span_masked_lm_stops_below_budget_only_when_no_span_fits():
    """Short rows with a high budget: a row either reaches its budget or has no token left that a
    span could take (every unmasked one is special or beside a span: spans never touch)."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 50, (300, 7), generator=g)
    ids[:100, 3] = 0  # a special token in the middle of some rows
    b = obj.span_masked_lm(ids, g, vocab_size=50, mask_id=4, special_ids=[0, 1, 2, 3, 4], mask_prob=0.6)
    picked = (b["labels"] != IGNORE).numpy()
    special = (ids < 5).numpy()
    short = 0
    for r in range(300):
        budget = int(0.6 * (~special[r]).sum() + 0.5)
        if picked[r].sum() >= budget:
            continue
        short += 1
        beside = np.zeros(7, dtype=bool)
        beside[1:] |= picked[r][:-1]
        beside[:-1] |= picked[r][1:]
        assert (picked[r] | special[r] | beside).all(), r
    assert 0 < short < 300


def test_span_masked_lm_rejects_bad_arguments():
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="mask_prob"):
        obj.span_masked_lm(ids, torch.Generator(), vocab_size=10, mask_id=1, mask_prob=1.0)
    with pytest.raises(ValueError, match="word_starts must have the shape"):
        obj.span_masked_lm(ids, torch.Generator(), vocab_size=10, mask_id=1,
                           word_starts=torch.ones(1, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------- encoder-decoder prefix LM

def test_encoder_decoder_lm_splits_each_window_into_source_and_target():
    g = torch.Generator().manual_seed(0)
    PAD, START, EOS, L = 0, 1, 2, 12
    windows = torch.randint(5, 50, (500, L), generator=g)
    b = obj.encoder_decoder_lm(windows, g, pad_id=PAD, start_id=START, eos_id=EOS)
    for r in range(500):
        cut = int(b["prefix_lengths"][r])
        n_src, n_tgt = int(b["src_mask"][r].sum()), int(b["tgt_mask"][r].sum())
        src, labels = b["src_ids"][r, :n_src].tolist(), b["labels"][r, :n_tgt].tolist()
        assert n_src == cut + 1 and n_tgt == L - cut + 1
        assert src[-1] == EOS and labels[-1] == EOS
        assert src[:-1] + labels[:-1] == windows[r].tolist()  # source + target = the window
        assert b["tgt_ids"][r, 0] == START and b["tgt_ids"][r, 1:n_tgt].tolist() == labels[:-1]  # shifted by one
        assert (b["labels"][r, n_tgt:] == IGNORE).all() and (b["src_ids"][r, n_src:] == PAD).all()


@pytest.mark.parametrize("min_prefix,min_target", [(1, 1), (3, 2)])
def test_encoder_decoder_lm_cut_is_uniform(min_prefix, min_target):
    g = torch.Generator().manual_seed(3)
    L, draws = 9, 6000
    windows = torch.randint(5, 50, (draws, L), generator=g)
    b = obj.encoder_decoder_lm(windows, g, pad_id=0, start_id=1, eos_id=2, min_prefix=min_prefix,
                               min_target=min_target)
    cuts = b["prefix_lengths"]
    values = list(range(min_prefix, L - min_target + 1))
    assert int(cuts.min()) == values[0] and int(cuts.max()) == values[-1]
    counts = torch.bincount(cuts, minlength=L + 1)[values].double()
    expected = draws / len(values)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.4  # the 99.9% point of chi-square with <= 7 degrees of freedom is 24.3


def test_encoder_decoder_lm_rejects_cuts_that_leave_a_side_empty():
    with pytest.raises(ValueError, match="min_prefix and min_target"):
        obj.encoder_decoder_lm(torch.zeros(2, 4, dtype=torch.long), torch.Generator(), pad_id=0, start_id=0, eos_id=1,
                               min_prefix=2, min_target=3)
