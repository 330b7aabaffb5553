"""Beam search's stopping rule against references, on a toy model whose next-token log-probs are a
random table of (step, last token): over a thousand searches in a few seconds.

- With length_penalty = 0 a running beam's score can only fall (log-probs are <= 0), so the
  early-stop bound is exact: stopping once the best live beam cannot beat the worst kept
  hypothesis must give what the search gives when it never stops (`never_stopping_beams`).
- For any length penalty and either early_stopping, the result equals `reference_beams`, the
  documented rule (Hugging Face's `num_beams` semantics, beam.py's docstring) written as plain
  lists: a stop that comes too early or too late changes some of the searches."""

import pytest
import torch

from attnlab.decoding.beam import beam_search
from attnlab.decoding.runner import Runner
from attnlab.decoding.search import DecodeOptions

V, EOS, P = 5, 4, 2
UNREACHABLE = -1.0e9  # the start score of beams 1..K-1: the first step expands beam 0 only


class TableRunner(Runner):
    """log p(next | ids) = table[L, ids[-1]]: stateless, so expand and reorder have nothing to move."""

    def __init__(self, table: torch.Tensor):
        self.table = table  # (steps + P + 1, V, V) log-probs

    def start(self, prompt, mask):
        return self.table[prompt.shape[1], prompt[:, -1]]

    def step(self, ids, mask):
        return self.table[ids.shape[1], ids[:, -1]]

    def expand(self, index):
        pass

    def reorder(self, index):
        pass


def _table(seed: int, steps: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(steps + P + 1, V, V, generator=g, dtype=torch.float64) * 1.5
    logits[..., EOS] += torch.rand(steps + P + 1, V, generator=g, dtype=torch.float64) * 2 - 0.5  # EOS now and then
    return logits.log_softmax(-1)


def _candidates(table, beams, L):
    """Every (score, beam, token) extension of the live beams, best first."""
    out = []
    for b, (seq, score) in enumerate(beams):
        row = table[L, seq[-1]]
        out += [(score + float(row[v]), b, v) for v in range(V)]
    return sorted(out, key=lambda c: -c[0])


def _add(hyps, score, seq, K):
    hyps.append((score, seq))
    hyps.sort(key=lambda h: -h[0])
    del hyps[K:]


def reference_beams(table, prompt, K, steps, length_penalty, early_stopping, stop=True):
    """The documented search for one item, in lists: each step the best 2K extensions are read in
    order; one ending in EOS (any, at the last step) among the first K becomes a hypothesis scored
    sum log p / n ** length_penalty (n new tokens), the first K others are the next beams. With
    `stop`, the item ends once it holds K hypotheses and (early_stopping) at once, or (otherwise)
    when its best next beam, normalised the same way, no longer beats the worst of them."""
    beams = [(tuple(prompt), 0.0)] + [(tuple(prompt), UNREACHABLE)] * (K - 1)
    hyps = []
    for t in range(steps):
        n, last = t + 1, t + 1 == steps
        full_before = len(hyps) >= K
        nxt = []
        for rank, (score, b, v) in enumerate(_candidates(table, beams, P + t)[:2 * K]):
            seq = beams[b][0] + (v,)
            if v == EOS or last:
                if rank < K and not (stop and early_stopping and full_before):
                    _add(hyps, score / n ** length_penalty, seq[P:], K)
            elif len(nxt) < K:
                nxt.append((seq, score))
        if last:
            break
        if stop and len(hyps) >= K:
            if early_stopping or nxt[0][1] / n ** length_penalty <= hyps[-1][0]:
                return hyps, t
        beams = nxt
    return hyps, steps


def never_stopping_beams(table, prompt, K, steps, length_penalty):
    return reference_beams(table, prompt, K, steps, length_penalty, False, stop=False)[0]


def _search(table, prompts, K, steps, length_penalty, early_stopping):
    """beam_search over a batch of prompts -> per item, its K (score, new tokens up to EOS)."""
    B = len(prompts)
    ids = torch.zeros(B, P + steps, dtype=torch.long)
    ids[:, :P] = torch.tensor(prompts)
    valid = torch.ones_like(ids, dtype=torch.bool)
    opt = DecodeOptions(eos=torch.tensor([EOS]), pad_token_id=0)
    out, scores = beam_search(TableRunner(table), ids, valid, P, steps, opt, num_beams=K,
                              length_penalty=length_penalty, early_stopping=early_stopping,
                              num_return_sequences=K, padded=False)
    hyps = []
    for row, score in zip(out, scores.tolist()):
        new = row[P:].tolist()
        hyps.append((score, tuple(new[:new.index(EOS) + 1] if EOS in new else new)))
    return [hyps[b * K:(b + 1) * K] for b in range(B)]


def _same(got, expected):
    return [s for _, s in got] == [s for _, s in expected] and all(
        abs(a - b) < 1e-6 for (a, _), (b, _) in zip(got, expected))


@pytest.mark.parametrize("K", [2, 3])
def test_exact_bound_without_length_penalty_equals_never_stopping(K):
    steps, stopped_early = 7, 0
    for seed in range(100):
        table = _table(seed, steps)
        got, = _search(table, [[1, 2]], K, steps, 0.0, early_stopping=False)
        assert _same(got, never_stopping_beams(table, [1, 2], K, steps, 0.0)), f"seed {seed}"
        stopped_early += reference_beams(table, [1, 2], K, steps, 0.0, False)[1] < steps
    assert stopped_early >= 10  # the bound did end searches early, so the check covered it


@pytest.mark.parametrize("early_stopping", [False, True])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_stopping_rule_equals_the_reference(length_penalty, early_stopping):
    # two items per batch: one may stop while the other goes on, and must then take no hypothesis
    K, steps, stop_mattered, prompts = 2, 7, 0, [[1, 2], [3, 0]]
    for seed in range(100):
        table = _table(seed, steps)
        for prompt, got in zip(prompts, _search(table, prompts, K, steps, length_penalty, early_stopping)):
            expected, _ = reference_beams(table, prompt, K, steps, length_penalty, early_stopping)
            assert _same(got, expected), f"seed {seed}, prompt {prompt}"
            stop_mattered += not _same(expected, never_stopping_beams(table, prompt, K, steps, length_penalty))
    if length_penalty > 0 or early_stopping:
        assert stop_mattered >= 2  # searches whose answer depends on when the item stops
