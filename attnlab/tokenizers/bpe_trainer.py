"""Learning byte-level BPE merges from word counts.

The procedure is the one of Hugging Face's ``BpeTrainer``, so that both learn the same merges
from the same corpus (tested in ``tests/tokenizers/test_bpe_trainer.py``):

1. ids: the special tokens first, then the alphabet (the 256 byte characters and any other
   character in the words) in code point order;
2. count every adjacent pair of symbols in every word, weighted by the word's count, and
   remember which words hold each pair;
3. repeatedly take the most frequent pair from a priority queue (ties: the pair whose
   ``(left id, right id)`` is smallest), merge it in the words that hold it, and update the
   counts of only the pairs around each merge — no recount of the corpus. Queue entries are
   refreshed lazily: an entry whose count is out of date goes back in with its current count;
4. stop at ``vocab_size`` tokens, or when the best pair occurs fewer than ``min_frequency``
   times.

When two merges spell the same string (``ab + c`` and ``a + bc``), the token gets one id and
the merge list keeps both pairs; a pair merged twice keeps its last rank, as Hugging Face's
saved files do.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict

from attnlab.tokenizers.bytelevel import alphabet
from attnlab.io.progress import Progress


def train_bpe(
    word_counts: Counter[str] | dict[str, int],
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] = (),
    min_frequency: int = 2,
    show_progress: bool = False,
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Learn a vocabulary and merges from words already spelled in the byte alphabet.

    Args:
        word_counts: word (byte characters, e.g. ``"Ġhello"``) → how often it occurs.
        vocab_size: target size, special tokens and the 256 bytes included.
        special_tokens: put first in the vocabulary, in this order.
        min_frequency: a pair must occur at least this often to be merged.
        show_progress: report merges on stderr.

    Returns:
        ``(vocab, merges)``: token → id, and the merges in rank order.

    Raises:
        ValueError: if ``vocab_size`` cannot hold the specials and the 256 bytes, or
            ``min_frequency`` is negative.
    """
    specials = list(dict.fromkeys(special_tokens))
    if vocab_size < len(specials) + 256:
        raise ValueError(
            f"vocab_size must be at least {len(specials) + 256} for byte-level BPE "
            f"(256 bytes + {len(specials)} special tokens), got {vocab_size}"
        )
    if min_frequency < 0:
        raise ValueError(f"min_frequency must be >= 0, got {min_frequency}")

    id_to_token: list[str] = list(specials)
    token_to_id = {t: i for i, t in enumerate(id_to_token)}
    chars = set(alphabet())
    for word in word_counts:
        chars.update(word)
    for char in sorted(chars):
        if char not in token_to_id:
            token_to_id[char] = len(id_to_token)
            id_to_token.append(char)

    words = [[token_to_id[c] for c in word] for word in word_counts]
    counts = list(word_counts.values())
    pair_counts: defaultdict[tuple[int, int], int] = defaultdict(int)
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for i, (word, count) in enumerate(zip(words, counts)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += count
            where[pair].add(i)

    # Max-queue by count, then smallest pair: (-count, left, right, tiebreak, word positions).
    queue: list = []
    serial = 0
    for pair, positions in where.items():
        if pair_counts[pair] > 0:
            queue.append((-pair_counts[pair], pair[0], pair[1], serial, positions))
            serial += 1
    heapq.heapify(queue)

    merges: list[tuple[int, int]] = []
    progress = Progress(vocab_size - len(token_to_id), unit="merge", desc="merges", enabled=show_progress)
    while len(token_to_id) < vocab_size and queue:
        neg_count, left, right, _, positions = heapq.heappop(queue)
        current = pair_counts[(left, right)]
        if -neg_count != current:  # stale: put back with its current count
            heapq.heappush(queue, (-current, left, right, serial, positions))
            serial += 1
            continue
        if current < 1 or current < min_frequency:
            break
        new_token = id_to_token[left] + id_to_token[right]
        new_id = token_to_id.get(new_token)
        if new_id is None:
            new_id = token_to_id[new_token] = len(id_to_token)
            id_to_token.append(new_token)
        merges.append((left, right))

        touched: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        for w in positions:
            for pair, delta in _merge_word(words[w], left, right, new_id):
                pair_counts[pair] += delta * counts[w]
                if delta > 0:
                    touched[pair].add(w)
        for pair, found_in in touched.items():
            if pair_counts[pair] > 0:
                heapq.heappush(queue, (-pair_counts[pair], pair[0], pair[1], serial, found_in))
                serial += 1
        progress.update(1, f"({len(token_to_id)} tokens)")
    progress.close(f"({len(token_to_id)} tokens)")

    ranked: dict[tuple[int, int], int] = {}
    for rank, pair in enumerate(merges):  # a repeated pair keeps its last rank
        ranked.pop(pair, None)
        ranked[pair] = rank
    merge_list = [(id_to_token[a], id_to_token[b]) for a, b in ranked]
    return token_to_id, merge_list


def _merge_word(word: list[int], left: int, right: int, new_id: int) -> list[tuple[tuple[int, int], int]]:
    """Merge ``left right`` → ``new_id`` in place, left to right; return pair count changes.

    The merged pair's own count is left alone (it is not offered again), as in Hugging Face.

    Example:
        >>> w = [1, 2, 2, 3]
        >>> _merge_word(w, 2, 2, 9), w
        ([((1, 2), -1), ((1, 9), 1), ((2, 3), -1), ((9, 3), 1)], [1, 9, 3])
    """
    changes: list[tuple[tuple[int, int], int]] = []
    i = 0
    while i < len(word) - 1:
        if word[i] == left and word[i + 1] == right:
            if i > 0:
                changes.append(((word[i - 1], left), -1))
                changes.append(((word[i - 1], new_id), 1))
            word[i : i + 2] = [new_id]
            if i < len(word) - 1:
                changes.append(((right, word[i + 1]), -1))
                changes.append(((new_id, word[i + 1]), 1))
        i += 1
    return changes
