"""Lab `bpe-merge`: one merge step of byte-pair encoding (Sennrich et al. 2016).

The student writes `best_pair(words, counts)` (the pair to merge next, ties broken as attnlab's
trainer breaks them) and `merge_pair(word, pair, new_id)`; `learn_merges` runs the training loop
over them, and the checks hold its merges to `attnlab.tokenizers.bpe_trainer.train_bpe` (itself
tested equal to Hugging Face's trainer) on real text and on small corpora full of ties.
"""

from __future__ import annotations

import random
from collections import Counter
from types import ModuleType
from typing import Callable

from attnlab.labs.base import Check, CheckFailed, Lab, need
from attnlab.tokenizers.bpe_trainer import train_bpe
from attnlab.tokenizers.bytelevel import alphabet, to_byte_chars

STUB = '''"""Lab bpe-merge: one merge step of byte-pair encoding (Sennrich et al. 2016).

Training BPE repeats: find the most frequent adjacent pair of symbols, give it a new id, merge it
everywhere. `attnlab lab check bpe-merge` runs that loop over your two functions and compares
its merges with attnlab's trainer on real text.
"""


def best_pair(words, counts):
    """The pair to merge next.

    Args:
        words: the corpus's distinct words, each a list of symbol ids, e.g. [[5, 3, 3], [3, 3]].
        counts: how often each word occurs, e.g. [2, 1].

    Returns:
        ((left, right), count): the adjacent pair that occurs most often, counting each place it
        occurs inside a word and weighting by the word's count (above: (3, 3) occurs 2 * 1 + 1 * 1
        = 3 times), and that count. Ties: the smallest pair, comparing (left, right) as tuples.
        None when no word has two symbols.

    Hints:
        - pairs of a word: zip(word, word[1:])
        - collections.Counter, then max over (count, -left, -right) or min over (-count, left, right)
    """
    raise NotImplementedError("write best_pair(): see the docstring")


def merge_pair(word, pair, new_id):
    """The word with every occurrence of `pair` replaced by `new_id`.

    Args:
        word: a list of symbol ids, e.g. [4, 4, 4, 2].
        pair: (left, right), e.g. (4, 4).
        new_id: the merged symbol's id, e.g. 9.

    Returns:
        a new list, scanning left to right and merging greedily: [4, 4, 4, 2] -> [9, 4, 2]
        (an occurrence that overlaps one already merged is left). A word without the pair comes
        back unchanged.
    """
    raise NotImplementedError("write merge_pair(): see the docstring")
'''

SOLUTION = '''"""The reference solution of lab bpe-merge: attnlab's trainer's pair count and merge."""

from attnlab.tokenizers.bpe_trainer import _count_pairs, _merge_pair


def _shift(*ids):
    return max(ids, default=0).bit_length() + 1


def best_pair(words, counts):
    shift = _shift(*(i for w in words for i in w))
    pair_counts, _ = _count_pairs(words, counts, shift)
    if not pair_counts:
        return None
    key = min(pair_counts, key=lambda k: (-pair_counts[k], k))  # keys order as (left, right) do
    return (key >> shift, key & ((1 << shift) - 1)), pair_counts[key]


def merge_pair(word, pair, new_id):
    shift = _shift(*word, *pair, new_id)
    words = [list(word)]
    pair_counts, _ = _count_pairs(words, [1], shift)
    if pair[0] << shift | pair[1] in pair_counts:
        _merge_pair(words, [1], pair_counts, 0, pair[0], pair[1], new_id, shift)
    return words[0]
'''


def learn_merges(best_pair: Callable, merge_pair: Callable, word_counts: dict[str, int], vocab_size: int,
                 min_frequency: int = 2) -> list[tuple[str, str]]:
    """BPE training over `best_pair` and `merge_pair`, with the ids and stopping rule of
    `train_bpe` (no special tokens): the byte alphabet and the words' characters in code point
    order, then one id per new token; stop at `vocab_size` or when the best pair occurs fewer
    than `min_frequency` times. Returns the merges as token pairs, in rank order."""
    chars = sorted(set(alphabet()).union(*word_counts))
    id_to_token = list(chars)
    token_to_id = {t: i for i, t in enumerate(id_to_token)}
    words = [[token_to_id[c] for c in w] for w in word_counts]
    counts = list(word_counts.values())
    merges: list[tuple[int, int]] = []
    while len(id_to_token) < vocab_size:
        found = best_pair(words, counts)
        if found is None:
            break
        (left, right), count = found
        if count < max(1, min_frequency):
            break
        token = id_to_token[left] + id_to_token[right]
        if token not in token_to_id:
            token_to_id[token] = len(id_to_token)
            id_to_token.append(token)
        merges.append((left, right))
        words = [merge_pair(w, (left, right), token_to_id[token]) for w in words]
    ranked: dict[tuple[int, int], int] = {}
    for rank, pair in enumerate(merges):  # a repeated pair keeps its last rank, as train_bpe's list does
        ranked.pop(pair, None)
        ranked[pair] = rank
    return [(id_to_token[a], id_to_token[b]) for a, b in ranked]


