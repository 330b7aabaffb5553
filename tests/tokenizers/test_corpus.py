"""Reading training corpora and counting words."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.tokenizers.corpus import count_words, iter_sequences


def test_texts_paths_and_single_paths(tmp_path: Path):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\r\nthree", encoding="utf-8", newline="")
    assert list(iter_sequences(["x", "y"])) == ["x", "y"]  # strings in a list are text
    assert list(iter_sequences(path)) == ["one\n", "two\r\n", "three"]  # line ends kept
    assert list(iter_sequences(str(path))) == ["one\n", "two\r\n", "three"]  # a lone str is a path
    assert list(iter_sequences([path, "text"])) == ["one\n", "two\r\n", "three", "text"]
    assert list(iter_sequences(iter(["gen"]))) == ["gen"]
    with pytest.raises(ValueError, match="not a file"):
        list(iter_sequences(tmp_path / "missing.txt"))


def test_count_words_skips_special_tokens():
    counts = count_words(["a b<eos>a", "b"], str.split, special_tokens=["<eos>"])
    assert counts == {"a": 2, "b": 2}
