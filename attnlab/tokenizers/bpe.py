"""Byte-level BPE encoding (GPT-2, RoBERTa, GPT-J, ...).

Text → (optional normalization) → pieces by the split pattern → each piece's UTF-8 bytes in
the byte alphabet → merges applied lowest rank first → ids.

Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units";
byte-level variant: Radford et al. 2019.
"""

from __future__ import annotations

import heapq
from typing import ClassVar

import regex

from attnlab.tokenizers.base import TokenModel
from attnlab.tokenizers.bytelevel import GPT2_PATTERN, decode_byte_tokens, split_text, to_byte_chars
from attnlab.tokenizers.normalizers import Normalizer


SHORT_WORD = 6  # symbols up to which rescanning the word beats the heap (measured on English and Japanese)


def apply_merges(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Split ``word`` into characters and merge adjacent pairs, lowest rank first.

    All occurrences of the best pair are merged left to right before looking again. A short
    word is rescanned after each merge (quadratic, but cheapest for the few symbols of an English
    word); a longer one (Japanese and Chinese text, whose pieces run to hundreds of bytes, or code)
    keeps its candidate pairs in a heap ordered by (rank, position), which merges the same pairs in
    the same order for a merge table learned by BPE (there, a pair holding a merged symbol ranks
    after the merge that made it, so every occurrence of the best pair is taken, leftmost first,
    before any pair it creates; Hugging Face `tokenizers` merges by such a heap too).

    Example:
        >>> apply_merges("hello", {("l", "l"): 0, ("h", "e"): 1, ("he", "ll"): 2})
        ['hell', 'o']
    """
    if len(word) > SHORT_WORD:
        return _merge_by_heap(list(word), ranks)
    symbols = list(word)
    while len(symbols) > 1:
        best, best_rank = None, None
        for pair in zip(symbols, symbols[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best_rank is None or rank < best_rank):
                best, best_rank = pair, rank
        if best is None:
            break
        first, second = best
        merged, i, n = [], 0, len(symbols)
        while i < n:
            if i + 1 < n and symbols[i] == first and symbols[i + 1] == second:
                merged.append(first + second)
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def _merge_by_heap(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """`apply_merges` in O(n log n): the symbols as a linked list, the candidate pairs in a heap
    of (rank, left position, left, right); a popped pair whose symbols have changed since it was
    pushed is stale and skipped (a symbol only grows, so equal strings mean unchanged)."""
    n = len(symbols)
    after, before = list(range(1, n)) + [-1], list(range(-1, n - 1))
    rank_of = ranks.get
    heap = [(rank, i, symbols[i], symbols[i + 1]) for i in range(n - 1)
            if (rank := rank_of((symbols[i], symbols[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        _, i, left, right = heapq.heappop(heap)
        j = after[i]
        if j < 0 or symbols[i] != left or symbols[j] != right:
            continue
        merged = symbols[i] = left + right
        symbols[j] = None
        k = after[i] = after[j]
        if k >= 0:
            before[k] = i
            if (rank := rank_of((merged, symbols[k]))) is not None:
                heapq.heappush(heap, (rank, i, merged, symbols[k]))
        h = before[i]
        if h >= 0 and (rank := rank_of((symbols[h], merged))) is not None:
            heapq.heappush(heap, (rank, h, symbols[h], merged))
    return [s for s in symbols if s is not None]


class BPEModel(TokenModel):
    """Byte-level BPE with a merge-rank table and a per-piece cache.

    Args:
        vocab: token (in the byte alphabet) → id.
        merges: pairs in rank order; ``a + b`` of each must be in ``vocab``.
        pattern: the pre-tokenizer's split regex (GPT-2's by default); ``None`` keeps each
            text whole (Hugging Face's ``ByteLevel(use_regex=False)``).
        add_prefix_space: put a space before text that does not start with one (RoBERTa-style
            "every word has a leading space").
        normalizer: applied before splitting (none for GPT-2).
        ignore_merges: a piece that is itself in ``vocab`` becomes that one token (Llama 3).
        unk_token: used for bytes missing from ``vocab``; without it they are dropped (as
            Hugging Face does). Byte-level vocabularies hold all 256 bytes, so neither happens.

    Raises:
        ValueError: a merge whose parts or result are not in ``vocab``; a bad pattern.
    """

    kind: ClassVar[str] = "bpe"

    def __init__(
        self,
        vocab: dict[str, int],
        merges: list[tuple[str, str]],
        *,
        pattern: str | None = GPT2_PATTERN,
        add_prefix_space: bool = False,
        normalizer: Normalizer | None = None,
        ignore_merges: bool = False,
        unk_token: str | None = None,
    ) -> None:
        self.vocab = dict(vocab)
        self.merges = [tuple(pair) for pair in merges]
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, (first, second) in enumerate(self.merges):
            for part in (first, second, first + second):
                if part not in self.vocab:
                    raise ValueError(
                        f"merges: merge #{rank} {first!r} + {second!r} needs {part!r}, which is not in vocab"
                    )
            self.ranks[(first, second)] = rank  # a repeated pair keeps its last rank, as in HF
        try:
            self.regex = regex.compile(pattern) if pattern is not None else None
        except (regex.error, TypeError) as err:
            raise ValueError(f"pattern: not a valid regular expression ({err}): {pattern!r}") from err
        self.pattern = pattern
        self.add_prefix_space = add_prefix_space
        self.normalizer = normalizer
        self.ignore_merges = ignore_merges
        self.unk_token = unk_token
        self._check_unk()
        self._cache: dict[str, list[int]] = {}

    def pieces(self, text: str) -> list[str]:
        """The pre-tokenized pieces of ``text`` (before byte mapping)."""
        if self.normalizer is not None:
            text = self.normalizer(text)
        if self.add_prefix_space and text and not text.startswith(" "):
            text = " " + text
        if self.regex is None:
            return [text] if text else []
        return split_text(text, self.regex)

    def encode_text(self, text: str) -> list[int]:
        ids: list[int] = []
        cache = self._cache
        for piece in self.pieces(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                piece_ids = self._encode_piece(piece)
                if len(cache) >= self.CACHE_SIZE:
                    cache.clear()
                cache[piece] = piece_ids
            ids.extend(piece_ids)
        return ids

    def _encode_piece(self, piece: str) -> list[int]:
        try:
            word = to_byte_chars(piece)
        except UnicodeEncodeError as err:
            raise ValueError(f"text: cannot be encoded as UTF-8 (lone surrogate?): {err}") from err
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        ids = []
        for token in apply_merges(word, self.ranks):
            token_id = self.vocab.get(token)
            if token_id is None and self.unk_token is not None:
                token_id = self.vocab[self.unk_token]
            if token_id is not None:
                ids.append(token_id)
        return ids

    def decode_tokens(self, tokens: list[str]) -> str:
        return decode_byte_tokens(tokens)
