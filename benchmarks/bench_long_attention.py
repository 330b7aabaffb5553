"""Forward + backward of one long-input attention layer against dense peers, as JSON.

Setting (the issue's): batch 1, 6 heads, head dim 64, fp32, q/k/v given (no projections).
Peers: PyTorch's fused `scaled_dot_product_attention` (dense, causal) and naive attention
(softmax(q k^T / sqrt(d), causal) v, materialising the T x T weights). Kernels: sliding window
(w = 256, causal), Longformer (w = 256 + 2 global tokens, causal), BigBird (b = 64: 1 window
block per side, 1 global, 2 random; causal) and Linformer (k = 256; bidirectional only, so it is
timed without a causal mask). Peers are skipped above --max-sdpa / --max-naive (recorded as
"skipped" with the reason).

Method: each (kernel, T) runs in a fresh Python process. Time: wall clock of forward + backward
(`out.backward(grad)`), median of --repeat runs after one warm-up (no warm-up above 8k).
Memory: torch's CPU allocations are plain malloc/mmap, invisible to tracemalloc, so we read the
process's resident set from /proc: reset the peak with /proc/self/clear_refs ("5"), then
peak extra = VmHWM after forward + backward - VmRSS before it. q, k, v and the incoming gradient
exist before; the gradients of q, k, v (3 x T x 6 x 64 x 4 bytes) are part of the extra.

    python benchmarks/bench_long_attention.py --sizes 1024,2048,4096 --out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

KERNELS = ("sdpa", "naive", "sliding_window", "longformer", "bigbird", "linformer")
H, DH, WINDOW = 6, 64, 256


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _attention(kernel: str, T: int):
    import torch
    import torch.nn.functional as F

    from attnlab.nn.linformer import LinformerKernel
    from attnlab.nn.sparse import bigbird_attention, longformer_attention, sliding_window_attention

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
    if kernel == "longformer":
        globals_ = torch.tensor([0, T // 2])
        return lambda q, k, v: longformer_attention(q, k, v, window=WINDOW, global_tokens=globals_, causal=True)
    if kernel == "bigbird":
        return lambda q, k, v: bigbird_attention(q, k, v, block=64, window_blocks=1, global_blocks=1, random_blocks=2,
                                                 seed=0, causal=True)
    if kernel == "linformer":
        torch.manual_seed(0)
        lin = LinformerKernel(max_len=T, k=256, num_heads=H).requires_grad_(False)
        return lambda q, k, v: lin(q, k, v, scale=DH**-0.5, causal=False)[0]
    raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def measure_one(kernel: str, T: int, repeat: int, threads: int | None = None) -> dict:
    """Time and peak extra memory of forward + backward, in this process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    fn = _attention(kernel, T)
    q, k, v = (torch.randn(1, H, T, DH, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, H, T, DH)
    times, peaks = [], []
    runs = repeat + (1 if T <= 8192 else 0)
    for i in range(runs):
        q.grad = k.grad = v.grad = None
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        before = _status_bytes("VmRSS")
        start = time.perf_counter()
        fn(q, k, v).backward(grad)
        elapsed = time.perf_counter() - start
        peak = _status_bytes("VmHWM") - before
        if i or runs == repeat:
            times.append(elapsed)
            peaks.append(peak)
    return {"kernel": kernel, "T": T, "seconds": statistics.median(times), "runs": len(times),
            "peak_extra_mib": round(max(peaks) / 2**20, 1)}


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
    parser.add_argument("--out", help="also write the JSON here (atomically)")
    parser.add_argument("--one", nargs=2, metavar=("KERNEL", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.repeat, args.threads)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    kernels = args.kernels.split(",")
    for name in kernels:
        if name not in KERNELS:
            raise SystemExit(f"--kernels: unknown kernel {name!r}; choose from {', '.join(KERNELS)}")
    limits = {"sdpa": args.max_sdpa, "naive": args.max_naive, "linformer": args.max_linformer}
    results = []
    for T in sizes:
        for name in kernels:
            if T > limits.get(name, T):
                row = {"kernel": name, "T": T, "skipped": f"T > --max-{name} {limits[name]} (too slow or too much memory)"}
            else:
                row = run_isolated(name, T, args.repeat, args.timeout, args.threads)
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
    by = {(r["kernel"], r["T"]): r for r in results}
    ratios = []
    for T in sizes:
        ref = by.get(("sliding_window", T), {})
        for peer in ("sdpa", "naive", "longformer", "bigbird"):
            other = by.get((peer, T), {})
            if "seconds" in ref and "seconds" in other:
                ratios.append({"T": T, "kernel": peer, "time_vs_sliding_window": round(other["seconds"] / ref["seconds"], 2)})
    scaling = []
    for name in kernels:
        pts = [(T, by[(name, T)]["seconds"]) for T in sizes if "seconds" in by.get((name, T), {})]
        for (t1, s1), (t2, s2) in zip(pts, pts[1:]):
            scaling.append({"kernel": name, "from_T": t1, "to_T": t2, "time_ratio": round(s2 / s1, 2)})
    report = {
        "setting": {"batch": 1, "heads": H, "head_dim": DH, "dtype": "float32", "window": WINDOW, "pass": "forward+backward",
                    "threads": args.threads or _threads(), "machine": os.uname().nodename, "cpus": os.cpu_count(),
                    "memory_method": "peak RSS growth: /proc/self/clear_refs then VmHWM - VmRSS, one process per point"},
        "results": results, "ratios": ratios, "scaling": scaling,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        from attnlab.utils import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
