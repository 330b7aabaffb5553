"""WordPiece encoding (BERT).

Text → BERT normalization (clean-up, CJK spacing, accent stripping and lower-casing when
uncased) → words split on whitespace with each punctuation character on its own → each word
greedily cut into the longest vocabulary entries from the left, pieces after the first
written with the ``##`` prefix. A word longer than ``max_input_chars_per_word`` characters,
or one that cannot be spelled from the vocabulary, becomes a single ``[UNK]``.

Wu et al. 2016 (GNMT), "Google's Neural Machine Translation System"; Devlin et al. 2019.
"""

from __future__ import annotations

from typing import ClassVar

from attnlab.tokenizers.base import TokenModel
from attnlab.tokenizers.normalizers import Normalizer, is_punctuation, is_whitespace

#: Hugging Face's WordPiece decoder removes these spaces left by joining tokens with " ".
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def split_words(text: str) -> list[str]:
    """BERT's pre-tokenizer: split on whitespace, and put each punctuation mark on its own.

    Example:
        >>> split_words("Hello,  world! (ok)")
        ['Hello', ',', 'world', '!', '(', 'ok', ')']
    """
    words: list[str] = []
    current: list[str] = []
    for char in text:
        if is_whitespace(char) or is_punctuation(char):
            if current:
                words.append("".join(current))
                current = []
            if not is_whitespace(char):
                words.append(char)
        else:
            current.append(char)
    if current:
        words.append("".join(current))
    return words


def greedy_pieces(word: str, vocab: dict[str, int], prefix: str = "##") -> list[str] | None:
    """Cut ``word`` into the longest vocabulary entries, left to right; ``None`` if impossible.

    Example:
        >>> greedy_pieces("unaffable", {"un": 0, "##aff": 1, "##able": 2})
        ['un', '##aff', '##able']
    """
    pieces: list[str] = []
    start, n = 0, len(word)
    while start < n:
        end = n
        while end > start:
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                pieces.append(piece)
                break
            end -= 1
        else:
            return None
        start = end
    return pieces


class WordPieceModel(TokenModel):
    """BERT's WordPiece.

    Args:
        vocab: token → id (``vocab.txt``'s line numbers for BERT).
        unk_token: token for unspellable or over-long words; must be in ``vocab``.
        prefix: marks a piece that continues a word.
        max_input_chars_per_word: longer words become ``unk_token``.
        normalizer: BERT's normalizer by default (uncased); ``None`` for none.
        cleanup: decoding removes the spaces before punctuation that joining left (as HF).

    Raises:
        ValueError: if ``unk_token`` is not in ``vocab`` or ``max_input_chars_per_word < 1``.
    """

    kind: ClassVar[str] = "wordpiece"

    def __init__(
        self,
        vocab: dict[str, int],
        *,
        unk_token: str = "[UNK]",
        prefix: str = "##",
        max_input_chars_per_word: int = 100,
        normalizer: Normalizer | None = None,
        cleanup: bool = True,
    ) -> None:
        if unk_token is None:
            raise ValueError("unk_token: WordPiece needs an unknown token, e.g. '[UNK]'")
        if max_input_chars_per_word < 1:
            raise ValueError(f"max_input_chars_per_word must be >= 1, got {max_input_chars_per_word}")
        self.vocab = dict(vocab)
        self.unk_token = unk_token
        self._check_unk()
        self.prefix = prefix
        self.max_input_chars_per_word = max_input_chars_per_word
        self.normalizer = normalizer
        self.cleanup = cleanup
        self._cache: dict[str, list[int]] = {}

    @property
    def lowercase(self) -> bool:
        """Whether the normalizer lower-cases (an "uncased" model)."""
        spec = self.normalizer.spec if self.normalizer is not None else None
        return bool(spec and spec.get("type") == "BertNormalizer" and spec.get("lowercase", True))

    def words(self, text: str) -> list[str]:
        """Normalized, pre-tokenized words of ``text``."""
        if self.normalizer is not None:
            text = self.normalizer(text)
        return split_words(text)

    def encode_text(self, text: str) -> list[int]:
        ids: list[int] = []
        cache = self._cache
        for word in self.words(text):
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = self._encode_word(word)
                if len(cache) >= self.CACHE_SIZE:
                    cache.clear()
                cache[word] = word_ids
            ids.extend(word_ids)
        return ids

    def _encode_word(self, word: str) -> list[int]:
        unk = [self.vocab[self.unk_token]]
        if len(word) > self.max_input_chars_per_word:
            return unk
        pieces = greedy_pieces(word, self.vocab, self.prefix)
        return unk if pieces is None else [self.vocab[p] for p in pieces]

    def decode_tokens(self, tokens: list[str]) -> str:
        return join_pieces(tokens, self.prefix, cleanup=self.cleanup)


def join_pieces(tokens: list[str], prefix: str = "##", *, cleanup: bool = True) -> str:
    """Hugging Face's WordPiece decoder: a piece after the first joins the previous one without
    its ``prefix``, any other token after a space; ``cleanup`` removes the spaces that joining
    left before punctuation (``" ."``, ``" n't"``, ...).

    Example:
        >>> join_pieces(["hello", "##s", ",", "world", "!"])
        'hellos, world!'
    """
    parts = []
    for i, token in enumerate(tokens):
        if i > 0:
            token = token[len(prefix):] if token.startswith(prefix) else " " + token
        if cleanup:
            for dirty, clean in _CLEANUP:
                token = token.replace(dirty, clean)
        parts.append(token)
    return "".join(parts)
