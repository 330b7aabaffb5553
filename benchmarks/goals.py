"""The speed goals, measured in one go: runs each benchmark once, reads its JSON, and prints every
goal's target, the measured value and whether it is met. Run it on an idle machine (it takes
about 15 minutes on 2 CPU cores: 814 s for benchmarks/results/goals-2026-11-28-xeon-amx-2.json);
the benchmarks' own JSON goes to --out beside the table.

    python benchmarks/goals.py --out runs/goals.json
    python benchmarks/goals.py --only decoding --out runs/goals-decoding.json

Each benchmark compares against its peer in the same run (interleaved, medians), so a ratio
holds on the machine it was measured on; the table also records the load average before and
after each benchmark. A goal whose benchmark failed or did not report the value shows as
"missing", never as met.
"""

from __future__ import annotations

import argparse
import json
import operator
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Goal:
    """One target: `value(report)` compared with `target` by `op` (">=" or "<=")."""

    name: str
    bench: str  # key of BENCHES
    value: Callable[[dict], Any]
    op: str
    target: float

    def check(self, report: dict | None) -> dict:
        """{"goal", "target", "value", "met"}; value None (and met False) when the report lacks it."""
        try:
            value = self.value(report) if report is not None else None
        except (KeyError, IndexError, TypeError, StopIteration):
            value = None
        compare = {">=": operator.ge, "<=": operator.le}[self.op]
        met = value is not None and bool(compare(value, self.target))
        return {"goal": self.name, "target": f"{self.op} {self.target:g}", "value": value, "met": met}


# benchmark -> (group, the command line after `python`, run in benchmarks/)
BENCHES: dict[str, tuple[str, list[str]]] = {
    "train": ("training", ["train_throughput.py", "--threads", "2"]),
    "seq2seq": ("training", ["bench_seq2seq_train.py", "--threads", "2"]),
    "generate": ("decoding", ["bench_generate.py", "--threads", "2", "--repeats", "3"]),
    "weights": ("decoding", ["bench_generate.py", "--only", "weights", "--weights", "bf16", "int8", "--threads", "1"]),
    "long": ("long", ["bench_long_attention.py", "--sizes", "65536", "--kernels", "sliding_window", "--repeat", "3",
                      "--threads", "2"]),
    "bpe": ("tokenizers", ["bench_bpe_train.py"]),
    "tokenise": ("tokenizers", ["bench_tokenise.py"]),
    "encode": ("tokenizers", ["bench_encode.py"]),
}


def _run_of(report: dict, vocab: int) -> dict:
    return next(r for r in report["runs"] if r["vocab"] == vocab)


def _case(report: dict, prefix: str, batch: int) -> dict:
    return next(c for c in report["cases"] if c["case"].startswith(prefix) and c.get("batch") == batch)


def _weights(report: dict, shape: str, fmt: str, key: str = "speedup_vs_fp32") -> float:
    case = next(c for c in report["cases"] if c["case"] == f"greedy gpt2-{shape} batch 1, weights")
    return case["formats"][fmt][key]


def _window_64k(report: dict, key: str) -> float:
    return next(r for r in report["results"] if r["kernel"] == "sliding_window" and r["T"] == 65536)[key]


def _encoded(report: dict, text: str) -> dict:
    return next(r for r in report["results"] if r["text"] == text)


def _bpe(report: dict, vocab: int, key: str) -> float:
    return next(r for r in report["results"] if r["vocab_size"] == vocab)[key]


