"""Reading fine-tuning examples: labels that differ only by surrounding spaces are one class
(with one warning per file), and a CSV/TSV row with more fields than its header is refused
(its extra fields would be dropped)."""

import json
import warnings

import pytest

from attnlab.finetune.data import LabelMap, read_examples
from attnlab.finetune.tokens import read_word_examples


def _read(reader, path, **columns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        examples = reader(path, **columns)
    return examples, [str(w.message) for w in caught]


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl"])
def test_labels_with_stray_spaces_are_one_class_and_warned_once(tmp_path, suffix):
    rows = [("the cat", " pos"), ("a dog", "pos "), ("sun", "neg"), ("moon", "pos"), ("star", "\tneg ")]
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows), encoding="utf-8")
    elif suffix == ".csv":
        path.write_text("text,label\n" + "".join(f'{t},"{y}"\n' for t, y in rows), encoding="utf-8")
    else:
        cells = [(t, y.lstrip("\t")) for t, y in rows]  # a TSV cell holds no tab
        path.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in cells), encoding="utf-8")
    examples, caught = _read(read_examples, path)
    assert [e.label for e in examples] == ["pos", "pos", "neg", "pos", "neg"]
    assert LabelMap.from_examples(examples).labels == ["neg", "pos"]
    assert caught == [f"{path}: 3 label(s) had spaces around them (e.g. ' pos'); they are read without, "
                      "so ' pos' and 'pos' are one class"]


def test_clean_labels_raise_no_warning(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("text,label\nthe cat,pos\nsun,neg\n", encoding="utf-8")
    examples, caught = _read(read_examples, path)
    assert [e.label for e in examples] == ["pos", "neg"] and caught == []
    examples, caught = _read(read_examples, path, label_column=None)  # unlabelled: nothing to strip
    assert examples[0].label is None and caught == []


def test_word_labels_with_stray_spaces_are_stripped_too(tmp_path):
    path = tmp_path / "tags.jsonl"
    rows = [{"words": ["red", "cat"], "labels": ["C ", "A"]}, {"words": ["sun"], "labels": [" A"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    examples, caught = _read(read_word_examples, path)
    assert [e.labels for e in examples] == [["C", "A"], ["A"]]
    assert len(caught) == 1 and caught[0].startswith(f"{path}: 2 label(s) had spaces around them (e.g. 'C ')")


@pytest.mark.parametrize("suffix, line, cause", [
    (".tsv", "the cat\tpos\tfrom the web", "a tab inside a text?"),
    (".csv", "the cat, the dog,pos", "a comma inside a text that is not in double quotes?"),
])
def test_a_row_with_more_fields_than_the_header_is_refused(tmp_path, suffix, line, cause):
    sep = "\t" if suffix == ".tsv" else ","
    path = tmp_path / f"train{suffix}"
    path.write_text(f"text{sep}label\nsun{sep}neg\n{line}\n", encoding="utf-8")
    for reader in (read_examples, read_word_examples):
        with pytest.raises(ValueError) as err:
            reader(path, **({"words_column": "text", "labels_column": "label"} if reader is read_word_examples else {}))
        assert str(err.value).startswith(f"{path}: row 3 has 3 fields, but the header names 2 columns (text, label)")
        assert cause in str(err.value)


def test_extra_columns_the_header_names_are_read_past(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("id\ttext\tlabel\tsource\n1\tthe cat\tpos\tweb\n", encoding="utf-8")
    assert [(e.text, e.label) for e in read_examples(path)] == [("the cat", "pos")]
