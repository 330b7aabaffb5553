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


def test_unknown_characters_are_counted_and_warned_once_per_data_set(tok):
    import warnings

    from attnlab.tokenizers.char import UnknownCharacters

    unknown = UnknownCharacters.of(tok)
    texts = ["hello wörld", "ñ and ñ 😀", "hello"]
    assert list(unknown.watch(t for t in texts)) == texts  # passed through unchanged
    assert list(unknown.watch([("ö", True)])) == [("ö", True)]
    unk = {c: sum(t.count(c) for t in texts + ["ö"]) for c in set("".join(texts))
           if tok.encode(c) == [tok.unk_token_id]}
    assert unknown.counts == unk == {"ö": 2, "ñ": 2, "😀": 1}  # as many as the tokenizer turns into <unk>
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unknown.warn("data.valid 'v.txt'")
        UnknownCharacters.of(tok).warn("clean")  # nothing unknown: nothing said
    assert [str(w.message) for w in caught] == [
        "data.valid 'v.txt': 5 character(s) are not in the character vocabulary and are encoded as '<unk>' "
        "(3 distinct, most frequent: 'ñ', 'ö', '😀'); train the tokenizer on text that holds them"]
    assert UnknownCharacters.of(Tokenizer.train(CORPUS, kind="word")) is None  # an unknown word is no surprise
