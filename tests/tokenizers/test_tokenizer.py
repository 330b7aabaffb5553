"""The Tokenizer API: training arguments, vocabulary access, decoding, atomic saving."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import attnlab.io.files as files_module
from attnlab.tokenizers import Tokenizer

CORPUS = ["the cat sat on the mat\n", "the dog sat on the log\n"] * 10


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "char", "word"])
def test_every_kind_trains_and_round_trips(kind):
    size = {"bpe": 300, "wordpiece": 100, "char": None, "word": None}[kind]
    tok = Tokenizer.train(CORPUS, kind=kind, vocab_size=size)
    assert tok.kind == kind and len(tok) == tok.vocab_size
    ids = tok.encode("the cat sat")
    assert tok.decode(ids) == "the cat sat"
    assert all(tok.id_to_token(i) is not None for i in ids)
    assert [tok.token_to_id(t) for t in tok.tokenize("the cat sat")] == ids


def test_trained_bpe_learns_words():
    tok = Tokenizer.train(CORPUS, kind="bpe", vocab_size=300)
    assert tok.tokenize("the cat") == ["the", "Ġcat"]
    assert tok.encode("") == []


def test_bad_training_arguments_name_the_argument(tmp_path: Path):
    cases = [
        (dict(kind="sentencepiece"), ValueError, "kind"),
        (dict(kind="bpe", vocab_size=100), ValueError, "vocab_size"),
        (dict(kind="bpe", vocab_size=0), ValueError, "vocab_size"),
        (dict(kind="bpe", vocab_size="1000"), TypeError, "vocab_size"),
        (dict(kind="bpe", min_frequency=-1), ValueError, "min_frequency"),
        (dict(kind="bpe", special_tokens=[""]), ValueError, "special_tokens"),
        (dict(kind="bpe", special_tokens="<s>"), TypeError, "special_tokens"),
        (dict(kind="bpe", special_tokens={"beginning": "<s>"}), ValueError, "role"),
        (dict(kind="bpe", pattern="(unclosed"), ValueError, "pattern"),
    ]
    for kwargs, error, name in cases:
        with pytest.raises(error, match=name):
            Tokenizer.train(CORPUS, **kwargs)
    with pytest.raises(ValueError, match="texts_or_files"):
        Tokenizer.train([tmp_path / "missing.txt"])
    with pytest.raises(ValueError, match="texts_or_files"):
        Tokenizer.train([b"bytes"])
    with pytest.raises(TypeError, match="texts_or_files"):
        Tokenizer.train(42)


def test_encode_and_decode_errors(gpt2_shared):
    with pytest.raises(TypeError, match="text"):
        gpt2_shared.encode(["not", "a", "string"])
    with pytest.raises(ValueError, match="ids: 50257"):
        gpt2_shared.decode([50257])
    with pytest.raises(TypeError, match="ids"):
        gpt2_shared.decode(["1"])
    assert gpt2_shared.token_to_id("no such token") is None
    assert gpt2_shared.id_to_token(10**9) is None


def test_decode_accepts_tensors(gpt2_shared):
    import torch
    ids = torch.tensor([[15496, 995, 0], [15496, 995, 0]])
    assert gpt2_shared.decode(ids[0]) == "Hello world!"
    assert gpt2_shared.decode_batch(ids) == ["Hello world!"] * 2


def test_save_paths(tmp_path: Path):
    tok = Tokenizer.train(CORPUS, kind="char")
    assert tok.save(tmp_path / "folder") == tmp_path / "folder" / "tokenizer.json"
    assert tok.save(tmp_path / "named.json") == tmp_path / "named.json"
    assert Tokenizer.load(tmp_path / "folder").encode("cat") == tok.encode("cat")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ValueError, match="path"):
        tok.save(tmp_path / "dir.json")


def test_save_is_atomic(tmp_path: Path, monkeypatch):
    old = Tokenizer.train(["abc"] * 3, kind="char")
    target = old.save(tmp_path / "tok.json")
    before = target.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files_module.os, "replace", broken_replace)
    new = Tokenizer.train(CORPUS, kind="char")
    with pytest.raises(OSError, match="disk full"):
        new.save(target)
    assert target.read_bytes() == before  # the old file is whole
    assert sorted(os.listdir(tmp_path)) == ["tok.json"]  # and no temporary file is left


def test_constructor_checks_ids(gpt2_shared):
    from attnlab.tokenizers import AddedToken

    with pytest.raises(ValueError, match="added_tokens"):
        Tokenizer(gpt2_shared.model, added_tokens=[AddedToken("<|endoftext|>", 3)])
    with pytest.raises(ValueError, match="roles"):
        Tokenizer(gpt2_shared.model, roles={"pad": "<never-added>"})
    with pytest.raises(ValueError, match="cls, sep"):
        Tokenizer(gpt2_shared.model, template="bert")
    with pytest.raises(TypeError, match="model"):
        Tokenizer("gpt2")


def test_repr_names_kind_and_roles(bert_shared):
    assert repr(bert_shared).startswith("Tokenizer(kind='wordpiece', vocab_size=30522, template='bert'")


def test_a_template_the_special_tokens_cannot_fill_fails_before_training(monkeypatch):
    import attnlab.tokenizers.tokenizer as module

    def never(*args, **kwargs):
        raise AssertionError("trained before checking the template")

    monkeypatch.setattr(module, "train_tokenizer", never)
    with pytest.raises(ValueError, match="'bert' needs special tokens for the roles cls, sep"):
        Tokenizer.train(["some text"], kind="char", template="bert")
    with pytest.raises(ValueError, match="'bert' needs"):
        Tokenizer.train(["some text"], kind="bpe", special_tokens={"eos": "</s>"}, template="bert")
