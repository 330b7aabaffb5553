"""ROUGE-1/2/L equal Google's rouge-score package (the reference) on real English text."""

import inspect
import json
import random
import re

import pytest
from rouge_score import rouge_scorer

from attnlab.evaluation import lcs_length, rouge, rouge_pair


def _real_sentences() -> list[str]:
    """Sentences of the standard library's own documentation (real prose, no download)."""
    import argparse, collections, json as json_module, pathlib, shutil, textwrap  # noqa: E401
    text = " ".join(inspect.getdoc(m) or "" for m in (argparse, collections, json_module, pathlib, shutil, textwrap,
                                                      random, re, inspect))
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 4]
    assert len(sentences) >= 40
    return sentences


def test_pairs_of_real_sentences_equal_the_reference_package():
    sentences = _real_sentences()
    rng = random.Random(0)
    pairs = [(a, a) for a in sentences[:5]]  # identical
    pairs += [(a, b) for a, b in zip(sentences, sentences[1:])]  # neighbours: some overlap
    for a in sentences[:30]:  # a summary cut from its own sentence: high overlap, reordered words
        words = a.split()
        rng.shuffle(words)
        pairs.append((" ".join(words[: max(1, len(words) // 2)]), a))
    pairs.append(("", sentences[0]))
    pairs.append(("!!! ??? ...", sentences[1]))  # no ROUGE tokens at all
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    for summary, reference in pairs:
        ours = rouge_pair(summary, reference)
        theirs = scorer.score(reference, summary)  # (target, prediction)
        for key in ours:
            assert ours[key] == pytest.approx(theirs[key].fmeasure, abs=1e-12), (key, summary, reference)


def test_corpus_score_is_the_mean_in_percent():
    summaries, references = ["the cat sat", "a dog ran home"], ["the cat sat down", "the dog ran"]
    per_pair = [rouge_pair(s, r) for s, r in zip(summaries, references)]
    scores = rouge(summaries, references)
    assert scores["rougeL"] == pytest.approx(50 * (per_pair[0]["rougeL"] + per_pair[1]["rougeL"]))


def test_lcs_is_a_subsequence_length_and_symmetric():
    a, b = "a b c b d a b".split(), "b d c a b a".split()
    assert lcs_length(a, b) == lcs_length(b, a) == 4  # the textbook example (e.g. b c b a)
    assert lcs_length(a, []) == 0


def test_mismatched_or_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        rouge(["a"], [])
    with pytest.raises(ValueError, match="at least one"):
        rouge([], [])
