"""What reading a model's activations costs: a forward that records them (`run_with_cache`) against a
plain forward of the same model on the same batch, in one process, interleaved rounds, medians.

    plain     model(ids) under torch.no_grad()
    cached    run_with_cache(model, ids): every hook point but the per-head results (the default);
              the attention patterns are computed on the side, since the fused kernel holds none
    hooked    model(ids) with a do-nothing hook on every point (what a patching sweep pays per run)

The goal (issue "Inside any model"): a cached forward at least 0.8x as fast as a plain one; it is
checked here, not in goals.py, whose table is one recorded run of every benchmark. That a
model without hooks runs as fast as before the points existed is bench_commits.py's measure
(training and decoding at two commits).

    python benchmarks/bench_hooks.py                   # prints one JSON object
    python benchmarks/bench_hooks.py --rounds 9 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from machine import loadavg


def _timed(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3, help="forwards per timing")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from attnlab import ModelConfig, build_model
    from attnlab.inspect.hooks import hooks, run_with_cache

    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=args.vocab, d_model=args.d_model, num_layers=args.layers,
                      num_heads=args.d_model // 64, d_ff=4 * args.d_model, dropout=0.0,
                      position={"scheme": "learned", "max_len": args.seq_len})
    model = build_model(cfg).eval()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len))
    points = len(model.hook_points())

    def plain():
        with torch.no_grad():
            model(ids)

    def cached():
        with torch.no_grad():
            run_with_cache(model, ids)

    def hooked():
        with torch.no_grad(), hooks(model, {"*": lambda a, name: None}):
            model(ids)

    cases = {"plain": plain, "cached": cached, "hooked": hooked}
    for fn in cases.values():  # warm-up
        fn()
    load_before = loadavg()
    times: dict[str, list[float]] = {name: [] for name in cases}
    ratios: dict[str, list[float]] = {"cached": [], "hooked": []}
    for r in range(args.rounds):
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        got = {name: _timed(cases[name], args.repeats) for name in order}
        for name, seconds in got.items():
            times[name].append(seconds)
        for name in ratios:
            ratios[name].append(got["plain"] / got[name])
    report = {
        "benchmark": "bench_hooks",
        "shape": f"decoder {args.layers}L-{args.d_model} V={args.vocab}, batch {args.batch} x {args.seq_len}",
        "hook_points": points, "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
        "torch": torch.__version__, "load_before": load_before, "load_after": loadavg(),
        "median_seconds": {name: statistics.median(ts) for name, ts in times.items()},
        # speed relative to the plain forward, the median of the per-round ratios (1.0 = as fast)
        "cached_vs_plain": statistics.median(ratios["cached"]),
        "hooked_vs_plain": statistics.median(ratios["hooked"]),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
