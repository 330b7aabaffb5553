import math

import pytest
import torch

from attnlab import build_model, presets
from attnlab.evaluation import _greedy_uncached, bleu_chrf, continue_text, greedy_decode, perplexity


def test_perplexity():
    assert perplexity(0.0) == 1.0 and math.isclose(perplexity(math.log(50)), 50)
    assert perplexity(1e6) == float("inf")


def test_bleu_chrf_match_sacrebleu_on_known_cases():
    sacrebleu = pytest.importorskip("sacrebleu")
    hyps = ["the cat sat on the mat", "a quick brown fox"]
    refs = ["the cat sat on the mat", "the quick brown fox jumps"]
    scores = bleu_chrf(hyps, refs)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert bleu_chrf(refs, refs) == {"bleu": pytest.approx(100.0), "chrf": pytest.approx(100.0)}
    with pytest.raises(ValueError, match="length"):
        bleu_chrf(hyps, refs[:1])


def test_greedy_decode_equals_the_uncached_loop():
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-encoder-decoder")).eval()
    src = torch.randint(3, 97, (3, 7))
    mask = torch.ones_like(src)
    mask[1, 5:] = 0
    fast = greedy_decode(model, src, mask, bos_id=1, eos_id=2, max_new_tokens=10)
    ref = _greedy_uncached(model, src, mask, 1, 2, 10)
    n = min(fast.shape[1], ref.shape[1])
    for row_fast, row_ref in zip(fast.tolist(), ref.tolist()):
        cut = lambda r: r[: r.index(2) + 1] if 2 in r[1:] else r
        assert cut(row_fast[:n]) == cut(row_ref[:n])


def test_continue_text_greedy_is_the_argmax_chain():
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-decoder")).eval()
    out = continue_text(model, [5, 6], 4, context=64, temperature=0)
    ids = [5, 6]
    for _ in range(4):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out == ids
