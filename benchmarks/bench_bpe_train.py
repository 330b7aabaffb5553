"""Byte-level BPE training, attnlab against Hugging Face `tokenizers`' BpeTrainer, as JSON.

Setting (the issue's): real text, the start of a built-in corpus's training split cut at a line
end (20 MB to 32,000 tokens and 5 MB to 16,000 by default), read from the file by each side
(attnlab: `Tokenizer.train(path, kind="bpe")`; HF: `Tokenizer(BPE())` with the ByteLevel
pre-tokenizer and `BpeTrainer(initial_alphabet=ByteLevel.alphabet())`, `train([path])`), one
thread each (HF with RAYON_NUM_THREADS=1), min_frequency 2, special token `<|endoftext|>`.

Method: every run is a fresh Python process; the two sides take turns (A B, B A, A B, ...) for
--rounds rounds, so a shared machine's load hits both alike, and the JSON gives medians and the
ratios of the medians. Each child times its training call (wall and process CPU time: on a busy
machine CPU time is the steadier of the two) and reports its peak resident set (VmHWM of
/proc/self/status: interpreter, imports and training together, as a user would run it; not
ru_maxrss, which counts the parent's memory that a child has before it execs).
The merges of the first round are compared: `merges_identical` must be true. /proc/loadavg is
recorded before and after.

    python benchmarks/bench_bpe_train.py                       # debian-text, 20 MB and 5 MB, 3 rounds
    python benchmarks/bench_bpe_train.py --corpus python-docs --sizes 10:32000 --rounds 5
    python benchmarks/bench_bpe_train.py --quick               # 2 MB to 8,000, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import loadavg, peak_rss_mib

SIDES = ("attnlab", "hf")
SPECIAL = "<|endoftext|>"


def train_attnlab(path: Path, vocab_size: int) -> list[tuple[str, str]]:
    from attnlab.tokenizers import Tokenizer

    return Tokenizer.train(path, kind="bpe", vocab_size=vocab_size, special_tokens=[SPECIAL]).model.merges


def train_hf(path: Path, vocab_size: int) -> list[tuple[str, str]]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(path)], trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


def child(side: str, path: Path, vocab_size: int, merges_out: Path) -> None:
    """One training run in this process; prints its timings as JSON, writes the merges."""
    train = train_attnlab if side == "attnlab" else train_hf
    wall, cpu = time.perf_counter(), time.process_time()
    merges = train(path, vocab_size)
    result = {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu, "merges": len(merges),
              "peak_mib": peak_rss_mib()}
    merges_out.write_text(json.dumps(merges), encoding="utf-8")
    print(json.dumps(result))


def run_child(side: str, path: Path, vocab_size: int, merges_out: Path) -> dict:
    """A fresh process for one run: its timings and its peak resident set (MiB)."""
    env = dict(os.environ, RAYON_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child", side, str(path), str(vocab_size), str(merges_out)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, text=True)
    if done.returncode:
        raise RuntimeError(f"{side} training failed (exit {done.returncode}): {' '.join(cmd)}")
    return json.loads(done.stdout)


def corpus_head(source: Path, megabytes: float, folder: Path) -> Path:
    """The first `megabytes` MB (10^6 bytes) of `source`, cut after a line end, as a file."""
    with open(source, "rb") as f:
        data = f.read(int(megabytes * 1e6))
    if len(data) < megabytes * 1e6 * 0.99:
        raise SystemExit(f"--sizes: {source} holds {len(data) / 1e6:.1f} MB, less than {megabytes} MB")
    data = data[: data.rfind(b"\n") + 1]
    path = folder / f"head-{megabytes:g}mb.txt"
    path.write_bytes(data)
    return path


def measure(path: Path, vocab_size: int, rounds: int, folder: Path) -> dict:
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    merges: dict[str, list] = {}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            out = folder / f"merges-{side}.json"
            runs[side].append(run_child(side, path, vocab_size, out))
            if r == 0:
                merges[side] = json.loads(out.read_text(encoding="utf-8"))
    keys = ("seconds", "cpu_seconds", "peak_mib")
    med = {side: {key: statistics.median(run[key] for run in runs[side]) for key in keys} for side in SIDES}
    ours, hf = med["attnlab"], med["hf"]
    return {
        "megabytes": round(path.stat().st_size / 1e6, 2), "vocab_size": vocab_size,
        "merges_identical": merges["attnlab"] == merges["hf"], "merges": len(merges["attnlab"]),
        "attnlab": {**ours, "rounds": runs["attnlab"]}, "hf": {**hf, "rounds": runs["hf"]},
        "time_ratio": ours["seconds"] / hf["seconds"], "cpu_time_ratio": ours["cpu_seconds"] / hf["cpu_seconds"],
        "peak_memory_ratio": ours["peak_mib"] / hf["peak_mib"],
        "goal": "time_ratio <= 1.5, peak_memory_ratio <= 1.0, merges_identical",
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        side, path, vocab_size, out = sys.argv[2:6]
        return child(side, Path(path), int(vocab_size), Path(out))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="debian-text", help="a built-in corpus (fetched if needed) or a text file")
    parser.add_argument("--sizes", default="20:32000,5:16000", help="MB:vocab_size pairs, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 MB to 8,000 tokens, 1 round")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds = "2:8000", 1
    from attnlab.data.sources import resolve_source

    source = resolve_source(args.corpus, "train")
    load_before = loadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            megabytes, vocab_size = size.split(":")
            path = corpus_head(source, float(megabytes), Path(tmp))
            results.append(measure(path, int(vocab_size), args.rounds, Path(tmp)))
    import tokenizers

    report = {"benchmark": "bpe_train", "corpus": args.corpus, "threads": 1, "results": results,
              "loadavg_before": load_before, "loadavg_after": loadavg(),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "tokenizers": tokenizers.__version__}}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
