"""Evaluation metrics: perplexity, BLEU and chrF (through sacrebleu). Decoding is
`attnlab.decoding.generate`'s.

    ppl = perplexity(mean_loss)                                   # exp(mean token NLL)
    scores = bleu_chrf(hypotheses, references)                    # {"bleu": .., "chrf": ..}

BLEU: Papineni et al. 2002 (https://aclanthology.org/P02-1040); chrF: Popovic 2015
(https://aclanthology.org/W15-3049); both as sacrebleu computes them (Post 2018), so the
numbers compare with published ones.
"""

from __future__ import annotations

import math
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
