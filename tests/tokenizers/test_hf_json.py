"""tokenizer.json both ways: what attnlab writes, Hugging Face reads and encodes identically;
what Hugging Face writes, attnlab reads and encodes identically; attnlab's save is lossless."""

from __future__ import annotations

import json

import pytest
import tokenizers as hf

from attnlab.tokenizers import Tokenizer
from tokenizer_samples import VARIED_TEXTS, training_corpus
SAMPLES = VARIED_TEXTS + ["with <|endoftext|> and [CLS] x [SEP] [MASK] <pad> inside"]
PAIRS = [("first part", "second part"), ("Hello, world!", "")]


@pytest.fixture(scope="module")
def corpus():
    return training_corpus()


def assert_same_encodings(ours: Tokenizer, theirs) -> None:
    for text in SAMPLES:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids, text
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text).ids, text
    for a, b in PAIRS:
        encoding = theirs.encode(a, b)
        assert ours(a, b)["input_ids"] == encoding.ids
        assert ours(a, b)["token_type_ids"] == encoding.type_ids
    ids = ours.encode(SAMPLES[2] + SAMPLES[9])
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False)


def hf_reads(tok: Tokenizer, tmp_path):
    path = tok.save(tmp_path / "saved")
    return hf.Tokenizer.from_file(str(path))


def assert_lossless(tok: Tokenizer, tmp_path) -> None:
    again = Tokenizer.load(tok.save(tmp_path / "lossless.json"))
    assert again.to_dict() == tok.to_dict()
    assert again.roles == tok.roles and again.template == tok.template
    assert again.encode_batch(SAMPLES) == tok.encode_batch(SAMPLES)


@pytest.mark.parametrize("kind, size", [("bpe", 600), ("wordpiece", 600), ("char", None), ("word", 600)])
def test_attnlab_files_load_in_hf(corpus, tmp_path, kind, size):
    tok = Tokenizer.train(corpus, kind=kind, vocab_size=size)
    assert_same_encodings(tok, hf_reads(tok, tmp_path))
    assert_lossless(tok, tmp_path)


def test_gpt2_written_by_attnlab_loads_in_hf(gpt2_shared, tmp_path):
    assert_same_encodings(gpt2_shared, hf_reads(gpt2_shared, tmp_path))
    assert_lossless(gpt2_shared, tmp_path)


def test_custom_pattern_and_template_load_in_hf(corpus, tmp_path):
    tok = Tokenizer.train(corpus, kind="bpe", vocab_size=500, pattern=r"\s?\w+|\s+|[^\s\w]",
                          special_tokens=["<s>", "</s>", "<pad>"], template="bos_eos")
    assert tok.encode("hi", add_special_tokens=True)[0] == tok.bos_token_id
    assert_same_encodings(tok, hf_reads(tok, tmp_path))
    assert_lossless(tok, tmp_path)


def test_custom_roles_survive_saving(tmp_path):
    tok = Tokenizer.train(["abc"] * 3, kind="char", special_tokens={"unk": "?", "eos": "<stop>", "pad": "_"})
    again = Tokenizer.load(tok.save(tmp_path / "t.json"))
    assert again.roles == {"unk": "?", "eos": "<stop>", "pad": "_"}
    assert "attnlab_roles" in json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))["model"]
    plain = Tokenizer.train(["abc"] * 3, kind="char")  # inferable roles: nothing extra written
    assert "attnlab_roles" not in plain.to_dict()["model"]


def _hf_trained(corpus, kind):
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    if kind == "bpe":
        tok = hf.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<pad>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    else:
        tok = hf.Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                            show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    if kind == "wordpiece":
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_hf_files_load_in_attnlab(corpus, tmp_path, kind):
    theirs = _hf_trained(corpus, kind)
    theirs.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.load(tmp_path)
    assert ours.kind == kind
    assert_same_encodings(ours, theirs)
    assert_lossless(ours, tmp_path)


def test_real_bert_tokenizer_json_loads(bert_dir):
    theirs = hf.Tokenizer.from_file(str(bert_dir / "tokenizer.json"))
    theirs.no_padding()
    theirs.no_truncation()
    ours = Tokenizer.load(bert_dir / "tokenizer.json")
    assert ours.template.name == "bert" and ours.model.lowercase
    assert_same_encodings(ours, theirs)


def test_transformers_gpt2_folder_loads(tmp_path, gpt2_vocab_merges, gpt2_shared):
    import transformers
    vocab, merges = gpt2_vocab_merges
    transformers.GPT2TokenizerFast(vocab=vocab, merges=merges).save_pretrained(str(tmp_path))
    ours = Tokenizer.load(tmp_path)
    assert ours.encode_batch(SAMPLES) == gpt2_shared.encode_batch(SAMPLES)
    assert ours.eos_token_id == 50256


@pytest.mark.parametrize("patch, where", [
    ({"model": {"type": "Unigram", "vocab": []}}, "model"),
    ({"pre_tokenizer": {"type": "Metaspace"}}, "pre_tokenizer"),
    ({"normalizer": {"type": "Precompiled"}}, "normalizer"),
    ({"post_processor": {"type": "Mystery"}}, "post_processor"),
])
def test_unsupported_blocks_are_named(gpt2_shared, patch, where):
    data = {**gpt2_shared.to_dict(), **patch}
    with pytest.raises(ValueError, match=where):
        Tokenizer.from_dict(data)


def test_bpe_dropout_is_refused(gpt2_shared):
    data = gpt2_shared.to_dict()
    data["model"] = {**data["model"], "dropout": 0.1}
    with pytest.raises(ValueError, match="dropout"):
        Tokenizer.from_dict(data)
