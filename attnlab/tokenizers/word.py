"""Word tokenizer: one token per word, the ``vocab_size`` most frequent words of the training
corpus; any other word is the unknown token.

Text → words (split on whitespace, each punctuation mark a word of its own: BERT's
pre-tokenizer, ``wordpiece.split_words``) → each word's id, or the unknown id. Whitespace is
not kept: decoding joins the words with spaces (and removes those before punctuation).

The baseline sub-words were invented to beat (Sennrich et al. 2016): a fixed list of words
cannot spell a word it has not seen (a new name, a rare inflection), so the unknown-token rate
on new text is the price of the short sequences. Characters pay the other way (no unknowns, the
longest sequences); BPE sits between. ``examples/tokenizer_comparison.py`` measures the three on
one corpus.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from attnlab.tokenizers.base import TokenModel
from attnlab.tokenizers.char import frequency_vocab
from attnlab.tokenizers.normalizers import Normalizer
from attnlab.tokenizers.wordpiece import join_pieces, split_words


class WordModel(TokenModel):
    """Each whitespace- or punctuation-delimited word is a token; words outside the vocabulary
    become ``unk_token``.

    Args:
        vocab: words (and the special tokens) → id.
        unk_token: must be in ``vocab``.
        normalizer: applied before splitting (none by default: words keep their case).

    Raises:
        ValueError: if ``unk_token`` is missing from ``vocab`` or ``None``.
    """

    kind: ClassVar[str] = "word"

    def __init__(self, vocab: dict[str, int], *, unk_token: str = "<unk>",
                 normalizer: Normalizer | None = None) -> None:
        if unk_token is None:
            raise ValueError("unk_token: the word tokenizer needs an unknown token, e.g. '<unk>'")
        self.vocab = dict(vocab)
        self.unk_token = unk_token
        self._check_unk()
        self._unk_id = self.vocab[unk_token]
        self.normalizer = normalizer

    def words(self, text: str) -> list[str]:
        """The (normalized) words of ``text``.

        Example:
            >>> WordModel({"<unk>": 0}).words("Hello,  world!")
            ['Hello', ',', 'world', '!']
        """
        if self.normalizer is not None:
            text = self.normalizer(text)
        return split_words(text)

    def encode_text(self, text: str) -> list[int]:
        vocab, unk = self.vocab, self._unk_id
        return [vocab.get(word, unk) for word in self.words(text)]

    def decode_tokens(self, tokens: list[str]) -> str:
        return join_pieces(tokens)  # no word starts with "##": "#" is punctuation, a word of its own


def train_word(
    word_counts: Counter[str] | dict[str, int],
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] = (),
    min_frequency: int = 1,
) -> dict[str, int]:
    """Keep the most frequent words: specials first, then words by count (ties in code point
    order), down to ``min_frequency`` and up to ``vocab_size`` entries.

    Example:
        >>> train_word({"the": 9, "king": 2, "a": 5}, vocab_size=3, special_tokens=["<unk>"])
        {'<unk>': 0, 'the': 1, 'a': 2}

    Raises:
        ValueError: if ``vocab_size`` cannot hold the special tokens.
    """
    return frequency_vocab(word_counts, vocab_size, special_tokens, min_frequency)
