"""Tokenizer.load reads every layout people have, and says what it expected when it cannot."""

from __future__ import annotations

import json
import shutil

import pytest

from attnlab.tokenizers import Tokenizer
from tokenizer_samples import VARIED_TEXTS


def test_gpt2_release_folder(gpt2_dir, gpt2_shared):
    assert Tokenizer.load(gpt2_dir).encode_batch(VARIED_TEXTS) == gpt2_shared.encode_batch(VARIED_TEXTS)
    assert Tokenizer.load(gpt2_dir / "encoder.json").encode("Hello world!") == [15496, 995, 0]


def test_vocab_json_and_merges_txt(gpt2_dir, gpt2_shared, tmp_path):
    shutil.copy(gpt2_dir / "encoder.json", tmp_path / "vocab.json")
    shutil.copy(gpt2_dir / "vocab.bpe", tmp_path / "merges.txt")
    for path in (tmp_path, tmp_path / "vocab.json"):
        tok = Tokenizer.load(path)
        assert tok.encode_batch(VARIED_TEXTS) == gpt2_shared.encode_batch(VARIED_TEXTS)
        assert tok.roles == {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}


def test_vocab_txt_file_and_folder(bert_dir, bert_shared, tmp_path):
    shutil.copy(bert_dir / "vocab.txt", tmp_path / "vocab.txt")
    folder = Tokenizer.load(tmp_path)  # no config: uncased is guessed from the vocabulary
    assert folder.model.lowercase
    assert folder.encode_batch(VARIED_TEXTS) == bert_shared.encode_batch(VARIED_TEXTS)
    assert folder.vocab_size == 30522
    assert [folder.pad_token_id, folder.unk_token_id, folder.cls_token_id, folder.sep_token_id,
            folder.mask_token_id] == [0, 100, 101, 102, 103]


def test_vocab_txt_config_and_override(bert_dir, tmp_path):
    shutil.copy(bert_dir / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    assert not Tokenizer.load(tmp_path / "vocab.txt").model.lowercase
    assert Tokenizer.load(tmp_path / "vocab.txt", lowercase=True).model.lowercase


def test_cased_vocab_is_guessed(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nHello\nhello\n##s\n", encoding="utf-8")
    tok = Tokenizer.load(tmp_path / "vocab.txt")
    assert not tok.model.lowercase
    assert tok.encode("Hello hellos HELLO") == [4, 5, 6, 1]


def test_folder_without_tokenizer_files(tmp_path):
    (tmp_path / "notes.md").write_text("nothing here", encoding="utf-8")
    with pytest.raises(ValueError, match=r"path: no tokenizer files.*tokenizer\.json.*vocab\.txt"):
        Tokenizer.load(tmp_path)


def test_other_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        Tokenizer.load(tmp_path / "missing.json")
    (tmp_path / "model.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match="path: cannot tell"):
        Tokenizer.load(tmp_path / "model.bin")
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        Tokenizer.load(tmp_path / "broken.json")
    (tmp_path / "vocab.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="merges.txt"):
        Tokenizer.load(tmp_path / "vocab.json")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2"):
        Tokenizer.load(tmp_path)
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        Tokenizer.load(tmp_path / "empty.txt")
