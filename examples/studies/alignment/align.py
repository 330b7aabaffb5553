"""The alignment study's pieces that need no model: words and their Strong's numbers from a Bible
module's OSIS, the reference alignment they give, BPE pieces pooled into words, links from a
score matrix, and the alignment error rate.

Words are the `\\w+` runs of a verse's plain text (`attnlab.data.bible.osis_to_text`): punctuation
is not a word. A word carries the Strong's numbers of the `<w lemma="strong:...">` element it
sits in (none outside one).
"""

from __future__ import annotations

import html
import re
from typing import Iterable, Sequence

import torch

WORD = re.compile(r"\w+")
_DROPPED = re.compile(r"<note\b[^>]*>.*?</note>|<title\b(?![^>]*canonical=\"true\")[^>]*>.*?</title>", re.S)
_PART = re.compile(r"<w\b([^>]*)>(.*?)</w>|<[^>]+>|[^<]+", re.S)
_STRONG = re.compile(r"strong:([HG]\d+)")

Link = tuple[int, int]  # (source word, target word)


def words(text: str) -> list[tuple[int, int]]:
    """The (start, end) character spans of the words of `text`."""
    return [m.span() for m in WORD.finditer(text)]


def osis_words(osis: str) -> list[tuple[str, frozenset[str]]]:
    """(word, its Strong's numbers) for each word of a verse's OSIS, in order; the words are those
    of the verse's plain text (notes and non-canonical titles dropped, as the corpus drops them).
    Numbers are written without leading zeros after the letter (H0413 -> H413)."""
    out: list[tuple[str, frozenset[str]]] = []
    for m in _PART.finditer(_DROPPED.sub(" ", osis)):
        if m.group(0).startswith("<") and m.group(1) is None:
            continue  # a tag other than <w>: its text (if any) comes as its own part
        if m.group(1) is not None:
            numbers = frozenset(f"{n[0]}{int(n[1:])}" for n in _STRONG.findall(m.group(1)))
            inner = html.unescape(re.sub(r"<[^>]+>", "", m.group(2)))
        else:
            numbers, inner = frozenset(), html.unescape(m.group(0))
        out += [(w, numbers) for w in WORD.findall(inner)]
    return out


def strongs_reference(source: Sequence[frozenset[str]], target: Sequence[frozenset[str]]
                      ) -> tuple[set[Link], set[Link]]:
    """(sure, possible) links between two verses' words from their Strong's numbers: a source and a
    target word are linked when they share a number; the link is sure when some shared number is
    carried by exactly one word on each side, possible otherwise (sure is a subset of possible)."""
    count_s: dict[str, int] = {}
    count_t: dict[str, int] = {}
    for numbers, count in ((source, count_s), (target, count_t)):
        for n in (x for word in numbers for x in word):
            count[n] = count.get(n, 0) + 1
    sure, possible = set(), set()
    for i, a in enumerate(source):
        for j, b in enumerate(target):
            shared = a & b
            if shared:
                possible.add((i, j))
                if any(count_s[n] == 1 and count_t[n] == 1 for n in shared):
                    sure.add((i, j))
    return sure, possible


def aer(links: Iterable[Link], sure: set[Link], possible: set[Link]) -> tuple[int, int, int, int]:
    """The counts of the alignment error rate of one sentence: (|A & S|, |A & P|, |A|, |S|), where
    P is taken to include S. Sum them over a corpus and pass them to `aer_from_counts`."""
    a = set(links)
    p = possible | sure
    return len(a & sure), len(a & p), len(a), len(sure)


def aer_from_counts(counts: Iterable[Sequence[int]]) -> float:
    """Och & Ney (2003): AER = 1 - (|A & S| + |A & P|) / (|A| + |S|), over summed counts."""
    a_s = a_p = n_a = n_s = 0
    for c in counts:
        a_s, a_p, n_a, n_s = a_s + c[0], a_p + c[1], n_a + c[2], n_s + c[3]
    if n_a + n_s == 0:
        raise ValueError("counts: no links in either the alignment or the reference")
    return 1.0 - (a_s + a_p) / (n_a + n_s)


def piece_words(piece_spans: Sequence[tuple[int, int]], word_spans: Sequence[tuple[int, int]]) -> list[int]:
    """For each piece (a character span of the text), the index of the word it overlaps most, or -1
    when it overlaps none (a space, punctuation, a special token with an empty span)."""
    out = []
    for ps, pe in piece_spans:
        best, where = 0, -1
        for k, (ws, we) in enumerate(word_spans):
            overlap = min(pe, we) - max(ps, ws)
            if overlap > best:
                best, where = overlap, k
        out.append(where)
    return out


def piece_spans(decode, ids: Sequence[int], text: str) -> list[tuple[int, int]]:
    """The character span of each of `ids` in `text`, from the decodings of growing prefixes
    (`decode(ids[:k])`): the pieces that share a character's bytes each cover that character.

    Raises:
        ValueError: the pieces do not decode to `text`.
    """
    if decode(list(ids)) != text:
        raise ValueError(f"ids: they decode to {decode(list(ids))!r}, not to the text {text!r}")
    prefixes = [decode(list(ids[:k])) for k in range(1, len(ids) + 1)]
    starts = [0] + [len(p.rstrip("\ufffd")) for p in prefixes[:-1]]  # a started character is not done
    return [(s, max(s, len(p))) for s, p in zip(starts, prefixes)]  # ... but it is where this piece writes


def pool(matrix: torch.Tensor, target_words: Sequence[int], source_words: Sequence[int],
         n_target: int, n_source: int) -> torch.Tensor:
    """A (target pieces, source pieces) score matrix as (target words, source words): summed over a
    source word's pieces (attention mass and attributions add up over the pieces of a word),
    averaged over a target word's pieces (each target piece gives one distribution). Pieces of no
    word (-1) are dropped."""
    matrix = matrix.detach().double()
    src = torch.zeros(matrix.shape[1], n_source, dtype=matrix.dtype)
    for k, w in enumerate(source_words):
        if w >= 0:
            src[k, w] = 1.0
    tgt = torch.zeros(n_target, matrix.shape[0], dtype=matrix.dtype)
    for k, w in enumerate(target_words):
        if w >= 0:
            tgt[w, k] = 1.0
    tgt = tgt / tgt.sum(1, keepdim=True).clamp(min=1.0)
    return tgt @ matrix @ src


def argmax_links(scores: torch.Tensor) -> set[Link]:
    """Each target word linked to its best source word: {(source, target)} from a (target, source) matrix."""
    if scores.numel() == 0:
        return set()
    return {(int(j), i) for i, j in enumerate(scores.argmax(1).tolist())}


def threshold_links(scores: torch.Tensor, threshold: float) -> set[Link]:
    """Every (source, target) whose score is at least `threshold` of the target word's total score."""
    share = scores / scores.sum(1, keepdim=True).clamp(min=1e-12)
    return {(int(j), int(i)) for i, j in (share >= threshold).nonzero().tolist()}


def restrict(links: Iterable[Link], source_ok: Sequence[bool], target_ok: Sequence[bool]) -> set[Link]:
    """The links between words the reference can judge (both carry a Strong's number)."""
    return {(i, j) for i, j in links if source_ok[i] and target_ok[j]}


def overlap(a: Sequence[frozenset[str]], b: Sequence[frozenset[str]]) -> float:
    """Jaccard overlap of two verses' sets of Strong's numbers (0 when either has none)."""
    x = set().union(*a) if a else set()
    y = set().union(*b) if b else set()
    return len(x & y) / len(x | y) if x and y else 0.0
