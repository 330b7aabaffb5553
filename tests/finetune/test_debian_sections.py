"""The which-section task: balanced per section, held-out texts from the corpus's valid side only."""

import csv

import pytest

from attnlab.finetune.tasks import debian_sections


def _tsv(path, rows):
    path.write_text("".join(f"{t}\t{s}\n" for t, s in rows), encoding="utf-8")
    return path


def test_rows_are_balanced_and_held_out_rows_come_from_the_valid_side(tmp_path):
    train = [(f"a {s} tool number {i}", s) for s in ("games", "sound", "admin") for i in range(12)]
    valid = [(f"another {s} program {i}", s) for s in ("games", "sound", "admin") for i in range(6)]
    source = {"train": _tsv(tmp_path / "train.tsv", train), "valid": _tsv(tmp_path / "valid.tsv", valid)}
    paths = debian_sections(tmp_path / "task", sections=("games", "sound"), seed=3, n_train=10, n_valid=2,
                            n_test=4, source=source)
    read = {k: list(csv.DictReader(open(v, encoding="utf-8"))) for k, v in paths.items()}
    assert [len(read[k]) for k in ("train", "valid", "test")] == [20, 4, 8]
    for split, rows in read.items():
        assert {r["label"] for r in rows} == {"games", "sound"}
        assert sum(r["label"] == "games" for r in rows) == len(rows) // 2
    held = {t for t, _ in valid}
    assert all(r["text"] in held for r in read["valid"] + read["test"])
    assert not {r["text"] for r in read["valid"]} & {r["text"] for r in read["test"]}
    assert all(r["text"] not in held for r in read["train"])
    again = debian_sections(tmp_path / "again", sections=("games", "sound"), seed=3, n_train=10, n_valid=2,
                            n_test=4, source=source)
    assert all(paths[k].read_bytes() == again[k].read_bytes() for k in paths)


def test_too_few_descriptions_or_sections_are_refused(tmp_path):
    source = {"train": _tsv(tmp_path / "train.tsv", [("x y", "games")] * 3),
              "valid": _tsv(tmp_path / "valid.tsv", [("z w", "games")])}
    with pytest.raises(ValueError, match="at least 2 distinct"):
        debian_sections(tmp_path / "t", sections=("games",), source=source)
    with pytest.raises(ValueError, match="'games' has 3 training and 1 held-out"):
        debian_sections(tmp_path / "t", sections=("games", "sound"), n_train=2, n_valid=1, n_test=1, source=source)
