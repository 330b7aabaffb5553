"""Length-bucketed batches of sentence pairs (attnlab.data.buckets) and `data.batch_tokens`."""

import numpy as np
import pytest
import torch

from attnlab.data.buckets import bucketed_batch, length_order


def _lengths(n=3000, seed=0):
    rng = np.random.default_rng(seed)  # verse-like: a long right tail
    src = np.clip(rng.lognormal(3.3, 0.45, n).astype(int), 1, 97)
    return src, np.clip((src * rng.uniform(0.8, 1.25, n)).astype(int), 1, 97)


def _cost(index, src, tgt):
    return len(index) * (src[index].max() + tgt[index].max())


def test_every_batch_fits_the_budget_and_is_a_run_of_the_length_order():
    src, tgt = _lengths()
    order = length_order(src, tgt)
    assert np.all(np.diff((src + tgt)[order]) >= 0)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    g = torch.Generator().manual_seed(0)
    sizes = []
    for _ in range(300):
        index = bucketed_batch(order, src, tgt, 2048, g)
        assert _cost(index, src, tgt) <= 2048 and len(set(index.tolist())) == len(index)
        positions = np.sort(rank[index])
        assert np.all(np.diff(positions) == 1)  # neighbours in the order, no gaps
        # full: the next pair above and below would not fit
        for nxt in (positions[0] - 1, positions[-1] + 1):
            if 0 <= nxt < len(order):
                assert _cost(np.append(index, order[nxt]), src, tgt) > 2048
        sizes.append(len(index))
    assert min(sizes) < 25 < max(sizes)  # long pairs few to a batch, short pairs many


def test_buckets_waste_far_less_on_padding_than_random_batches():
    src, tgt = _lengths()
    order, g = length_order(src, tgt), torch.Generator().manual_seed(1)
    real = lambda index: (src[index].sum() + tgt[index].sum()) / _cost(index, src, tgt)
    bucketed = np.mean([real(bucketed_batch(order, src, tgt, 2048, g)) for _ in range(200)])
    rng = np.random.default_rng(0)
    random = np.mean([real(rng.integers(0, len(src), 32)) for _ in range(200)])
    assert random < 0.65 and bucketed > 0.9


def test_the_generator_decides_the_batch_and_every_pair_can_be_drawn():
    src, tgt = _lengths(200)
    order = length_order(src, tgt)
    draw = lambda seed: bucketed_batch(order, src, tgt, 512, torch.Generator().manual_seed(seed)).tolist()
    assert draw(3) == draw(3)
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(400):
        seen.update(bucketed_batch(order, src, tgt, 512, g).tolist())
    assert seen == set(range(200))


def test_a_pair_longer_than_the_budget_comes_alone_and_bad_input_is_refused():
    src, tgt = np.array([5, 90, 6]), np.array([5, 90, 7])
    order = length_order(src, tgt)
    g = torch.Generator().manual_seed(0)
    batches = [bucketed_batch(order, src, tgt, 100, g).tolist() for _ in range(30)]
    assert [1] in batches and all(1 not in b or b == [1] for b in batches)
    with pytest.raises(ValueError, match="positive"):
        bucketed_batch(order, src, tgt, 0, g)
    with pytest.raises(ValueError, match="as many source as target"):
        length_order(src, tgt[:2])


def _seq2seq_config(tmp_path, **data):
    from attnlab.training.config import TrainConfig

    words = "the a cat dog sat ran on under mat log red big small".split()
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(400):
        sentence = " ".join(rng.choice(words, int(rng.integers(1, 12))))
        rows.append(f"{sentence}\t{sentence.upper()}\n")
    (tmp_path / "pairs.tsv").write_text("".join(rows), encoding="utf-8")
    return TrainConfig.from_dict({
        "model": {"preset": "tiny-encoder-decoder", "d_model": 16, "num_layers": 1, "num_heads": 2, "d_ff": 32,
                  "position": {"max_len": 128}},  # a side of a pair is max_pair_len + 1 tokens
        "data": {"source": str(tmp_path / "pairs.tsv"), "valid": str(tmp_path / "pairs.tsv"), "objective": "seq2seq",
                 "batch_size": 4, "max_pair_len": 80, "tokenizer": {"kind": "char"}, **data},
        "train": {"out_dir": str(tmp_path / "run"), "max_steps": 2, "eval_every": 2, "eval_batches": 1,
                  "log_every": 1, "checkpoint_every": 2, "bleu_samples": 0, "seed": 0, "threads": 1}})


def test_batch_tokens_makes_the_training_batches_of_a_seq2seq_run(tmp_path):
    from attnlab.training.trainer import Trainer

    trainer = Trainer(_seq2seq_config(tmp_path, batch_tokens=600), show_progress=False, log=lambda _: None)
    g = torch.Generator().manual_seed(0)
    rows, shares = set(), []
    for _ in range(20):
        batch = trainer.pipeline.train_batch(g)
        padded = batch["src_ids"].numel() + batch["tgt_ids"].numel()
        assert padded <= 600
        shares.append(int(batch["src_mask"].sum() + batch["tgt_mask"].sum()) / padded)
        rows.add(len(batch["src_ids"]))
    assert np.mean(shares) > 0.85  # real tokens per padded token
    assert len(rows) > 2  # the row count follows the lengths
    assert trainer.fit()["steps"] == 2
    assert all(len(b["src_ids"]) <= 4 for b in trainer.pipeline.eval_batches(2))  # validation keeps batch_size


def test_batch_tokens_is_refused_where_batches_are_not_pairs(tmp_path):
    from attnlab.training.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="data.batch_tokens.*needs data.objective='seq2seq' or 'pairs_lm', got 'causal_lm'"):
        TrainConfig.from_dict({"data": {"objective": "causal_lm", "batch_tokens": 1024}})
    with pytest.raises(ConfigError, match="data.batch_tokens"):
        _seq2seq_config(tmp_path, batch_tokens=0)