def word_counts_of(text: str) -> dict[str, int]:
    """Whitespace-separated words of `text`, spelled in the byte alphabet with GPT-2's space
    marker (a simpler split than the tokenizer's; both trainers see the same words)."""
    return dict(Counter(to_byte_chars(" " + w) for w in text.split()))


def _text() -> str:
    """Real prose and code: the Python reference manual's topics (pydoc_data ships with Python)."""
    import pydoc_data.topics

    return " ".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))[:6000]


def _expect(got, expected, what: str) -> None:
    if got != expected:
        raise CheckFailed(f"{what}: expected {expected!r}, got {got!r}")


def check_best_pair_counts(module):
    best = need(module, "best_pair")
    _expect(best([[5, 3, 3], [3, 3]], [2, 1]), ((3, 3), 3), "best_pair([[5, 3, 3], [3, 3]], [2, 1])")
    _expect(best([[1, 2, 3], [2, 3]], [1, 5]), ((2, 3), 6), "best_pair([[1, 2, 3], [2, 3]], [1, 5]) (counts weigh)")
    _expect(best([[7, 7, 7]], [2]), ((7, 7), 4), "best_pair([[7, 7, 7]], [2]) (every place a pair occurs)")
    _expect(best([[1, 2], [3, 4]], [3, 1]), ((1, 2), 3), "best_pair([[1, 2], [3, 4]], [3, 1]) (not across words)")


def check_best_pair_ties(module):
    best = need(module, "best_pair")
    _expect(best([[9, 1], [2, 8], [2, 5]], [1, 1, 1]), ((2, 5), 1), "best_pair([[9, 1], [2, 8], [2, 5]], [1, 1, 1])")
    _expect(best([[4, 6, 3, 1]], [2]), ((3, 1), 2), "best_pair([[4, 6, 3, 1]], [2])")


def check_best_pair_none(module):
    _expect(need(module, "best_pair")([[4], [2], []], [3, 1, 1]), None, "best_pair([[4], [2], []], ...) (no pair)")


def check_merge_pair(module):
    merge = need(module, "merge_pair")
    _expect(merge([1, 2, 3, 1, 2], (1, 2), 9), [9, 3, 9], "merge_pair([1, 2, 3, 1, 2], (1, 2), 9)")
    _expect(merge([4, 4, 4, 2], (4, 4), 9), [9, 4, 2], "merge_pair([4, 4, 4, 2], (4, 4), 9) (left to right)")
    _expect(merge([4, 4, 4, 4], (4, 4), 9), [9, 9], "merge_pair([4, 4, 4, 4], (4, 4), 9)")
    _expect(merge([2, 1, 3], (1, 2), 9), [2, 1, 3], "merge_pair([2, 1, 3], (1, 2), 9) (no such pair)")
    _expect(merge([5], (5, 5), 9), [5], "merge_pair([5], (5, 5), 9)")


def _compare(module: ModuleType, word_counts: dict[str, int], merges: int, min_frequency: int, what: str) -> None:
    vocab_size = len(set(alphabet()).union(*word_counts)) + merges
    _, expected = train_bpe(word_counts, vocab_size, min_frequency=min_frequency)
    got = learn_merges(need(module, "best_pair"), need(module, "merge_pair"), word_counts, vocab_size, min_frequency)
    for rank, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            raise CheckFailed(f"{what}: merge {rank} expected {e!r}, got {g!r}")
    if len(got) != len(expected):
        raise CheckFailed(f"{what}: expected {len(expected)} merges, got {len(got)}")


def check_real_text(module):
    _compare(module, word_counts_of(_text()), 100, 2, "100 merges on the Python manual's text")


def check_ties(module):
    rng = random.Random(0)
    for trial in range(20):
        text = " ".join("".join(rng.choice("abc") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(3, 12)))
        _compare(module, word_counts_of(text), 12, 1, f"corpus {text!r}")


CHECKS = (
    Check("best_pair counts weighted pairs", check_best_pair_counts),
    Check("best_pair breaks ties by smallest (left, right)", check_best_pair_ties),
    Check("best_pair with no pair", check_best_pair_none),
    Check("merge_pair", check_merge_pair),
    Check("merges equal attnlab's trainer on real text", check_real_text),
    Check("merges equal attnlab's trainer on corpora full of ties", check_ties),
)

LAB = Lab(name="bpe-merge", filename="bpe_merge.py", writes="best_pair(words, counts), merge_pair(word, pair, new_id)",
          lecture="[T] The Transformer: sub-word tokenization", stub=STUB, solution=SOLUTION, checks=CHECKS)
