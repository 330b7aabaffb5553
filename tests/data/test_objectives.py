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
