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
from attnlab.tokenizers.bytelevel import GPT2_PATTERN, byte_to_char, decode_byte_tokens, split_text, to_byte_chars
from attnlab.tokenizers.normalizers import Normalizer


SHORT_WORD = 6  # symbols up to which rescanning the word beats the heap (measured on English and Japanese)


def merge_ids(ids: list[int], table: dict[int, tuple[int, int]], width: int) -> list[int]:
    """Merge adjacent symbols of a word, lowest rank first: `ids` are its symbols, `table` maps
    left * width + right to (rank, merged symbol) (`BPEModel` builds it from the merges, width
    above every id).

    All occurrences of the best pair are merged left to right before looking again. A short
    word is rescanned after each merge (quadratic, but cheapest for the few symbols of an English
    word); a longer one (Japanese and Chinese text, whose pieces run to hundreds of bytes, or code)
    keeps its candidate pairs in a heap ordered by (rank, position), which merges the same pairs in
    the same order for a merge table learned by BPE (there, a pair holding a merged symbol ranks
    after the merge that made it, so every occurrence of the best pair is taken, leftmost first,
    before any pair it creates; Hugging Face `tokenizers` merges by such a heap too).
    """
    if len(ids) > SHORT_WORD:
        return _merge_by_heap(list(ids), table, width)
    symbols = list(ids)
    get = table.get
    while len(symbols) > 1:
        best = None
        for i in range(len(symbols) - 1):
            hit = get(symbols[i] * width + symbols[i + 1])
            if hit is not None and (best is None or hit[0] < best[0]):
                best, key = hit, (symbols[i], symbols[i + 1])
        if best is None:
            break
        (first, second), made = key, best[1]
        merged, i, n = [], 0, len(symbols)
        while i < n:
            if i + 1 < n and symbols[i] == first and symbols[i + 1] == second:
                merged.append(made)
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def _merge_by_heap(symbols: list[int], table: dict[int, tuple[int, int]], width: int) -> list[int]:
    """`merge_ids` in O(n log n): the symbols as a linked list, the candidate pairs in a heap of
    (rank, left position, left, right, merged); a popped pair whose symbols have changed since it
    was pushed is stale and skipped (a position's symbol only ever grows into a new one, so equal
    ids mean unchanged)."""
    n = len(symbols)
    after, before = list(range(1, n)) + [-1], list(range(-1, n - 1))
    get = table.get
    heap = [(hit[0], i, symbols[i], symbols[i + 1], hit[1]) for i in range(n - 1)
            if (hit := get(symbols[i] * width + symbols[i + 1])) is not None]
    heapq.heapify(heap)
    while heap:
        _, i, left, right, made = heapq.heappop(heap)
        j = after[i]
        if j < 0 or symbols[i] != left or symbols[j] != right:
            continue
        symbols[i] = made
        symbols[j] = None
        k = after[i] = after[j]
        if k >= 0:
            before[k] = i
            if (hit := get(made * width + symbols[k])) is not None:
                heapq.heappush(heap, (hit[0], i, made, symbols[k], hit[1]))
        h = before[i]
        if h >= 0 and (hit := get(symbols[h] * width + made)) is not None:
            heapq.heappush(heap, (hit[0], h, symbols[h], made, hit[1]))
    return [s for s in symbols if s is not None]


def apply_merges(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """`merge_ids` on strings: split ``word`` into characters and merge adjacent pairs, lowest
    rank first (`ranks`: pair -> rank), all occurrences of the best pair left to right before
    looking again.

    Example:
        >>> apply_merges("hello", {("l", "l"): 0, ("h", "e"): 1, ("he", "ll"): 2})
        ['hell', 'o']
    """
    names = list(dict.fromkeys([*word, *(part for a, b in ranks for part in (a, b, a + b))]))
    index = {name: i for i, name in enumerate(names)}
    table = {index[a] * len(names) + index[b]: (rank, index[a + b]) for (a, b), rank in ranks.items()}
    return [names[i] for i in merge_ids([index[c] for c in word], table, len(names))]


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
        # the merges on ids (see merge_ids); a byte missing from vocab is symbol `_missing + byte`, above every
        # id (so no merge takes it), and the width is above those too (so that no two pairs share a key)
        self._missing = max(self.vocab.values(), default=-1) + 1
        self._width = self._missing + 256
        self._table = {self.vocab[a] * self._width + self.vocab[b]: (rank, self.vocab[a + b])
                       for (a, b), rank in self.ranks.items()}
        self._byte_ids = [self.vocab.get(char, self._missing + byte) for byte, char in sorted(byte_to_char().items())]

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
            data = piece.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"text: cannot be encoded as UTF-8 (lone surrogate?): {err}") from err
        if self.ignore_merges:
            whole = self.vocab.get(to_byte_chars(piece))
            if whole is not None:
                return [whole]
        byte_ids = self._byte_ids
        ids = merge_ids([byte_ids[b] for b in data], self._table, self._width)
        missing = self._missing
        if max(ids, default=0) < missing:
            return ids
        unk = self.vocab[self.unk_token] if self.unk_token is not None else None
        return [i if i < missing else unk for i in ids if i < missing or unk is not None]

    def decode_tokens(self, tokens: list[str]) -> str:
        return decode_byte_tokens(tokens)
