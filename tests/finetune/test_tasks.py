"""Task builders: deterministic from a seed, balanced, no sentence across splits, hard negatives."""

import csv

import pytest

from attnlab.data.corpora import DOC_SEPARATOR
from attnlab.finetune.tasks import shakespeare_plays, translation_pairs


def _pairs_file(path, n=40):
    lines = [f"english sentence number {i} {'x' * (i % 7 + 1)}\tdeutscher satz nummer {i} {'y' * (i % 5 + 1)}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rows(path):
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_translation_pairs_are_deterministic_balanced_and_split_by_sentence(tmp_path):
    src = _pairs_file(tmp_path / "p.tsv")
    a = translation_pairs(tmp_path / "a", seed=3, n_train=20, n_valid=5, n_test=5, source=src, hard_fraction=1.0)
    b = translation_pairs(tmp_path / "b", seed=3, n_train=20, n_valid=5, n_test=5, source=src, hard_fraction=1.0)
    c = translation_pairs(tmp_path / "c", seed=4, n_train=20, n_valid=5, n_test=5, source=src, hard_fraction=1.0)
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in a)
    assert a["train"].read_bytes() != c["train"].read_bytes()
    truth = dict(line.split("\t") for line in src.read_text(encoding="utf-8").splitlines())
    english = {}
    for split, path in a.items():
        rows = _rows(path)
        assert sum(r["label"] == "1" for r in rows) == sum(r["label"] == "0" for r in rows) == len(rows) // 2
        pool = {r["text_pair"] for r in rows if r["label"] == "1"}  # the split's own German sentences
        for r in rows:
            own = truth[r["text"]]
            assert (own == r["text_pair"]) == (r["label"] == "1")
            if r["label"] == "0":  # hard negative: the nearest German length among the split's other pairs
                assert r["text_pair"] in pool
                assert abs(len(r["text_pair"]) - len(own)) == min(abs(len(de) - len(own)) for de in pool - {own})
        english[split] = {r["text"] for r in rows}
    assert not (english["train"] & english["valid"]) and not (english["train"] & english["test"])
    with pytest.raises(ValueError, match="distinct pairs"):
        translation_pairs(tmp_path / "d", n_train=100, source=src)


def test_shakespeare_plays_balanced_and_deterministic(tmp_path):
    plays = []
    for title in ("Alpha", "Beta", "Gamma"):
        lines = [f"{title.upper()}:"] + [f"this is {title} line number {i} of the play" for i in range(30)]
        plays.append(title + "\n\nACT I\n\n" + "\n".join(lines))
    src = tmp_path / "train.txt"
    src.write_text(DOC_SEPARATOR.join(plays), encoding="utf-8")
    a = shakespeare_plays(tmp_path / "a", plays=["Alpha", "Gamma"], n_train=10, n_valid=3, n_test=4, source=src)
    b = shakespeare_plays(tmp_path / "b", plays=["Alpha", "Gamma"], n_train=10, n_valid=3, n_test=4, source=src)
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in a)
    rows = _rows(a["train"])
    assert sorted({r["label"] for r in rows}) == ["Alpha", "Gamma"] and len(rows) == 20
    assert all(r["text"].startswith(f"this is {r['label']}") for r in rows)
    seen = [r["text"] for s in a for r in _rows(a[s])]
    assert len(seen) == len(set(seen)) == 34
    with pytest.raises(ValueError, match="'Delta' is not in"):
        shakespeare_plays(tmp_path / "c", plays=["Alpha", "Delta"], n_train=5, n_valid=2, n_test=2,
                          source=src)


def test_train_hard_fraction_changes_only_the_training_split(tmp_path):
    src = _pairs_file(tmp_path / "p.tsv", n=60)
    base = translation_pairs(tmp_path / "a", seed=1, n_train=30, n_valid=10, n_test=10, source=src, hard_fraction=0.0)
    hard = translation_pairs(tmp_path / "b", seed=1, n_train=30, n_valid=10, n_test=10, source=src, hard_fraction=0.0,
                             train_hard_fraction=1.0)
    assert base["valid"].read_bytes() == hard["valid"].read_bytes()
    assert base["test"].read_bytes() == hard["test"].read_bytes()
    truth = dict(line.split("\t") for line in src.read_text(encoding="utf-8").splitlines())
    rows = _rows(hard["train"])
    pool = {r["text_pair"] for r in rows if r["label"] == "1"}
    for r in rows:
        if r["label"] == "0":  # every training negative is the nearest German length
            own = truth[r["text"]]
            assert abs(len(r["text_pair"]) - len(own)) == min(abs(len(de) - len(own)) for de in pool - {own})
    with pytest.raises(ValueError, match="train_hard_fraction"):
        translation_pairs(tmp_path / "c", source=src, n_train=30, n_valid=10, n_test=10, train_hard_fraction=1.5)
