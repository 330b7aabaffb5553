"""What the benchmarks record about the machine beside their timings: the load, memory
readings, and the matmul peak that model-FLOPs utilisation is measured against."""

import time


def loadavg() -> str:
    """The 1-, 5- and 15-minute load averages ("0.52 0.61 0.70"), or "n/a" where /proc is
    missing: a busy shared machine explains a slow run."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def status_bytes(field: str) -> int:
    """A field of /proc/self/status (VmRSS: resident now, VmHWM: its peak) in bytes.

    Raises:
        RuntimeError: no such field (not Linux): the memory figures need /proc.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (this benchmark needs Linux)")


def peak_rss_mib() -> float:
    """This process's peak resident set so far (VmHWM), in MiB."""
    return status_bytes("VmHWM") / 2**20


def reset_peak_rss() -> None:
    """Set VmHWM to the current resident set, so that the next reading is the peak from now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def matmul_peak(n: int = 2048, reps: int = 5, dtype=None) -> float:
    """FLOP/s of the fastest of `reps` (n, n) x (n, n) products in `dtype` (default float32)."""
    import torch

    dtype = dtype or torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / min(times)


PEAKS = {"fp32": 0.0, "bf16": 0.0}


def sample_peaks(n: int = 1024, precisions: tuple[str, ...] = ("fp32", "bf16")) -> None:
    """Matmul peaks of `precisions` sampled between steps and kept as the maximum in PEAKS (a
    shared machine's load varies). Ask only for the precision a run uses: on a CPU without bf16
    instructions (AVX2 only) one bf16 product of 2048 takes tens of seconds."""
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for precision in precisions:
        PEAKS[precision] = max(PEAKS[precision], matmul_peak(n, 3, dtypes[precision]))


def write_result(result: dict, out: str | None) -> None:
    """Print a benchmark's JSON and, with `out`, write it there too (whole or not at all)."""
    import json

    from attnlab.io.files import atomic_write_text

    text = json.dumps(result, indent=2)
    if out:
        atomic_write_text(out, text + "\n")
    print(text)
