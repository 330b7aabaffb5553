"""Word tokenizer: whitespace/punctuation words, the most frequent ones kept, the rest unknown;
saved and loaded losslessly; a run config may choose it."""

from __future__ import annotations

import pytest

from attnlab.tokenizers import Tokenizer, WordModel
from attnlab.tokenizers.training import KINDS
from attnlab.tokenizers.word import train_word

CORPUS = ["The king is dead, long live the king!\n", "the queen speaks; the king listens.\n"] * 3


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(CORPUS, kind="word")


def test_words_split_on_whitespace_and_punctuation(tok):
    assert tok.tokenize("the king, the queen!") == ["the", "king", ",", "the", "queen", "!"]
    assert tok.tokenize("  the\tking\n\nis  ") == ["the", "king", "is"]  # whitespace is not a token
    assert tok.tokenize("The the") == ["The", "the"]  # cased: no normalizer


def test_unseen_words_are_unknown(tok):
    ids = tok.encode("the prince is dead")
    assert ids == [tok.token_to_id("the"), tok.unk_token_id, tok.token_to_id("is"), tok.token_to_id("dead")]
    assert tok.decode(ids) == "the <unk> is dead"


def test_decoding_joins_words_and_cleans_up_punctuation(tok):
    assert tok.decode(tok.encode("the king is dead, long live the king!")) == "the king is dead, long live the king!"


def test_vocabulary_is_specials_then_words_by_count(tok):
    vocab = tok.get_vocab()
    assert vocab["<pad>"] == 0 and vocab["<unk>"] == 1
    counts = {}
    for line in CORPUS:
        for word in WordModel({"<unk>": 0}).words(line):
            counts[word] = counts.get(word, 0) + 1
    by_count = sorted(counts, key=lambda w: (-counts[w], w))
    assert [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])][2:] == by_count


def test_vocab_size_keeps_the_most_frequent_words():
    small = Tokenizer.train(CORPUS, kind="word", vocab_size=4)
    assert set(small.get_vocab()) == {"<pad>", "<unk>", "king", "the"}  # 9 and 9 times; the rest fewer
    assert small.encode("the dead king") == [small.token_to_id("the"), small.unk_token_id, small.token_to_id("king")]


def test_train_word_caps_and_filters():
    assert train_word({"a": 5, "b": 9, "c": 1}, 3, ["<unk>"]) == {"<unk>": 0, "b": 1, "a": 2}
    assert train_word({"a": 5, "b": 9, "c": 1}, 10, ["<unk>"], min_frequency=2) == {"<unk>": 0, "b": 1, "a": 2}
    with pytest.raises(ValueError, match="vocab_size"):
        train_word({"a": 1}, 1, ["<pad>", "<unk>"])


def test_needs_an_unknown_token():
    with pytest.raises(ValueError, match="needs an unknown token; add '<unk>'"):
        Tokenizer.train(CORPUS, kind="word", special_tokens=["<pad>"])
    with pytest.raises(ValueError, match="unk_token"):
        WordModel({"a": 0}, unk_token="<unk>")


def test_special_tokens_stay_whole():
    tok = Tokenizer.train(CORPUS, kind="word", special_tokens=["<pad>", "<unk>", "<|endoftext|>"])
    assert tok.encode("the king<|endoftext|>the") == [tok.token_to_id("the"), tok.token_to_id("king"),
                                                      tok.eos_token_id, tok.token_to_id("the")]


def test_tokenizer_json_round_trip(tok, tmp_path):
    path = tok.save(tmp_path / "tok")
    again = Tokenizer.load(path)
    assert again.kind == "word" and again.to_dict() == tok.to_dict()
    texts = CORPUS + ["unseen words here, and the king", ""]
    assert again.encode_batch(texts) == tok.encode_batch(texts)
    assert again.decode(again.encode(CORPUS[0])) == tok.decode(tok.encode(CORPUS[0]))


def test_the_run_config_offers_every_tokenizer_kind():
    from attnlab.training.config import TOKENIZER_KINDS, TokenizerConfig

    assert set(TOKENIZER_KINDS) == set(KINDS)
    assert TokenizerConfig(kind="word").kind == "word"
