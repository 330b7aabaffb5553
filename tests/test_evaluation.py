import math

import pytest

from attnlab.evaluation import bleu_chrf, perplexity


def test_perplexity():
    assert perplexity(0.0) == 1.0 and math.isclose(perplexity(math.log(50)), 50)
    assert perplexity(1e6) == float("inf")


def test_bleu_chrf_match_sacrebleu_on_known_cases():
    import sacrebleu
    hyps = ["the cat sat on the mat", "a quick brown fox"]
    refs = ["the cat sat on the mat", "the quick brown fox jumps"]
    scores = bleu_chrf(hyps, refs)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert bleu_chrf(refs, refs) == {"bleu": pytest.approx(100.0), "chrf": pytest.approx(100.0)}
    with pytest.raises(ValueError, match="length"):
        bleu_chrf(hyps, refs[:1])
