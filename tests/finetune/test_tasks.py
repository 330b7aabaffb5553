"""Task builders: deterministic from a seed, balanced, no sentence across splits, hard negatives."""

import csv

import pytest

from attnlab.data.corpora import DOC_SEPARATOR
from attnlab.finetune.tasks import lexicon_pairs, shakespeare_plays, translation_pairs, ui_translation_pairs


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


def test_ui_translation_pairs_drop_untranslated_and_one_word_strings(tmp_path):
    src = _pairs_file(tmp_path / "p.tsv")
    with src.open("a", encoding="utf-8") as f:  # untranslated, one word: never in the task
        f.write("Open PDF export settings\tOpen PDF export settings\nSave\tSpeichern\n")
    a = ui_translation_pairs(tmp_path / "a", seed=1, n_train=30, n_valid=5, n_test=5, source=src)
    b = ui_translation_pairs(tmp_path / "b", seed=1, n_train=30, n_valid=5, n_test=5, source=src)
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in a)
    rows = [r for s in a for r in _rows(a[s])]
    assert len(rows) == 80 and sum(r["label"] == "1" for r in rows) == 40
    texts = {r["text"] for r in rows} | {r["text_pair"] for r in rows}
    assert not texts & {"Open PDF export settings", "Save", "Speichern"}
    with pytest.raises(ValueError, match="40 distinct pairs; 41 requested"):
        ui_translation_pairs(tmp_path / "c", n_train=31, n_valid=5, n_test=5, source=src)
    with pytest.raises(ValueError, match="min_words"):
        ui_translation_pairs(tmp_path / "c", min_words=0, source=src)


def test_lexicon_pairs_keep_short_entries_of_known_words(tmp_path):
    words = ["cat", "dog", "red", "blue", "car", "house", "tree", "sun", "moon", "star", "sea", "well-known"]
    lines = [f"{w}\t{w.upper()}-de" for w in words] + [f"{a} {b}\t{a}-{b}-de" for a in words[:6] for b in words[6:]]
    lines += ["cat dog car\tdrei", "zebra\tZebra-de", "cat 2\tKatze 2", "C++ code\tCode"]  # too long, unknown, digits
    src = tmp_path / "lex.tsv"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "well", "known", *words[:10]]) + "\n", encoding="utf-8")  # not "sea"
    a = lexicon_pairs(tmp_path / "a", n_train=33, n_valid=4, n_test=4, vocabulary=vocab, source=src)
    kept = {r["text"] for s in a for r in _rows(a[s])}
    assert len(kept) == 41 and "well-known" in kept and "house well-known" in kept  # 11 words + 6 x 5 pairs
    assert not kept & {"sea", "house sea", "cat dog car", "zebra", "cat 2", "C++ code"}
    with pytest.raises(ValueError, match="42 requested"):
        lexicon_pairs(tmp_path / "b", n_train=34, n_valid=4, n_test=4, vocabulary=vocab, source=src)
    every = lexicon_pairs(tmp_path / "c", n_train=41, n_valid=4, n_test=4, source=src)  # no vocabulary: 49
    assert "zebra" in {r["text"] for s in every for r in _rows(every[s])}


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
