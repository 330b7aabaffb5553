"""Reading training corpora and counting words."""

from __future__ import annotations

import io
import random
import tracemalloc
from pathlib import Path

import pytest

from attnlab.tokenizers import Tokenizer, corpus
from attnlab.tokenizers.corpus import count_words, iter_sequences
from attnlab.tokenizers.training import DEFAULT_SPECIAL_TOKENS
from tokenizer_samples import training_corpus


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


def test_files_read_in_chunks_give_their_lines(tmp_path: Path):
    """Chunks of any size, even smaller than a line, give the lines Python's own line reading
    gives (line ends \\n, \\r\\n and \\r kept, the last line without one)."""
    path = tmp_path / "a.txt"
    path.write_text("first\nsecond\r\n\r\nthird\rfourth  \n\nlast, with é and 中文", encoding="utf-8", newline="")
    with open(path, encoding="utf-8", newline="") as handle:
        expected = list(handle)
    assert len(expected) == 7
    for chunk_chars in (1, 2, 5, 64, None):
        assert list(iter_sequences(path, chunk_chars)) == expected


def test_training_from_a_file_read_in_chunks_equals_training_in_memory(tmp_path: Path, monkeypatch):
    text = "".join(training_corpus())
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8", newline="")
    lines = list(io.StringIO(text, newline=""))  # the file's lines, as Python splits them
    in_memory = Tokenizer.train(lines, kind="bpe", vocab_size=1500)
    monkeypatch.setattr(corpus, "CHUNK_CHARS", 100)  # some 1,500 chunks
    monkeypatch.setattr(corpus, "FLUSH_WORDS", 50)
    from_disk = Tokenizer.train(path, kind="bpe", vocab_size=1500)
    assert from_disk.model.merges == in_memory.model.merges
    assert from_disk.get_vocab() == in_memory.get_vocab()


def _peak_counting_memory(path: Path) -> int:
    tracemalloc.start()
    try:
        count_words(path, str.split)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_counting_memory_does_not_grow_with_the_corpus(tmp_path: Path, monkeypatch):
    """Counting holds a chunk of lines and the distinct words, not the corpus: four times the
    text (the same words) takes no more memory, and far less than the text itself."""
    monkeypatch.setattr(corpus, "CHUNK_CHARS", 1 << 14)
    monkeypatch.setattr(corpus, "FLUSH_WORDS", 1 << 10)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    lines = [" ".join(rng.choices(words, k=12)) + "\n" for _ in range(8000)]  # ~0.5 MB
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text("".join(lines))
    large.write_text("".join(lines * 4))
    small_peak, large_peak = _peak_counting_memory(small), _peak_counting_memory(large)
    assert large_peak < 1.2 * small_peak + (64 << 10)
    assert large_peak < large.stat().st_size / 4


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "char", "word"])
@pytest.mark.parametrize("content", ["", "\n\n  \n\t\n"], ids=["empty", "blank"])
def test_a_corpus_without_text_is_refused_naming_it(tmp_path: Path, kind, content):
    special = DEFAULT_SPECIAL_TOKENS[kind][-1]
    (tmp_path / "a.txt").write_text(content, encoding="utf-8")
    (tmp_path / "b.txt").write_text("", encoding="utf-8")
    for given, named in [(str(tmp_path / "a.txt"), repr(str(tmp_path / "a.txt"))),
                         ([tmp_path / "a.txt", tmp_path / "b.txt"], f"{str(tmp_path / 'a.txt')!r}, "
                                                                     f"{str(tmp_path / 'b.txt')!r}"),
                         ([content, " "], "texts_or_files (the texts given)"),
                         ((t for t in [content, special]), "texts_or_files (the texts given)")]:  # specials are no text
        with pytest.raises(ValueError) as err:
            Tokenizer.train(given, kind=kind)
        assert str(err.value) == f"{named}: no text (empty, or whitespace only); nothing to train a {kind} tokenizer on"
    assert Tokenizer.train(["\n x \n"], kind=kind).vocab_size > 0  # one character of text is enough
