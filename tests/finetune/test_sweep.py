"""The seed sweep continues exactly the best seeds by validation score."""

import pytest

from attnlab.finetune.sweep import seed_sweep


class FakeRun:
    def __init__(self, seed, log):
        self.seed, self.steps, self.log = seed, 0, log

    def train(self, steps):
        self.steps += steps
        self.log.append((self.seed, steps))


SCORES = {3: 0.2, 5: 0.9, 7: 0.5, 11: 0.9, 13: 0.1}


def test_sweep_continues_exactly_the_m_best_seeds():
    log = []
    result = seed_sweep(list(SCORES), lambda s: FakeRun(s, log), lambda run: SCORES[run.seed] + run.steps / 1000,
                        probe_steps=10, total_steps=30, keep=3)
    assert result.kept == [5, 11, 7]  # 5 and 11 tie at 0.9: the earlier in the list first
    continued = [seed for seed, steps in log if steps == 20]
    assert continued == [5, 11, 7]
    assert [seed for seed, steps in log if steps == 10] == list(SCORES)
    assert set(result.runs) == {5, 11, 7} and all(r.steps == 30 for r in result.runs.values())
    assert result.probe == pytest.approx({s: v + 0.01 for s, v in SCORES.items()})
    assert result.best_seed == 5


def test_sweep_best_is_chosen_by_final_score():
    final = {1: 0.3, 2: 0.8}
    result = seed_sweep([1, 2, 4], lambda s: FakeRun(s, []),
                        lambda run: final.get(run.seed, 0.5) if run.steps > 5 else {1: 0.9, 2: 0.7, 4: 0.1}[run.seed],
                        probe_steps=5, total_steps=10, keep=2)
    assert result.kept == [1, 2] and result.best_seed == 2


@pytest.mark.parametrize("kwargs, match", [(dict(seeds=[], keep=1), "seeds"), (dict(seeds=[1, 1], keep=1), "seeds"),
                                           (dict(seeds=[1], keep=2), "keep")])
def test_sweep_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        seed_sweep(kwargs["seeds"], lambda s: FakeRun(s, []), lambda r: 0.0, probe_steps=1, total_steps=2,
                   keep=kwargs["keep"])
