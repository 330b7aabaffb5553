"""Character tokenizer: one token per Unicode code point, for the smallest demos."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from attnlab.tokenizers.base import TokenModel


class CharModel(TokenModel):
    """Each character is a token; characters outside the vocabulary become ``unk_token``.

    Args:
        vocab: single characters (and the unknown token) → id.
        unk_token: must be in ``vocab``.

    Raises:
        ValueError: if ``unk_token`` is missing from ``vocab`` or ``None``.
    """

    kind: ClassVar[str] = "char"

    def __init__(self, vocab: dict[str, int], *, unk_token: str = "<unk>") -> None:
        if unk_token is None:
            raise ValueError("unk_token: the character tokenizer needs an unknown token, e.g. '<unk>'")
        self.vocab = dict(vocab)
        self.unk_token = unk_token
        self._check_unk()
        self._unk_id = self.vocab[unk_token]

    def encode_text(self, text: str) -> list[int]:
        vocab, unk = self.vocab, self._unk_id
        return [vocab.get(char, unk) for char in text]

    def decode_tokens(self, tokens: list[str]) -> str:
        return "".join(tokens)


def train_char(
    char_counts: Counter[str] | dict[str, int],
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] = (),
    min_frequency: int = 1,
) -> dict[str, int]:
    """Keep the most frequent characters: specials first, then characters by count.

    Characters seen fewer than ``min_frequency`` times, or beyond ``vocab_size``, are left
    out (they will encode as the unknown token). Ties keep code point order.

    Example:
        >>> train_char({"a": 5, "b": 9, "c": 1}, vocab_size=3, special_tokens=["<unk>"])
        {'<unk>': 0, 'b': 1, 'a': 2}

    Raises:
        ValueError: if ``vocab_size`` cannot hold the special tokens.
    """
    return frequency_vocab(char_counts, vocab_size, special_tokens, min_frequency)


def frequency_vocab(
    counts: Counter[str] | dict[str, int],
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] = (),
    min_frequency: int = 1,
) -> dict[str, int]:
    """The vocabulary of a count-and-keep tokenizer (characters, words): ``special_tokens``
    first, then the items of ``counts`` by count, down to ``min_frequency`` and up to
    ``vocab_size`` entries in all. Ties keep code point order, so the result does not depend on
    the order the corpus was read in.

    Raises:
        ValueError: if ``vocab_size`` cannot hold the special tokens.
    """
    specials = list(dict.fromkeys(special_tokens))
    if vocab_size < len(specials):
        raise ValueError(f"vocab_size must be at least {len(specials)} (the special tokens), got {vocab_size}")
    vocab = {t: i for i, t in enumerate(specials)}
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    for item, count in ranked:
        if len(vocab) >= vocab_size or count < min_frequency:
            break
        if item not in vocab:
            vocab[item] = len(vocab)
    return vocab
