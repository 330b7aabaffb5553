"""Special tokens are never split, can be added later, and get roles from their spelling."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab.tokenizers import Tokenizer
from attnlab.tokenizers.special import AddedToken, SpecialSplitter, infer_roles, sentinel_index


def test_gpt2_keeps_endoftext_whole(gpt2_shared, tiktoken_gpt2):
    for text in ("a<|endoftext|>b", "<|endoftext|>", "x <|endoftext|><|endoftext|> y"):
        assert gpt2_shared.encode(text) == tiktoken_gpt2.encode(text, allowed_special="all")
    assert gpt2_shared.encode("a<|endoftext|>b") == [64, 50256, 65]
    # Asked to, it reads them as plain text, like tiktoken's encode_ordinary.
    text = "a<|endoftext|>b"
    assert gpt2_shared.encode(text, split_special_tokens=True) == tiktoken_gpt2.encode_ordinary(text)


def test_bert_keeps_brackets_whole(bert_shared, hf_bert):
    text = "[CLS] x [MASK] y[SEP]z[PAD]"
    assert bert_shared.encode(text) == hf_bert.encode(text, add_special_tokens=False)
    assert bert_shared.tokenize(text) == ["[CLS]", "x", "[MASK]", "y", "[SEP]", "z", "[PAD]"]


def test_add_special_tokens_later(gpt2_dir, gpt2_vocab_merges):
    tok = Tokenizer.load(gpt2_dir)
    sentinels = [f"<extra_id_{i}>" for i in range(3)]
    new = ["[CLS]", "[SEP]", "[MASK]", "<pad>", *sentinels]
    ids = tok.add_special_tokens(new)
    assert ids == list(range(50257, 50257 + 7))
    assert tok.vocab_size == 50264
    assert (tok.cls_token_id, tok.sep_token_id, tok.mask_token_id, tok.pad_token_id) == (50257, 50258, 50259, 50260)
    assert tok.sentinel_token_ids == [50261, 50262, 50263]
    text = "fill <extra_id_1> here[MASK]<pad>"
    assert tok.encode(text) == [20797, 220, 50262, 994, 50259, 50260]
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == "fill  here"

    import transformers
    vocab, merges = gpt2_vocab_merges
    ref = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)
    ref.add_special_tokens({"additional_special_tokens": new})
    for sample in (text, "[CLS]a[SEP] b <extra_id_2>", "no specials"):
        assert tok.encode(sample) == ref.encode(sample)

    # Adding again changes nothing; an existing vocabulary token keeps its id.
    assert tok.add_special_tokens(["[CLS]"]) == [50257]
    assert tok.add_special_tokens(["Hello"]) == [15496]
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("HelloHello") == [15496, 15496]  # now never merged with its neighbours


def test_add_special_tokens_with_roles(gpt2_dir):
    tok = Tokenizer.load(gpt2_dir)
    tok.add_special_tokens({"start": "[START]", "delim": "[DELIM]", "extract": "[EXTRACT]"})
    assert (tok.start_token_id, tok.delim_token_id, tok.extract_token_id) == (50257, 50258, 50259)
    with pytest.raises(ValueError, match="role"):
        tok.add_special_tokens({"beginning": "<b>"})
    with pytest.raises(TypeError, match="tokens"):
        tok.add_special_tokens("<pad>")


def test_splitter_prefers_the_longest_token():
    splitter = SpecialSplitter(["<a>", "<a><b>", "<b>"])
    assert splitter.split("x<a><b>y<a>") == [("x", False), ("<a><b>", True), ("y", False), ("<a>", True)]


def test_splitter_flags():
    mask = AddedToken("<mask>", 5, lstrip=True)
    assert SpecialSplitter([mask]).split("a <mask> b") == [("a", False), ("<mask>", True), (" b", False)]
    right = AddedToken("<r>", 6, rstrip=True)
    assert SpecialSplitter([right]).split("a <r>  b") == [("a ", False), ("<r>", True), ("b", False)]
    word = AddedToken("ab", 7, single_word=True)
    assert SpecialSplitter([word]).split("ab cab ab") == [("ab", True), (" cab ", False), ("ab", True)]


@given(st.text(st.sampled_from(list("ab<>|x ")), max_size=40))
def test_splitter_covers_text(text):
    parts = SpecialSplitter(["<|x|>", "<a>", "ab"]).split(text)
    assert "".join(p for p, _ in parts) == text
    assert all(p for p, _ in parts)


def test_roles_from_spelling():
    assert infer_roles(["<|endoftext|>"]) == {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}
    assert infer_roles(["<s>", "</s>", "<pad>", "<unk>", "<mask>"]) == {
        "pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>", "mask": "<mask>"}
    assert infer_roles(["[START]", "[DELIM]", "[EXTRACT]"]) == {
        "start": "[START]", "delim": "[DELIM]", "extract": "[EXTRACT]"}
    assert sentinel_index("<extra_id_12>") == 12 and sentinel_index("<extra_id_>") is None


def test_explicit_roles_at_training():
    tok = Tokenizer.train(["abc abc"] * 5, kind="char", special_tokens={"unk": "?", "eos": "<end>"})
    assert tok.unk_token_id == 0 and tok.eos_token_id == 1
    assert tok.pad_token_id is None and tok.cls_token_id is None
