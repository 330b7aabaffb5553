"""Word starts per tokenizer kind: the tokens between two starts spell one word of the text
(WordPiece: BERT's words; BPE and characters: a whitespace-delimited word with the whitespace
before it; word: each token), special tokens are words of their own."""

from __future__ import annotations

import re

import pytest
import torch

from attnlab.tokenizers import Tokenizer
from attnlab.tokenizers.boundaries import word_starts
from tokenizer_samples import VARIED_TEXTS, training_corpus

ASCII_SPACE = " \t\n\r\x0b\x0c"  # the whitespace byte-level BPE's boundaries read
SAMPLES = [t for t in VARIED_TEXTS if t] + ["First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n"]


@pytest.fixture(scope="module")
def corpus():
    return training_corpus() + SAMPLES


def groups(tok: Tokenizer, text: str) -> list[list[int]]:
    """The token ids of `text` cut at the word starts."""
    ids = tok.encode(text)
    starts = word_starts(tok, torch.tensor([ids], dtype=torch.long))[0].tolist()
    out: list[list[int]] = []
    for token, start in zip(ids, starts):
        if start:
            out.append([])
        out[-1].append(token)
    return out


@pytest.mark.parametrize("kind, size, space", [("bpe", 600, ASCII_SPACE), ("char", None, None)])
def test_bpe_and_char_words_are_whitespace_words_with_their_leading_space(corpus, kind, size, space):
    """`space`: the whitespace characters (None: Unicode's, as `str.split`)."""
    tok = Tokenizer.train(corpus, kind=kind, vocab_size=size)
    split = (lambda text: re.split(f"[{re.escape(space)}]+", text)) if space else str.split
    for text in SAMPLES:
        words = [tok.decode(g) for g in groups(tok, text)]
        assert "".join(words) == text
        assert [w.strip(space) for w in words if w.strip(space)] == [w for w in split(text) if w], text
        for w in words[1:]:  # whitespace first, then none (the first word may start without it)
            assert w[:1].strip(space) == "", (text, w)


def test_wordpiece_words_are_berts_words(corpus):
    tok = Tokenizer.train(corpus, kind="wordpiece", vocab_size=600, lowercase=False)
    for text in SAMPLES:
        pieces = [[tok.id_to_token(i) for i in g] for g in groups(tok, text)]
        words = tok.model.words(text)
        assert len(pieces) == len(words), text
        for word, group in zip(words, pieces):
            assert group == ["[UNK]"] or "".join(p.removeprefix("##") for p in group) == word
            assert all(p.startswith("##") for p in group[1:]) and not group[0].startswith("##")


def test_every_word_token_is_a_word():
    tok = Tokenizer.train(["the king is dead , long live the king"] * 3, kind="word")
    ids = torch.tensor([tok.encode("the king , the queen")])
    assert word_starts(tok, ids).all()


def test_special_tokens_are_words_of_their_own_and_a_row_starts_a_word(corpus):
    tok = Tokenizer.train(corpus, kind="bpe", vocab_size=600)
    ids = tok.encode("the king<|endoftext|>dead kings")
    starts = word_starts(tok, torch.tensor([ids]))[0].tolist()
    eos = ids.index(tok.eos_token_id)
    assert starts[eos] and starts[eos + 1]  # "dead" has no leading space, yet starts a word after the special
    assert starts[:eos] == [True] + [tok.id_to_token(i).startswith("Ġ") for i in ids[1:eos]]
    cut = tok.encode("kingdom, dead")[1:]  # a window cut inside the word "kingdom,"
    assert not tok.id_to_token(cut[0]).startswith("Ġ")
    assert word_starts(tok, torch.tensor([cut]))[0].tolist() == [True] + [tok.id_to_token(i).startswith("Ġ")
                                                                           for i in cut[1:]]


def test_tables_follow_special_tokens_added_later():
    tok = Tokenizer.train(["the king is dead"] * 5, kind="char")
    word_starts(tok, torch.tensor([tok.encode("the king")]))
    [mark] = tok.add_special_tokens(["<mark>"])
    ids = torch.tensor([tok.encode("th<mark>e")])
    assert word_starts(tok, ids)[0].tolist() == [True, False, True, True]
    assert ids[0, 2] == mark


def test_ids_must_be_a_batch():
    tok = Tokenizer.train(["abc"] * 3, kind="char")
    with pytest.raises(ValueError, match=r"ids must be \(B, T\)"):
        word_starts(tok, torch.tensor([1, 2]))
