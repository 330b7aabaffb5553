"""Forward + backward of one long-input attention layer against dense peers, as JSON.

Setting (the issue's): batch 1, 6 heads, head dim 64, fp32, q/k/v given (no projections).
Peers: PyTorch's fused `scaled_dot_product_attention` (dense, causal) and naive attention
(softmax(q k^T / sqrt(d), causal) v, materialising the T x T weights). Kernels: sliding window
(w = 256, causal: 257 keys per query), Longformer (w = 256 + 2 global tokens, causal), BigBird
(b = 64, causal: 1 window block per side, 1 global, 1 random = 4 blocks = 256 keys per query,
the sliding window's count; `bigbird_r2` is the 2-random-block variant, 320 keys) and Linformer
(k = 256; bidirectional only, so it is timed without a causal mask). The JSON records each
kernel's keys per query ("keys": nominal, and the exact mean over queries at each T). Peers are
skipped above --max-sdpa / --max-naive (recorded as "skipped" with the reason).

Method: each (kernel, T) runs in a fresh Python process. Time: wall clock of forward + backward
(`out.backward(grad)`), median of --repeat runs after a warm-up at min(T, 2048) and one at T
(none at T above 8k).
Each time is also given as process CPU time ("cpu_seconds", all threads), which a shared
machine's load disturbs far less than wall time; with --threads 1 it is the work done. Other
processes only ever add to it, so the fastest run is given too ("cpu_seconds_min").

--interleave: time ratios measured with the kernels taking turns (A, B, C, A, B, C, ...) in one
process per T, so a shared machine's load hits all alike; the JSON's "ratios" then come from
those runs (use this on a busy machine, with --threads 1). The dense peers (SDPA, naive) are
too slow to take turns: their ratios come from their own processes.

--baseline REF: also time the sliding window as of git revision REF ("sliding_window@REF": the
band kernel's file at REF, loaded beside today's, run at today's tile), so that a change to the
kernel is measured against its parent side by side, in turns in one process with --interleave.

The matrix-product floor (sliding window only): the banded kernel runs seven products per tile of
b queries, each over the window's K = (ceil(w / b) + 1) b keys and the head dim (two forward: the
scores and P v; five backward: the scores again, dV, dP, dQ, dK), 7 x 2 x H x T x K x Dh FLOP in
all. "matmul_floor_seconds" is that count over an fp32 matmul peak sampled in the same process
after the timed runs (`machine.matmul_peak`, the fastest of 5 products of 2048), and
"fraction_of_matmul_floor" the floor over the measured time: no fp32 code that computes these
products can beat the floor on this machine.

Memory: torch's CPU allocations are plain malloc/mmap, invisible to tracemalloc, so we read the
process's resident set from /proc: reset the peak with /proc/self/clear_refs ("5"), then
peak extra = VmHWM after forward + backward - VmRSS before it. q, k, v and the incoming gradient
exist before; the gradients of q, k, v (3 x T x 6 x 64 x 4 bytes, 288 MiB at 64k) are part of
the extra, and "peak_extra_beyond_grads_mib" is the extra without them: the output, the kernel's
working memory and what the allocator keeps.

    python benchmarks/bench_long_attention.py --sizes 1024,2048,4096 --out bench.json
    python benchmarks/bench_long_attention.py --sizes 16384,32768,65536 --max-sdpa 32768 \
        --kernels sdpa,sliding_window,longformer,bigbird --repeat 3 --threads 2 --out long.json
    python benchmarks/bench_long_attention.py --sizes 65536 --kernels sliding_window --baseline HEAD \
        --repeat 3 --threads 1 --interleave --out change.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

from machine import loadavg, matmul_peak, reset_peak_rss, status_bytes

KERNELS = ("sdpa", "naive", "sliding_window", "longformer", "bigbird", "bigbird_r2", "linformer")
PEERS = ("sdpa", "naive")  # dense, 10-100x slower: timed in their own processes, never in turns
BIGBIRD = {"bigbird": dict(block=64, window_blocks=1, global_blocks=1, random_blocks=1),
           "bigbird_r2": dict(block=64, window_blocks=1, global_blocks=1, random_blocks=2)}
KEYS = {"sliding_window": "w + 1 = 257", "longformer": "w + 1 = 257, + 2 global",
        "bigbird": "4 blocks of 64 = 256 (2 window, 1 global, 1 random)",
        "bigbird_r2": "5 blocks of 64 = 320 (2 window, 1 global, 2 random)", "sdpa": "all earlier (causal)",
        "naive": "all earlier (causal)", "linformer": "k = 256 projected"}
H, DH, WINDOW = 6, 64, 256
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAND = "attnlab/nn/kernels/band.py"


def band_at(ref: str) -> types.ModuleType:
    """The band kernel's module as of git revision `ref`, loaded beside today's (it imports only torch)."""
    done = subprocess.run(["git", "show", f"{ref}:{BAND}"], capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode:
        raise SystemExit(f"--baseline: cannot read {BAND} at {ref!r}: {done.stderr.strip()}")
    module = types.ModuleType(f"band_at_{ref}")
    exec(compile(done.stdout, f"{ref}:{BAND}", "exec"), module.__dict__)
    return module


def _attention(kernel: str, T: int):
    import torch
    import torch.nn.functional as F

    from attnlab.nn.kernels.bigbird import bigbird_attention
    from attnlab.nn.kernels.linformer import LinformerKernel
    from attnlab.nn.kernels.longformer import longformer_attention
    from attnlab.nn.kernels.sliding_window import sliding_window_attention

    if kernel == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if kernel == "naive":
        def naive(q, k, v):
            scores = q @ k.transpose(-1, -2) * DH**-0.5
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v
        return naive
    if kernel == "sliding_window":
        return lambda q, k, v: sliding_window_attention(q, k, v, window=WINDOW, causal=True)
    if kernel.startswith("sliding_window@"):  # what sliding_window_attention calls here: the band kernel
        band = band_at(kernel.split("@", 1)[1])
        return lambda q, k, v: band.band_attention(q, k, v, window=WINDOW, causal=True, tile=band_tile(),
                                                   scale=DH**-0.5)
    if kernel == "longformer":
        globals_ = torch.tensor([0, T // 2])
        return lambda q, k, v: longformer_attention(q, k, v, window=WINDOW, global_tokens=globals_, causal=True)
    if kernel in BIGBIRD:
        return lambda q, k, v: bigbird_attention(q, k, v, **BIGBIRD[kernel], seed=0, causal=True)
    if kernel == "linformer":
        torch.manual_seed(0)
        lin = LinformerKernel(max_len=T, k=256, num_heads=H).requires_grad_(False)
        return lambda q, k, v: lin(q, k, v, scale=DH**-0.5, causal=False)[0]
    raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def _warm_up(kernel: str, T: int) -> None:
    """One forward + backward at a small T: library set-up stays out of the first timed run."""
    import torch

    t = min(T, 2048)
    q, k, v = (torch.randn(1, H, t, DH, requires_grad=True) for _ in range(3))
    _attention(kernel, t)(q, k, v).sum().backward()


def measure_one(kernel: str, T: int, repeat: int, threads: int | None = None) -> dict:
    """Time and peak extra memory of forward + backward, in this process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    fn = _attention(kernel, T)
    q, k, v = (torch.randn(1, H, T, DH, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, H, T, DH)
    _warm_up(kernel, T)
    times, cpu, peaks = [], [], []
    runs = repeat + (1 if T <= 8192 else 0)
    for i in range(runs):
        q.grad = k.grad = v.grad = None
        reset_peak_rss()
        before = status_bytes("VmRSS")
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(q, k, v).backward(grad)
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        peak = status_bytes("VmHWM") - before
        if i or runs == repeat:
            times.append(elapsed)
            cpu.append(elapsed_cpu)
            peaks.append(peak)
    grads = 3 * T * H * DH * 4  # the gradients of q, k, v (fp32)
    row = {"kernel": kernel, "T": T, "seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu),
           "cpu_seconds_min": min(cpu), "runs": len(times), "peak_extra_mib": round(max(peaks) / 2**20, 1),
           "peak_extra_beyond_grads_mib": round((max(peaks) - grads) / 2**20, 1)}
    if kernel.startswith("sliding_window"):
        tile = band_tile()
        flops = band_flops(T, tile)
        peak = matmul_peak()
        row.update(tile=tile, matmul_flops=flops, matmul_peak_flops=round(peak),
                   matmul_floor_seconds=round(flops / peak, 3),
                   fraction_of_matmul_floor=round(flops / peak / row["seconds"], 3))
    return row


def band_tile() -> int:
    """The tile the band kernel runs the window in, today's and REF's alike (`sliding_window@REF`
    measures a change to the kernel's file, not to the tile)."""
    from attnlab.nn.kernels.sparse import default_tile

    return default_tile(WINDOW, banded=True)


def band_flops(T: int, tile: int) -> int:
    """FLOP of the band kernel's seven products (forward + backward) over a causal window of
    WINDOW, tile `tile`: every query tile against K = (ceil(w / b) + 1) b keys."""
    tiles = -(-T // tile)
    keys = (-(-WINDOW // tile) + 1) * tile
    return 7 * 2 * H * tiles * tile * keys * DH


def mean_keys(kernel: str, T: int) -> float | None:
    """The exact mean number of keys a query attends to under the kernel's causal pattern."""
    import torch

    from attnlab.nn.kernels.bigbird import bigbird_table

    i = torch.arange(T, dtype=torch.float64)
    if kernel in ("sdpa", "naive"):
        return (T + 1) / 2
    if kernel in ("sliding_window", "longformer"):
        n = i.clamp(max=WINDOW) + 1
        if kernel == "longformer":  # each global key outside the window; a global query sees all earlier
            for g in (0, T // 2):
                n += (i - g > WINDOW).double()
            for g in (0, T // 2):
                n[g] = g + 1
        return round(float(n.mean()), 1)
    if kernel in BIGBIRD:
        cfg = BIGBIRD[kernel]
        b = cfg["block"]
        table = bigbird_table(T, b, cfg["window_blocks"], cfg["global_blocks"], cfg["random_blocks"], 0, True)
        nq = table.shape[0]
        earlier = ((table != nq) & (table < torch.arange(nq)[:, None])).sum(1).double()  # whole blocks
        per_row = (earlier[:, None] * b + torch.arange(1, b + 1)).flatten()[:T]  # + own block up to itself
        return round(float(per_row.mean()), 1)
    return None


def measure_turns(kernels: list[str], T: int, repeat: int, threads: int | None = None) -> dict:
    """Median times of forward + backward with the kernels taking turns in this process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    for name in kernels:
        _warm_up(name, T)
    fns = {name: _attention(name, T) for name in kernels}
    q, k, v = (torch.randn(1, H, T, DH, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, H, T, DH)
    times: dict[str, list[float]] = {name: [] for name in kernels}
    cpu: dict[str, list[float]] = {name: [] for name in kernels}
    for i in range(repeat + (1 if T <= 8192 else 0)):
        for name, fn in fns.items():
            q.grad = k.grad = v.grad = None
            start, start_cpu = time.perf_counter(), time.process_time()
            fn(q, k, v).backward(grad)
            if i or T > 8192:
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
    return {"T": T, "runs": repeat, "seconds": {n: round(statistics.median(t), 4) for n, t in times.items()},
            "cpu_seconds": {n: round(statistics.median(t), 4) for n, t in cpu.items()},
            "cpu_seconds_min": {n: round(min(t), 4) for n, t in cpu.items()}}


def run_turns(kernels: list[str], T: int, repeat: int, timeout: float, threads: int | None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--turns", ",".join(kernels), str(T), "--repeat", str(repeat)]
    if threads:
        cmd += ["--threads", str(threads)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * len(kernels), check=False)
    except subprocess.TimeoutExpired:
        return {"T": T, "skipped": "took longer than --timeout per kernel"}
    if done.returncode:
        return {"T": T, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_isolated(kernel: str, T: int, repeat: int, timeout: float, threads: int | None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", kernel, str(T), "--repeat", str(repeat)]
    if threads:
        cmd += ["--threads", str(threads)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"kernel": kernel, "T": T, "skipped": f"took longer than --timeout {timeout:.0f} s"}
    if done.returncode:
        return {"kernel": kernel, "T": T, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: python benchmarks/bench_long_attention.py --sizes 1024,4096")
    parser.add_argument("--sizes", default="1024,2048,4096,8192", help="comma-separated T values")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, from {', '.join(KERNELS)}")
    parser.add_argument("--max-sdpa", type=int, default=16384, help="skip SDPA above this T")
    parser.add_argument("--max-naive", type=int, default=4096, help="skip naive attention above this T")
    parser.add_argument("--max-linformer", type=int, default=65536, help="skip Linformer above this T")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per point (median)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per point before giving up")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per point (default: torch's own); every kernel and peer gets the same")
    parser.add_argument("--interleave", action="store_true",
                        help="also time the kernels taking turns in one process per T; ratios come from these")
    parser.add_argument("--baseline", metavar="REF",
                        help="also time the sliding window as of this git revision (kernel sliding_window@REF)")
    parser.add_argument("--out", help="also write the JSON here (atomically)")
    parser.add_argument("--one", nargs=2, metavar=("KERNEL", "T"), help=argparse.SUPPRESS)
    parser.add_argument("--turns", nargs=2, metavar=("KERNELS", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.repeat, args.threads)))
        return 0
    if args.turns:
        print(json.dumps(measure_turns(args.turns[0].split(","), int(args.turns[1]), args.repeat, args.threads)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    kernels = args.kernels.split(",")
    for name in kernels:
        if name not in KERNELS:
            raise SystemExit(f"--kernels: unknown kernel {name!r}; choose from {', '.join(KERNELS)}")
    if args.baseline:
        band_at(args.baseline)  # fails here, not in every worker, when the revision has no band kernel
        kernels.append(f"sliding_window@{args.baseline}")
    limits = {"sdpa": args.max_sdpa, "naive": args.max_naive, "linformer": args.max_linformer}
    load_start = loadavg()
    results = []
    for T in sizes:
        for name in kernels:
            if T > limits.get(name, T):
                row = {"kernel": name, "T": T, "skipped": f"T > --max-{name} {limits[name]} (too slow or too much memory)"}
            else:
                row = run_isolated(name, T, args.repeat, args.timeout, args.threads)
            if "seconds" in row or "peak_extra_mib" in row:
                row["keys"], row["mean_keys"] = KEYS.get(name.split("@")[0]), mean_keys(name.split("@")[0], T)
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
    turns = []
    if args.interleave:
        for T in sizes:
            names = [n for n in kernels if T <= limits.get(n, T) and n not in PEERS]
            row = run_turns(names, T, args.repeat, args.timeout, args.threads)
            print(json.dumps(row), file=sys.stderr, flush=True)
            turns.append(row)
    by = {(r["kernel"], r["T"]): r for r in results}
    alone = {key: r["seconds"] for key, r in by.items() if "seconds" in r}
    seconds = {**alone, **{(n, r["T"]): t for r in turns for n, t in r.get("seconds", {}).items()}}
    alone_cpu = {key: r["cpu_seconds"] for key, r in by.items() if "cpu_seconds" in r}
    cpu = {**alone_cpu, **{(n, r["T"]): t for r in turns for n, t in r.get("cpu_seconds", {}).items()}}
    alone_min = {key: r["cpu_seconds_min"] for key, r in by.items() if "cpu_seconds_min" in r}
    cpu_min = {**alone_min, **{(n, r["T"]): t for r in turns for n, t in r.get("cpu_seconds_min", {}).items()}}
    ratios = []
    for T in sizes:
        for peer in [n for n in kernels if n != "sliding_window"]:
            like = peer in PEERS  # like against like
            wall, proc, fastest = (alone, alone_cpu, alone_min) if like else (seconds, cpu, cpu_min)
            ref, other = wall.get(("sliding_window", T)), wall.get((peer, T))
            if ref and other:
                row = {"T": T, "kernel": peer, "time_vs_sliding_window": round(other / ref, 2),
                       "measured": "separate processes" if not turns or peer in PEERS else "in turns, one process"}
                ref_mem, mem = by.get(("sliding_window", T), {}), by.get((peer, T), {})
                if "peak_extra_mib" in ref_mem and "peak_extra_mib" in mem:
                    row["memory_vs_sliding_window"] = round(mem["peak_extra_mib"] / ref_mem["peak_extra_mib"], 2)
                if proc.get(("sliding_window", T)) and proc.get((peer, T)):
                    row["cpu_time_vs_sliding_window"] = round(proc[(peer, T)] / proc[("sliding_window", T)], 2)
                if fastest.get(("sliding_window", T)) and fastest.get((peer, T)):
                    row["min_cpu_time_vs_sliding_window"] = round(fastest[(peer, T)] / fastest[("sliding_window", T)],
                                                                  2)
                ratios.append(row)

    scaling = []
    for name in kernels:
        pts = [(T, seconds[(name, T)], cpu.get((name, T))) for T in sizes if (name, T) in seconds]
        for (t1, s1, c1), (t2, s2, c2) in zip(pts, pts[1:]):
            row = {"kernel": name, "from_T": t1, "to_T": t2, "time_ratio": round(s2 / s1, 2)}
            if c1 and c2:
                row["cpu_time_ratio"] = round(c2 / c1, 2)
            scaling.append(row)
    report = {
        "setting": {"batch": 1, "heads": H, "head_dim": DH, "dtype": "float32", "window": WINDOW, "pass": "forward+backward",
                    "baseline": args.baseline and _revision(args.baseline),
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # PASSIVE: no spinning on a busy machine
                    "threads": args.threads or _threads(), "machine": os.uname().nodename, "cpus": os.cpu_count(),
                    "memory_method": "peak RSS growth: /proc/self/clear_refs then VmHWM - VmRSS, one process per point",
                    "loadavg_at_start": load_start, "loadavg_at_end": loadavg()},
        "keys_per_query": {n: KEYS[n.split("@")[0]] for n in kernels},
        "results": results, "turns": turns, "ratios": ratios, "scaling": scaling,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        from attnlab.io.files import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return 0


def _revision(ref: str) -> str:
    """The commit a git revision names (a branch or HEAD moves; the JSON keeps what was measured)."""
    done = subprocess.run(["git", "rev-parse", "--short", ref], capture_output=True, text=True, cwd=ROOT, check=False)
    return done.stdout.strip() or ref


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
