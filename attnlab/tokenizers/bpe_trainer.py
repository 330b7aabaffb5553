"""Learning byte-level BPE merges from word counts.

The procedure is the one of Hugging Face's ``BpeTrainer``, so that both learn the same merges
from the same corpus (tested in ``tests/tokenizers/test_bpe_trainer.py``):

1. ids: the special tokens first, then the alphabet (the 256 byte characters and any other
   character in the words) in code point order;
2. count every adjacent pair of symbols in every word, weighted by the word's count, and
   remember which words hold each pair;
3. repeatedly take the most frequent pair from a priority queue (ties: the pair whose
   ``(left id, right id)`` is smallest), merge it in the words its queue entry names, and
   update the counts of only the pairs around each merge — no recount of the corpus. Queue
   entries are refreshed lazily: an entry whose count is out of date goes back in with its
   current count. A pair formed anew by a merge gets an entry of its own naming the words
   it was formed in (so a pair can have several entries, each merging its own words);
4. stop at ``vocab_size`` tokens, or when the best pair occurs fewer than ``min_frequency``
   times.

When two merges spell the same string (``ab + c`` and ``a + bc``), the token gets one id and
the merge list keeps both pairs; a pair merged twice keeps its last rank, as Hugging Face's
saved files do.

Memory is what limits a large corpus, so the state is kept in plain ints (``ids_memory`` in
``benchmarks/bench_bpe_train.py`` measures it against Hugging Face's trainer):

- a pair ``(left, right)`` is one int key, ``left << shift | right``, ordered as the tuple is;
- a queue entry is one int packing ``(-count, key, serial)`` (smallest first: most frequent,
  then smallest pair, then oldest entry); the serial indexes a list of the entries' words,
  each one word index or a list of them, ascending;
- pairs whose count falls to zero leave the count table (they cannot be merged again).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from attnlab.io.progress import Progress
from attnlab.tokenizers.bytelevel import alphabet


def train_bpe(
    word_counts: Mapping[str, int],
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

    # An entry is -count << count_shift | key << serial_bits | serial: the fields below the count
    # are non-negative and fit in count_shift bits, so ints order as (-count, key, serial) tuples.
    shift = max(vocab_size, len(id_to_token)).bit_length()  # every id fits in `shift` bits
    serial_bits = 64  # room for 2^64 queue entries
    count_shift, key_mask, serial_mask = 2 * shift + serial_bits, (1 << 2 * shift) - 1, (1 << serial_bits) - 1
    words = [list(map(token_to_id.__getitem__, word)) for word in word_counts]
    counts = list(word_counts.values())
    pair_counts, first_words = _count_pairs(words, counts, shift)
    entry_words = list(first_words.values())  # entry serial -> its words (None once popped)
    queue = [-pair_counts[key] << count_shift | key << serial_bits | serial for serial, key in enumerate(first_words)]
    del first_words
    heapq.heapify(queue)

    merges: list[tuple[int, int]] = []
    progress = Progress(vocab_size - len(id_to_token), unit="merge", desc="merges", enabled=show_progress)
    while len(id_to_token) < vocab_size and queue:
        entry = heapq.heappop(queue)
        key, serial = entry >> serial_bits & key_mask, entry & serial_mask
        positions, entry_words[serial] = entry_words[serial], None
        current = pair_counts.get(key, 0)
        if -(entry >> count_shift) != current:  # stale: put back with its current count
            if current > 0:  # (a pair at zero never comes back to the top before the loop ends)
                heapq.heappush(queue, -current << count_shift | key << serial_bits | len(entry_words))
                entry_words.append(positions)
            continue
        if current < 1 or current < min_frequency:
            break
        left, right = key >> shift, key & ((1 << shift) - 1)
        new_token = id_to_token[left] + id_to_token[right]
        new_id = token_to_id.get(new_token)
        if new_id is None:
            new_id = token_to_id[new_token] = len(id_to_token)
            id_to_token.append(new_token)
        merges.append((left, right))

        formed = _merge_pair(words, counts, pair_counts, positions, left, right, new_id, shift)
        for pair, found in formed.items():
            count = pair_counts.get(pair, 0)
            if count > 0:
                heapq.heappush(queue, -count << count_shift | pair << serial_bits | len(entry_words))
                entry_words.append(found)
        progress.update(1)
    progress.close(f"({len(id_to_token)} tokens)")

    ranked: dict[tuple[int, int], int] = {}
    for rank, pair in enumerate(merges):  # a repeated pair keeps its last rank
        ranked.pop(pair, None)
        ranked[pair] = rank
    merge_list = [(id_to_token[a], id_to_token[b]) for a, b in ranked]
    return token_to_id, merge_list


def _count_pairs(words: list[list[int]], counts: list[int],
                 shift: int) -> tuple[dict[int, int], dict[int, int | list[int]]]:
    """Weighted count of each pair key, and the words holding it (an index, or a list of them).

    Example:
        >>> _count_pairs([[1, 2, 1, 2], [2, 1]], [3, 5], shift=4)
        ({18: 6, 33: 8}, {18: 0, 33: [0, 1]})
    """
    pair_counts: dict[int, int] = {}
    found: dict[int, int | list[int]] = {}
    get = pair_counts.get
    for w, word in enumerate(words):
        count = counts[w]
        for left, right in zip(word, word[1:]):
            key = left << shift | right
            pair_counts[key] = get(key, 0) + count
            _note(found, key, w)
    return pair_counts, found


def _note(found: dict[int, int | list[int]], key: int, w: int) -> None:
    """Add word ``w`` to ``found[key]``: an int for one word, a list for more (words are
    visited in ascending order, so a repeat is always the last one noted)."""
    seen = found.get(key)
    if seen is None:
        found[key] = w
    elif type(seen) is int:
        if seen != w:
            found[key] = [seen, w]
    elif seen[-1] != w:
        seen.append(w)


def _merge_pair(words: list[list[int]], counts: list[int], pair_counts: dict[int, int],
                positions: int | list[int], left: int, right: int, new_id: int,
                shift: int) -> dict[int, int | list[int]]:
    """Merge ``left right`` → ``new_id`` in the words at ``positions``, in place, left to right.

    Around each merge, the pairs with the old neighbours lose the word's count and the pairs
    with ``new_id`` gain it; the merged pair's own count is left alone (it is not offered
    again), as in Hugging Face. Returns the pairs gained, each with the words it was gained
    in (``_note``'s form) — a pair gained and lost again in one word counts as gained.

    Example:
        >>> words, pair_counts = [[1, 2, 2, 2, 3]], {0x12: 1, 0x22: 2, 0x23: 1}
        >>> _merge_pair(words, [1], pair_counts, 0, 2, 2, 9, shift=4), words, pair_counts
        ({25: 0, 146: 0}, [[1, 9, 2, 3]], {34: 1, 35: 1, 25: 1, 146: 1})
    """
    formed: dict[int, int | list[int]] = {}
    get = pair_counts.get
    right_key, new_key = right << shift, new_id << shift
    for w in (positions,) if type(positions) is int else positions:
        word, count = words[w], counts[w]
        i, last = 0, len(word) - 1
        while i < last:
            if word[i] == left and word[i + 1] == right:
                if i:
                    before = word[i - 1] << shift
                    _lose(pair_counts, before | left, count)
                    pair_counts[before | new_id] = get(before | new_id, 0) + count
                    _note(formed, before | new_id, w)
                word[i] = new_id
                del word[i + 1]
                last -= 1
                if i < last:
                    after = word[i + 1]
                    _lose(pair_counts, right_key | after, count)
                    pair_counts[new_key | after] = get(new_key | after, 0) + count
                    _note(formed, new_key | after, w)
            i += 1
    return formed


def _lose(pair_counts: dict[int, int], key: int, count: int) -> None:
    """Take ``count`` from a pair's count, dropping the pair at zero."""
    left = pair_counts[key] - count
    if left:
        pair_counts[key] = left
    else:
        del pair_counts[key]
