"""Many seeds, keep the best: start n runs, evaluate each after s steps, continue the best m.

Fine-tuning BERT-sized models is unstable across seeds (Dodge et al. 2020, "Fine-Tuning
Pretrained Language Models: Weight Initializations, Data Orders, and Early Stopping",
https://arxiv.org/abs/2002.06305): their recipe starts many seeds, stops the bad ones early
and continues the good ones. Here:

    for seed in seeds:            run = start(seed); run.train(probe_steps); score[seed] = evaluate(run)
    kept = the `keep` seeds with the highest score (ties: the earlier seed in `seeds`);
           when keep == len(seeds) nothing is cut and the probe score is not computed (nan)
    for seed in kept:             run.train(total_steps - probe_steps); final[seed] = evaluate(run)

An interrupted sweep resumes with the probe scores it had measured (`known_probe`): a run
resumed past its probe step cannot be evaluated at the probe again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence


class Run(Protocol):
    def train(self, steps: int) -> None: ...


@dataclass
class SweepResult:
    """probe: {seed: score after probe_steps}; kept: the continued seeds (best first);
    final: {seed: score at the end}; best_seed; runs: {seed: run} for the kept seeds."""

    probe: dict[int, float]
    kept: list[int]
    final: dict[int, float]
    best_seed: int
    runs: dict[int, Any] = field(default_factory=dict)


def seed_sweep(seeds: Sequence[int], start: Callable[[int], Run], evaluate: Callable[[Run], float], *,
               probe_steps: int, total_steps: int, keep: int, known_probe: dict[int, float] | None = None,
               on_probe: Callable[[int, float], None] | None = None) -> SweepResult:
    """Run the sweep described in the module docstring (higher score = better).

    Args:
        seeds: distinct seeds, in priority order for ties.
        start: seed -> a fresh run with `train(steps)`.
        evaluate: run -> validation score.
        probe_steps: steps before the cut (>= 0).
        total_steps: steps of a continued run in all (>= probe_steps).
        keep: how many seeds continue (1 <= keep <= len(seeds)).
        known_probe: probe scores measured before an interruption, taken as they are.
        on_probe: called with (seed, score) after each probe evaluation (to record it).

    Returns:
        a SweepResult; dropped runs are released after their probe.

    Raises:
        ValueError: bad seeds, steps or keep.
    """
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct ints, got {seeds}")
    if not 1 <= keep <= len(seeds):
        raise ValueError(f"keep must be in [1, {len(seeds)}], got {keep}")
    if not 0 <= probe_steps <= total_steps:
        raise ValueError(f"need 0 <= probe_steps ({probe_steps}) <= total_steps ({total_steps})")
    probe, live = {}, {}
    for seed in seeds:
        run = start(seed)
        run.train(probe_steps)
        # with nothing to choose (keep == all seeds) the probe evaluation is skipped
        if keep == len(seeds):
            probe[seed] = float("nan")
        elif known_probe and seed in known_probe:
            probe[seed] = float(known_probe[seed])
        else:
            probe[seed] = float(evaluate(run))
            if on_probe is not None:
                on_probe(seed, probe[seed])
        live[seed] = run
        ranked = sorted(live, key=lambda s: (-probe[s] if keep < len(seeds) else 0.0, seeds.index(s)))
        for dropped in ranked[keep:]:  # keep at most `keep` runs in memory
            del live[dropped]
    kept = sorted(live, key=lambda s: (-probe[s] if keep < len(seeds) else 0.0, seeds.index(s)))
    final = {}
    for seed in kept:
        live[seed].train(total_steps - probe_steps)
        final[seed] = float(evaluate(live[seed]))
    best = max(kept, key=lambda s: (final[s], -seeds.index(s)))
    return SweepResult(probe, kept, final, best, live)
