"""Tokenising a corpus into token files on 1 process against several, as JSON.

Setting: the training pipeline's path. A byte-level BPE tokenizer (8,000 tokens, trained once
on the first 5 MB of the corpus) encodes the corpus's whole training split, read as the
pipeline reads it (`attnlab.data.sources.read_pieces`), into a token file with an EOS after each
document (`TokenFile.build(..., workers=N)`). The speedup is the one-process median time over
the N-process one; `identical` says every run wrote the same bytes (.bin and .idx).

Method: every run is a fresh Python process; the worker counts take turns (1 2, 2 1, 1 2, ...)
for --rounds rounds, so a shared machine's load hits all alike; medians are reported. Each
child reports its wall time, its own and its workers' CPU time, its peak resident set (VmHWM)
and its workers' largest (ru_maxrss, which counts the pages a worker shares with its parent).
/proc/loadavg is recorded before and after: with N processes the speedup needs N idle cores.
A shared machine may not give them: with the kernel's autogroup scheduling (Linux's default for
desktop sessions, /proc/sys/kernel/sched_autogroup_enabled) a session's processes share one
slice of the CPU however many there are. `idle_speedup_bound` is the load-proof companion:
N x (one process's CPU time) / (N processes' CPU time), the speedup N idle cores would give if
the batches spread evenly (it counts the parallel version's extra work: IPC, each worker's cache).

    python benchmarks/bench_tokenise.py                        # debian-text (22.6M characters), 1 vs 2
    python benchmarks/bench_tokenise.py --workers 1,2,4 --rounds 5
    python benchmarks/bench_tokenise.py --quick                # python-docs, 1 round
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import loadavg, peak_rss_mib


def child(workers: int, tokenizer_path: Path, corpus: Path, prefix: Path) -> None:
    """One tokenisation in this process (and its workers); prints the measurements as JSON."""
    from attnlab.data.sources import read_pieces
    from attnlab.data.tokenized import TokenFile
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.load(tokenizer_path)
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = TokenFile.build(prefix, read_pieces(corpus), tok.encode, tok.vocab_size, eos_id=tok.eos_token_id,
                             show_progress=False, workers=workers)
    seconds, own_cpu = time.perf_counter() - wall, time.process_time() - cpu
    workers_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    digest = hashlib.sha256(prefix.with_suffix(".bin").read_bytes() + prefix.with_suffix(".idx").read_bytes())
    print(json.dumps({"seconds": seconds, "cpu_seconds": own_cpu + workers_usage.ru_utime + workers_usage.ru_stime,
                      "tokens": len(tokens), "sha256": digest.hexdigest(), "peak_mib": peak_rss_mib(),
                      "workers_peak_mib": workers_usage.ru_maxrss / 1024 if workers > 1 else None}))


def run_child(workers: int, tokenizer_path: Path, corpus: Path, folder: Path) -> dict:
    prefix = folder / f"tokens-{workers}"
    cmd = [sys.executable, __file__, "--child", str(workers), str(tokenizer_path), str(corpus), str(prefix)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"), text=True)
    if done.returncode:
        raise RuntimeError(f"tokenising with {workers} workers failed (exit {done.returncode}): {' '.join(cmd)}")
    for part in prefix.parent.glob(prefix.name + ".*"):
        part.unlink()
    return json.loads(done.stdout)


def train_tokenizer(corpus: Path, folder: Path, vocab_size: int) -> Path:
    from attnlab.tokenizers import Tokenizer

    with open(corpus, encoding="utf-8") as f:
        head = f.read(5_000_000)
    path = folder / "tokenizer.json"
    Tokenizer.train([head[: head.rfind("\n") + 1]], kind="bpe", vocab_size=vocab_size).save(path)
    return path


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        workers, tokenizer_path, corpus, prefix = sys.argv[2:6]
        return child(int(workers), Path(tokenizer_path), Path(corpus), Path(prefix))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="debian-text", help="a built-in corpus (fetched if needed) or a text file")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare, comma-separated (1 first)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="python-docs, 1 round")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.quick:
        args.corpus, args.rounds = "python-docs", 1
    counts = [int(n) for n in args.workers.split(",")]
    if counts[0] != 1 or len(counts) < 2:
        raise SystemExit("--workers: start with 1 (the baseline) and give at least one more count, e.g. 1,2")
    from attnlab.data.sources import resolve_source

    corpus = resolve_source(args.corpus, "train")
    load_before = loadavg()
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_path = train_tokenizer(corpus, Path(tmp), args.vocab_size)
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                runs[n].append(run_child(n, tokenizer_path, corpus, Path(tmp)))
    chars = len(corpus.read_text(encoding="utf-8", errors="replace"))
    median = {n: statistics.median(run["seconds"] for run in runs[n]) for n in counts}
    sides = {str(n): {"seconds": median[n], "chars_per_s": chars / median[n],
                      "cpu_seconds": statistics.median(run["cpu_seconds"] for run in runs[n]),
                      "peak_mib": statistics.median(run["peak_mib"] for run in runs[n]), "rounds": runs[n]}
             for n in counts}
    report = {
        "benchmark": "tokenise", "corpus": args.corpus, "characters": chars, "vocab_size": args.vocab_size,
        "tokens": runs[1][0]["tokens"], "workers": sides,
        "speedup": {str(n): median[1] / median[n] for n in counts[1:]},
        "idle_speedup_bound": {str(n): n * sides["1"]["cpu_seconds"] / sides[str(n)]["cpu_seconds"]
                               for n in counts[1:]},
        "identical": len({run["sha256"] for n in counts for run in runs[n]}) == 1,
        "goal": "speedup['2'] >= 1.5 on 2 idle cores, identical",
        "loadavg_before": load_before, "loadavg_after": loadavg(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
