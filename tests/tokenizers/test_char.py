"""Character tokenizer: known characters round-trip, unknown ones map to the unknown id."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab.tokenizers import CharModel, Tokenizer
from attnlab.tokenizers.char import train_char

CORPUS = ["hello world\n", "the quick brown fox\n", "naïve café 中文\n"] * 5
KNOWN = sorted(set("".join(CORPUS)))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(CORPUS, kind="char")


@given(st.text(st.sampled_from(KNOWN), max_size=50))
def test_known_characters_round_trip(tok, text):
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_unknown_characters_map_to_unk(tok):
    ids = tok.encode("hñ😀z")
    assert ids[0] == tok.token_to_id("h")
    assert ids[1:] == [tok.unk_token_id] * 3  # ñ, 😀 and z are not in the corpus
    assert tok.decode(ids) == "h<unk><unk><unk>"


def test_vocabulary_is_specials_then_characters_by_count(tok):
    vocab = tok.get_vocab()
    assert vocab["<pad>"] == 0 and vocab["<unk>"] == 1
    assert tok.pad_token_id == 0 and tok.unk_token_id == 1
    assert set(vocab) == {"<pad>", "<unk>", *KNOWN}
    assert vocab[" "] == 2  # the most frequent character comes first


def test_train_char_caps_and_filters():
    assert train_char({"a": 5, "b": 9, "c": 1}, 3, ["<unk>"]) == {"<unk>": 0, "b": 1, "a": 2}
    assert train_char({"a": 5, "b": 9, "c": 1}, 10, ["<unk>"], min_frequency=2) == {"<unk>": 0, "b": 1, "a": 2}
    assert train_char({"b": 2, "a": 2}, 10) == {"a": 0, "b": 1}  # ties in code point order
    with pytest.raises(ValueError, match="vocab_size"):
        train_char({"a": 1}, 1, ["<pad>", "<unk>"])


def test_needs_an_unknown_token():
    with pytest.raises(ValueError, match="special_tokens"):
        Tokenizer.train(["abc"], kind="char", special_tokens=["<pad>"])
    with pytest.raises(ValueError, match="unk_token"):
        CharModel({"a": 0}, unk_token="<unk>")


def test_special_tokens_stay_whole(tok):
    tok2 = Tokenizer.train(CORPUS, kind="char", special_tokens=["<pad>", "<unk>", "<eos>"])
    assert tok2.encode("hz<eos>") == [tok2.token_to_id("h"), tok2.unk_token_id, tok2.eos_token_id]
    assert tok2.decode(tok2.encode("he<eos>")) == "he<eos>"
