"""Learning a WordPiece vocabulary from word counts.

Words start as characters, those after the first written with the continuation prefix
(``"hug"`` → ``h ##u ##g``); merging ``h`` and ``##u`` gives ``hu``, ``##u`` and ``##g`` gives
``##ug``. Pairs of adjacent symbols are merged greedily, choosing by one of two criteria:

- ``"frequency"`` (default): the most frequent pair, as BPE does. This is what Hugging Face's
  ``WordPieceTrainer`` does (it runs its BPE trainer with the ``##`` prefix), and it gives
  useful vocabularies even when small.
- ``"likelihood"``: WordPiece's likelihood gain (Schuster & Nakajima 2012; Wu et al. 2016),
  ``count(a b) / (count(a) · count(b))``, which favours pairs whose parts seldom occur
  apart. On small corpora it spends the vocabulary on rare letter pairs (``q ##u``) first.

Only pairs seen at least ``min_frequency`` times are merged. Ties go to the more frequent
pair, then to the smaller ids. The vocabulary is: special tokens, the alphabet (characters,
then continuation characters, each in code point order), then merged tokens in
the order learned — deterministic, unlike Hugging Face's, whose ids for ``##`` characters
follow a hash map's order and change from run to run. As in Hugging Face's trainer, every
character seen is in the alphabet in its word-initial form too, even if it only occurred
inside words, so that new text starting with it is not unknown.

Counts are updated incrementally around each merge. With the likelihood criterion, merging
``a`` and ``b`` lowers ``count(a)`` and ``count(b)``, so the pairs holding ``a`` or ``b`` are
re-scored at once; other stale queue entries are refreshed when they come to the top.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict

from attnlab.io.progress import Progress

CRITERIA = ("frequency", "likelihood")


def train_wordpiece(
    word_counts: Counter[str] | dict[str, int],
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] = (),
    min_frequency: int = 2,
    prefix: str = "##",
    criterion: str = "frequency",
    show_progress: bool = False,
) -> dict[str, int]:
    """Learn a WordPiece vocabulary from normalized, pre-tokenized words.

    Args:
        word_counts: word → how often it occurs.
        vocab_size: target size, special tokens and alphabet included.
        special_tokens: put first, in this order.
        min_frequency: a pair must occur at least this often to be merged (at least 1).
        prefix: continuation prefix.
        criterion: ``"frequency"`` or ``"likelihood"`` (see the module docstring).
        show_progress: report merges on stderr.

    Returns:
        token → id.

    Raises:
        ValueError: if ``vocab_size`` is smaller than the specials plus the alphabet, or
            ``criterion`` is unknown.
    """
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}; got {criterion!r}")
    specials = list(dict.fromkeys(special_tokens))
    min_frequency = max(1, min_frequency)
    id_to_token: list[str] = list(specials)
    token_to_id = {t: i for i, t in enumerate(id_to_token)}
    initial = {c for w in word_counts for c in w}  # every character may start a new word
    continuing = {c for w in word_counts for c in w[1:]}
    alphabet = sorted(initial) + [prefix + c for c in sorted(continuing)]
    for token in alphabet:
        if token not in token_to_id:
            token_to_id[token] = len(id_to_token)
            id_to_token.append(token)
    if vocab_size < len(id_to_token):
        raise ValueError(
            f"vocab_size must be at least {len(id_to_token)} for this corpus "
            f"({len(specials)} special tokens + {len(alphabet)} characters), got {vocab_size}"
        )

    words = [[token_to_id[w[0]]] + [token_to_id[prefix + c] for c in w[1:]] for w in word_counts if w]
    counts = [c for w, c in word_counts.items() if w]
    freq: defaultdict[int, int] = defaultdict(int)
    pair_counts: defaultdict[tuple[int, int], int] = defaultdict(int)
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    pairs_of: defaultdict[int, set[tuple[int, int]]] = defaultdict(set)
    for i, (word, count) in enumerate(zip(words, counts)):
        for sym in word:
            freq[sym] += count
        for pair in zip(word, word[1:]):
            pair_counts[pair] += count
            where[pair].add(i)
            pairs_of[pair[0]].add(pair)
            pairs_of[pair[1]].add(pair)

    likelihood = criterion == "likelihood"

    def entry(pair: tuple[int, int]) -> tuple[float, int, int, int]:
        n = pair_counts[pair]
        score = n / (freq[pair[0]] * freq[pair[1]]) if likelihood else 0.0
        return (-score, -n, pair[0], pair[1])

    queue = [entry(p) for p in pair_counts if pair_counts[p] >= min_frequency]
    heapq.heapify(queue)
    progress = Progress(vocab_size - len(token_to_id), unit="merge", desc="merges", enabled=show_progress)
    merged = 0
    while len(token_to_id) < vocab_size and queue:
        top = heapq.heappop(queue)
        pair = (top[2], top[3])
        if pair_counts[pair] < min_frequency:
            continue
        current = entry(pair)
        if current != top:
            heapq.heappush(queue, current)
            continue
        left, right = pair
        new_token = id_to_token[left] + id_to_token[right][len(prefix):]
        new_id = token_to_id.get(new_token)
        if new_id is None:
            new_id = token_to_id[new_token] = len(id_to_token)
            id_to_token.append(new_token)
        merged += 1

        touched: set[tuple[int, int]] = set()
        for w in list(where[pair]):
            before = len(words[w])
            changes = _merge_word(words[w], left, right, new_id)
            times = before - len(words[w])
            freq[left] -= times * counts[w]
            freq[right] -= times * counts[w]
            freq[new_id] += times * counts[w]
            for changed, delta in changes:
                pair_counts[changed] += delta * counts[w]
                if delta > 0:
                    where[changed].add(w)
                    pairs_of[changed[0]].add(changed)
                    pairs_of[changed[1]].add(changed)
                    touched.add(changed)
        pair_counts[pair] = 0
        del where[pair]
        if likelihood:  # count(left) and count(right) fell: pairs holding them score higher now
            for sym in (left, right):
                live = {p for p in pairs_of[sym] if pair_counts[p] > 0}
                pairs_of[sym] = live
                touched |= live
        for changed in touched:
            if pair_counts[changed] >= min_frequency:
                heapq.heappush(queue, entry(changed))
        progress.update(1, f"({len(token_to_id)} tokens)")
    progress.close(f"({len(token_to_id)} tokens)")
    return token_to_id


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