GOALS: list[Goal] = [
    Goal("train fp32 V=50,304: MFU of the fp32 matmul peak", "train", lambda r: _run_of(r, 50304)["attnlab_fp32_mfu"],
         ">=", 0.80),
    Goal("train fp32 V=50,304: x Hugging Face", "train",
         lambda r: _run_of(r, 50304)["ratio_attnlab_fp32_vs_hf_fp32"], ">=", 1.8),
    Goal("train fp32 V=4,096: x Hugging Face", "train", lambda r: _run_of(r, 4096)["ratio_attnlab_fp32_vs_hf_fp32"],
         ">=", 1.3),
    Goal("train bf16 V=50,304: MFU of the bf16 matmul peak", "train",
         lambda r: _run_of(r, 50304)["attnlab_bf16_mfu"], ">=", 0.60),
    Goal("seq2seq train (base shape): x torch.nn.Transformer", "seq2seq", lambda r: r["ratio_vs_nn_transformer"],
         ">=", 1.2),
    Goal("seq2seq train (base shape): x Marian", "seq2seq", lambda r: r["ratio_vs_marian"], ">=", 1.0),
    Goal("greedy fp32 batch 1 V=50,304: fraction of copy bandwidth", "generate",
         lambda r: _case(r, "greedy gpt2-6L-384 V=50304", 1)["ours_fraction_of_bandwidth_limit"], ">=", 0.85),
    Goal("greedy fp32 batch 1 V=4,096: fraction of copy bandwidth", "generate",
         lambda r: _case(r, "greedy gpt2-6L-384 V=4096", 1)["ours_fraction_of_bandwidth_limit"], ">=", 0.85),
    Goal("greedy batch 8 V=50,304: x Hugging Face", "generate",
         lambda r: _case(r, "greedy gpt2-6L-384 V=50304", 8)["speedup"], ">=", 2.0),
    Goal("greedy batch 8 V=4,096: x Hugging Face", "generate",
         lambda r: _case(r, "greedy gpt2-6L-384 V=4096", 8)["speedup"], ">=", 2.0),
    Goal("4-beam batch 4: x Hugging Face", "generate", lambda r: _case(r, "beam4", 4)["speedup"], ">=", 1.6),
    Goal("bf16 weights V=50,304: x fp32", "weights", lambda r: _weights(r, "6L-384 V=50304", "bf16"), ">=", 1.8),
    Goal("int8 weights V=50,304: x fp32", "weights", lambda r: _weights(r, "6L-384 V=50304", "int8"), ">=", 3.0),
    Goal("bf16 weights V=4,096: x fp32", "weights", lambda r: _weights(r, "6L-384 V=4096", "bf16"), ">=", 1.8),
    Goal("int8 weights V=4,096: x fp32", "weights", lambda r: _weights(r, "6L-384 V=4096", "int8"), ">=", 3.0),
    Goal("bf16 weights, 355M (beyond the cache): x fp32", "weights",
         lambda r: _weights(r, "24L-1024 V=50304", "bf16"), ">=", 1.8),
    Goal("int8 weights, 355M (beyond the cache): x fp32", "weights",
         lambda r: _weights(r, "24L-1024 V=50304", "int8"), ">=", 3.0),
    # the decoding steps alone (the call less the prompt and its first token), and the step's matrix
    # products alone, where the weights are read (added 2026-12-06, after the Xeon runs)
    Goal("bf16 weights, 355M: decoding step x fp32", "weights",
         lambda r: _weights(r, "24L-1024 V=50304", "bf16", "step_speedup_vs_fp32"), ">=", 1.8),
    Goal("int8 weights, 355M: decoding step x fp32", "weights",
         lambda r: _weights(r, "24L-1024 V=50304", "int8", "step_speedup_vs_fp32"), ">=", 3.0),
    Goal("int8 weights, 355M: a step's products, fraction of copy bandwidth", "weights",
         lambda r: _weights(r, "24L-1024 V=50304", "int8", "matrices_fraction_of_bandwidth_limit"), ">=", 0.8),
    Goal("sliding window w=256 at 64k, fwd+bwd: seconds", "long", lambda r: _window_64k(r, "seconds"), "<=", 1.0),
    Goal("sliding window w=256 at 64k: MiB beyond q/k/v grads", "long",
         lambda r: _window_64k(r, "peak_extra_beyond_grads_mib"), "<=", 300),
    Goal("BPE training 20 MB -> 32k: time x HF", "bpe", lambda r: _bpe(r, 32000, "time_ratio"), "<=", 1.5),
    Goal("BPE training 20 MB -> 32k: memory x HF", "bpe", lambda r: _bpe(r, 32000, "peak_memory_ratio"), "<=", 1.0),
    Goal("BPE training 20 MB -> 32k: identical merges (1 = yes)", "bpe",
         lambda r: int(_bpe(r, 32000, "merges_identical")), ">=", 1),
    Goal("tokenising a corpus: 2 processes x 1", "tokenise", lambda r: r["speedup"]["2"], ">=", 1.5),
    Goal("tokenising a corpus: identical output (1 = yes)", "tokenise", lambda r: int(r["identical"]), ">=", 1),
    Goal("encoding English (byte-level BPE): x tokenizers", "encode", lambda r: _encoded(r, "english")["speedup"],
         ">=", 1.0),
    Goal("encoding English, code, Japanese: identical ids (1 = yes)", "encode",
         lambda r: int(all(x["identical"] for x in r["results"]) and len(r["results"]) == 3), ">=", 1),
]


def last_json(stdout: str) -> dict | None:
    """The last JSON object a benchmark printed: from the last line that opens one at column 0
    to the end (one-line or indented objects)."""
    lines = stdout.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    return None


def run_bench(name: str) -> dict:
    """Run one benchmark in a fresh process; its report (None if it failed), time and load."""
    from machine import loadavg

    _, argv = BENCHES[name]
    load, start = loadavg(), time.perf_counter()
    print(f"[goals] {name}: python {' '.join(argv)}", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, *argv], cwd=HERE, capture_output=True, text=True, check=False)
    report = last_json(done.stdout) if done.returncode == 0 else None
    return {"command": ["python", f"benchmarks/{argv[0]}", *argv[1:]], "returncode": done.returncode,
            "seconds": round(time.perf_counter() - start, 1), "loadavg_before": load, "loadavg_after": loadavg(),
            "report": report, "stderr_tail": done.stderr.strip().splitlines()[-5:] if done.returncode else []}


def table(rows: list[dict]) -> str:
    lines = ["| goal | target | measured | met |", "|---|---|---|---|"]
    for r in rows:
        value = "missing" if r["value"] is None else (f"{r['value']:.3g}" if isinstance(r["value"], float) else r["value"])
        lines.append(f"| {r['goal']} | {r['target']} | {value} | {'yes' if r['met'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    groups = sorted({group for group, _ in BENCHES.values()})
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=groups, default=groups, help="which groups of goals to measure")
    p.add_argument("--out", type=Path, help="write the goals and every benchmark's JSON here (atomically)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    runs = {name: run_bench(name) for name, (group, _) in BENCHES.items() if group in args.only}
    rows = [goal.check(runs[goal.bench]["report"]) for goal in GOALS if goal.bench in runs]
    print(table(rows))
    if args.out:
        from attnlab.io.files import atomic_write_text

        atomic_write_text(args.out, json.dumps({"goals": rows, "benchmarks": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
