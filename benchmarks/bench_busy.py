"""Decoding on a busy machine: how much slower batch-1 greedy decoding gets when other processes
keep the cores busy, at 1 and 2 torch threads, and with OpenMP's passive wait policy.

Each measurement is a fresh process (OpenMP reads OMP_WAIT_POLICY once, when it starts) that
builds a GPT-2-style decoder (`--layers` layers, d_model `--d-model`, vocabulary `--vocab`, random
weights), warms up, then times `attnlab.generate` of `--new-tokens` tokens after a 32-token prompt;
it reports wall and CPU seconds of the decode alone. The settings:

    threads=1            torch.set_num_threads(1)
    threads=2            torch.set_num_threads(2), the runtime's default wait policy
    threads=2 passive    the same with OMP_WAIT_POLICY=PASSIVE (waiting threads sleep at once
                         instead of spinning)

run idle and then with `--busy` spinning processes (pure Python loops, one core each), in
interleaved rounds (each round runs every setting once), medians. The slowdown of a setting is
its busy time over its idle time; the JSON records the load average at each phase.

    python benchmarks/bench_busy.py                    # prints one JSON object
    python benchmarks/bench_busy.py --busy 2 --rounds 5 --out benchmarks/results/busy.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from attnlab.cli.argtypes import positive_int
from machine import loadavg, write_result

SETTINGS = {"threads=1": (1, None), "threads=2": (2, None), "threads=2 passive": (2, "PASSIVE")}

CHILD = r"""
import json, sys, time, torch
threads, layers, d_model, vocab, new_tokens = map(int, sys.argv[1:6])
torch.set_num_threads(threads)
from attnlab import ModelConfig, build_model, generate
torch.manual_seed(0)
model = build_model(ModelConfig(arch="decoder", vocab_size=vocab, d_model=d_model, num_layers=layers,
                                num_heads=d_model // 64, d_ff=4 * d_model, dropout=0.0,
                                position={"scheme": "learned", "max_len": 32 + max(new_tokens, 8)})).eval()
prompt = torch.randint(0, vocab, (1, 32))
with torch.no_grad():
    generate(model, prompt, 8)  # warm-up: the inference layout of the weights, first-call paths
    wall, cpu = time.perf_counter(), time.process_time()
    generate(model, prompt, new_tokens)
    print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}))
"""


def measure(setting: str, args: argparse.Namespace) -> dict:
    threads, policy = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(args.layers), str(args.d_model),
                          str(args.vocab), str(args.new_tokens)], env=env, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the {setting} measurement failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def phase(args: argparse.Namespace) -> dict:
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    before = loadavg()
    for _ in range(args.rounds):
        for setting in SETTINGS:
            runs[setting].append(measure(setting, args))
    return {"loadavg": {"before": before, "after": loadavg()},
            "tokens_per_s": {s: args.new_tokens / statistics.median(r["wall"] for r in v) for s, v in runs.items()},
            "cpu_over_wall": {s: statistics.median(r["cpu"] / r["wall"] for r in v) for s, v in runs.items()},
            "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="spinning processes during the busy phase")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--layers", type=positive_int, default=6)
    parser.add_argument("--d-model", type=positive_int, default=384)
    parser.add_argument("--vocab", type=positive_int, default=4096)
    parser.add_argument("--new-tokens", type=positive_int, default=64)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()

    idle = phase(args)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        time.sleep(5)  # the load average starts to show them
        busy = phase(args)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    result = {"benchmark": "busy", "args": vars(args), "cpus": os.cpu_count(), "idle": idle, "busy": busy,
              "slowdown": {s: idle["tokens_per_s"][s] / busy["tokens_per_s"][s] for s in SETTINGS}}
    write_result(result, args.out)


if __name__ == "__main__":
    main()
