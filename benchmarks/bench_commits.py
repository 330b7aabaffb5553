"""The training loop's and greedy decoding's speed at two commits, side by side: the check that a
restructuring left the speed as it was.

Each round runs, for the base commit and then for the working tree (order alternating by round),
one fresh Python process that imports attnlab from that tree and measures

    train    steps/s of `Trainer.fit` (the real loop: task, strategy, run folder, checkpoints at
             the end) on a 4-layer decoder, d_model 256, batch 16 x 128 tokens, fp32; the first
             `--warmup` steps left out (timed from the `on_step` calls)
    decode   tokens/s of `attnlab.generate` greedy, batch 1, 128 new tokens, KV cache

Medians over rounds are reported, and the median of the per-round ratios (the two trees of a
round ran back to back, so a change in the machine's load mostly cancels in the ratio).

    python benchmarks/bench_commits.py --base HEAD~3            # prints one JSON object
    python benchmarks/bench_commits.py --base 7dcc286 --rounds 7 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from machine import loadavg

ROOT = Path(__file__).resolve().parents[1]

# Runs in the measured tree's own interpreter process: prints {"train_steps_s", "decode_tok_s"}.
PROBE = textwrap.dedent("""
    import json, random, sys, time
    from pathlib import Path
    import torch
    torch.set_num_threads(int(sys.argv[2]))
    import attnlab
    from attnlab.training import TrainConfig, Trainer

    folder, steps, warmup = Path(sys.argv[1]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(0)
    words = "the king queen lord speak hath thou thee love death night day sword crown blood".split()
    (folder / "train.txt").write_text("\\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(4000)))
    (folder / "valid.txt").write_text("\\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(200)))
    config = TrainConfig.from_dict({
        "model": {"preset": "tiny-decoder", "d_model": 256, "num_layers": 4, "num_heads": 4, "d_ff": 1024,
                  "dropout": 0.0, "position": {"scheme": "rotary", "max_len": 128}},
        "data": {"source": str(folder / "train.txt"), "valid": str(folder / "valid.txt"), "seq_len": 128,
                 "batch_size": 16},
        "optim": {"lr": 1e-3}, "schedule": {"name": "constant"},
        "train": {"out_dir": str(folder / "run"), "max_steps": steps, "eval_every": 10 ** 6,
                  "checkpoint_every": 10 ** 6, "log_every": 10 ** 6, "seed": 0, "precision": "fp32",
                  "threads": int(sys.argv[2])}})
    trainer = Trainer(config, show_progress=False, log=lambda _: None)
    stamps = []
    trainer.fit(on_step=lambda record: stamps.append(time.perf_counter()))
    train = (steps - warmup) / (stamps[-1] - stamps[warmup - 1])
    model = trainer.model.eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    attnlab.generate(model, prompt, max_new_tokens=8)
    start = time.perf_counter()
    out = attnlab.generate(model, prompt, max_new_tokens=128)
    decode = (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - start)
    print(json.dumps({"train_steps_s": train, "decode_tok_s": decode}))
""")


def measure(tree: Path, threads: int, steps: int, warmup: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, "-c", PROBE, folder, str(threads), str(steps), str(warmup)], env=env,
                              cwd=folder, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError(f"the probe failed in {tree}:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare the working tree with (any git revision)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not 0 < args.warmup < args.steps:
        parser.error("--warmup must be at least 1 and below --steps")
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    head_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), base_rev], cwd=ROOT, check=True)
        try:
            trees = {"base": base, "head": ROOT}
            runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
            load = [loadavg()]
            for r in range(args.rounds):
                for name in (("base", "head") if r % 2 == 0 else ("head", "base")):
                    runs[name].append(measure(trees[name], args.threads, args.steps, args.warmup))
                load.append(loadavg())
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    result = {"base": base_rev, "head": f"{head_rev} + working tree", "rounds": args.rounds, "threads": args.threads,
              "steps": args.steps, "warmup": args.warmup, "loadavg": load}
    for metric in ("train_steps_s", "decode_tok_s"):
        b = [run[metric] for run in runs["base"]]
        h = [run[metric] for run in runs["head"]]
        result[metric] = {"base_median": statistics.median(b), "head_median": statistics.median(h),
                          "head_over_base_median_of_rounds": statistics.median(x / y for x, y in zip(h, b)),
                          "base": b, "head": h}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
