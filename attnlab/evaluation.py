"""Evaluation metrics: perplexity, BLEU and chrF (through sacrebleu), ROUGE-1/2/L. Decoding is
`attnlab.decoding.generate`'s.

    ppl = perplexity(mean_loss)                                   # exp(mean token NLL)
    scores = bleu_chrf(hypotheses, references)                    # {"bleu": .., "chrf": ..}
    scores = rouge(summaries, references)                         # {"rouge1": .., "rouge2": .., "rougeL": ..}

BLEU: Papineni et al. 2002 (https://aclanthology.org/P02-1040); chrF: Popovic 2015
(https://aclanthology.org/W15-3049); both as sacrebleu computes them (Post 2018), so the
numbers compare with published ones. ROUGE: Lin 2004 (https://aclanthology.org/W04-1013), with
the tokenization of Google's `rouge-score` package (the usual reference), without stemming.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence


def perplexity(mean_loss: float) -> float:
    """exp(mean token negative log-likelihood, in nats); inf when it overflows."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return float("inf")


def bleu_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU and chrF of detokenised hypotheses against one reference each.

    Raises:
        ValueError: different lengths.
        ImportError: sacrebleu is not installed (with the pip command to fix it).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses ({len(hypotheses)}) and references ({len(references)}) differ in length")
    try:
        import sacrebleu
    except ImportError:
        raise ImportError("BLEU/chrF need sacrebleu: pip install sacrebleu") from None
    return {"bleu": sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score,
            "chrf": sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score}


def rouge_tokens(text: str) -> list[str]:
    """ROUGE's words: lower-cased runs of ASCII letters and digits; everything else separates
    (as the `rouge-score` package tokenizes without a stemmer)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def _f_measure(overlap: int, n_hyp: int, n_ref: int) -> float:
    precision = overlap / n_hyp if n_hyp else 0.0
    recall = overlap / n_ref if n_ref else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def _ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of a and b (one row of the O(|a| |b|) table)."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0  # table[i-1][j-1]
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_pair(summary: str, reference: str) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 (clipped n-gram overlap) and ROUGE-L (longest common subsequence)
    F-measures of one summary against its reference, each in [0, 1]."""
    hyp, ref = rouge_tokens(summary), rouge_tokens(reference)
    scores = {}
    for n in (1, 2):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        scores[f"rouge{n}"] = _f_measure(sum((h & r).values()), sum(h.values()), sum(r.values()))
    scores["rougeL"] = _f_measure(lcs_length(hyp, ref), len(hyp), len(ref))
    return scores


def rouge(summaries: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measure over pairs, in percent (as summarisation papers report it).

    Raises:
        ValueError: different lengths, or no pairs.
    """
    if len(summaries) != len(references):
        raise ValueError(f"summaries ({len(summaries)}) and references ({len(references)}) differ in length")
    if not summaries:
        raise ValueError("rouge needs at least one summary")
    pairs = [rouge_pair(s, r) for s, r in zip(summaries, references)]
    return {key: 100 * sum(p[key] for p in pairs) / len(pairs) for key in ("rouge1", "rouge2", "rougeL")}
