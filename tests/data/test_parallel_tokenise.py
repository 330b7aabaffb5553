"""Tokenising a corpus into token files on several processes gives the files of one process.

(The tests of ``attnlab/data/tokenized.py``'s parallel build: the encoder is a trained BPE
tokenizer, as in the training pipeline.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnlab.data import tokenized
from attnlab.data.tokenized import TokenFile
from attnlab.tokenizers import Tokenizer
from tests.tokenizers.tokenizer_samples import training_corpus


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train(training_corpus(), kind="bpe", vocab_size=800)


def _documents() -> list[tuple[str, bool]]:
    """Streamed `(piece, ends_document)` pairs: documents cut in two, and whole ones."""
    lines = training_corpus()
    pieces = []
    for start in range(0, len(lines), 40):
        text = "".join(lines[start:start + 40])
        half = len(text) // 2
        pieces += [(text[:half], False), (text[half:], True)] if start % 80 else [(text, True)]
    return pieces


def _files(prefix: Path) -> list[bytes]:
    return [prefix.with_suffix(ext).read_bytes() for ext in (".bin", ".idx", ".json")]


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_write_the_files_of_one_process(tmp_path: Path, monkeypatch, tokenizer, workers):
    monkeypatch.setattr(tokenized, "BATCH_CHARS", 4096)  # ~40 batches of this ~150 kB corpus
    pids = tmp_path / "pids"

    def encode(text: str) -> list[int]:
        with open(pids, "a") as f:  # (appends from several processes: whole short lines)
            f.write(f"{os.getpid()}\n")
        return tokenizer.encode(text)

    one = TokenFile.build(tmp_path / "one", _documents(), tokenizer.encode, tokenizer.vocab_size,
                          eos_id=tokenizer.eos_token_id, show_progress=False, workers=1)
    many = TokenFile.build(tmp_path / "many", _documents(), encode, tokenizer.vocab_size,
                           eos_id=tokenizer.eos_token_id, show_progress=False, workers=workers)
    assert _files(tmp_path / "many") == _files(tmp_path / "one")
    assert len(one) > 30_000 and many.num_documents == one.num_documents
    assert len(set(pids.read_text().split()) - {str(os.getpid())}) == workers  # each worker encoded


def test_a_worker_error_is_raised_and_leaves_nothing(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tokenized, "BATCH_CHARS", 10)
    pieces = [f"document {i}" for i in range(50)]

    def encode(text: str) -> list[int]:
        return [999] if text == "document 37" else [1, 2]

    with pytest.raises(ValueError, match=r"outside \[0, 256\)"):
        TokenFile.build(tmp_path / "t", pieces, encode, 256, show_progress=False, workers=2)
    assert list(tmp_path.iterdir()) == []


def test_small_text_encodes_in_this_process(tmp_path: Path):
    pids = []
    TokenFile.build(tmp_path / "t", ["a few words"], lambda text: pids.append(os.getpid()) or [1], 256,
                    show_progress=False, workers=4)
    assert pids == [os.getpid()]


def test_bad_workers_are_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="workers must be a positive int"):
        TokenFile.build(tmp_path / "t", ["x"], lambda text: [1], 256, show_progress=False, workers=0)
    assert not list(tmp_path.iterdir())
