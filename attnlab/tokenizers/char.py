"""Character tokenizer: one token per Unicode code point, for the smallest demos."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, ClassVar, Iterable, Iterator

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


class UnknownCharacters:
    """Counts the characters of a data set that a character vocabulary lacks (each encodes as the
    unknown token): a validation file in another script, or text the tokenizer never saw, is
    otherwise read as a stream of `<unk>` without a word. Fed text by text (`add`, or `watch`
    on a stream of pieces), it warns once for the data set (`warn`).

    Example:
        >>> unknown = UnknownCharacters({"a": 0, "b": 1, "<unk>": 2}, "<unk>")
        >>> unknown.add("abcab\u00e9c")
        >>> unknown.counts
        Counter({'c': 2, '\u00e9': 1})
    """

    def __init__(self, vocab: dict[str, int], unk_token: str):
        self.vocab, self.unk_token = vocab, unk_token
        self.counts: Counter[str] = Counter()

    @classmethod
    def of(cls, tokenizer: Any) -> "UnknownCharacters | None":
        """A counter for `tokenizer` when it is a character tokenizer; None for other kinds (an
        unknown word or piece is a matter of vocabulary size, not a character never seen)."""
        model = getattr(tokenizer, "model", None)
        return cls(model.vocab, model.unk_token) if isinstance(model, CharModel) else None

    def add(self, text: str) -> None:
        for char in set(text).difference(self.vocab):  # a set pass per text: cheap beside encoding it
            self.counts[char] += text.count(char)

    def watch(self, pieces: Iterable[Any]) -> Iterator[Any]:
        """`pieces` (texts, or (text, ...) tuples) passed through unchanged, each counted."""
        for piece in pieces:
            self.add(piece[0] if isinstance(piece, tuple) else piece)
            yield piece

    def warn(self, source: str) -> None:
        """One warning naming `source`, how many characters became the unknown token and the
        most frequent of them; none when every character was in the vocabulary."""
        if not self.counts:
            return
        ranked = sorted(self.counts, key=lambda c: (-self.counts[c], c))  # ties by code point: the same each run
        total, examples = sum(self.counts.values()), ", ".join(repr(c) for c in ranked[:5])
        warnings.warn(f"{source}: {total:,} character(s) are not in the character vocabulary and are encoded as "
                      f"{self.unk_token!r} ({len(self.counts)} distinct, most frequent: {examples}); train the "
                      "tokenizer on text that holds them", UserWarning, stacklevel=2)
