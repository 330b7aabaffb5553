"""Attention's cost made visible (issue #17, study 5): one layer's time and memory against the
sequence length T, measured, beside what `attnlab inspect cost` predicts.

One layer of width D = 256 (4 heads of 64, feed-forward 1,024), batch 1, float32, one thread:

    attention, each kernel     attnlab.nn.attention.MultiHeadAttention (q/k/v and output
                               projections + the kernel): `sdpa` (PyTorch's fused kernel, what
                               `auto` picks), `eager` (the reference: softmax(q k^T) v, the T x T
                               weights in memory), and the long-input kernels of the registry:
                               sliding_window, longformer, bigbird, local_block, linformer,
                               memory_compressed (options in KERNEL_OPTIONS)
    feed-forward               attnlab.nn.layers.FeedForward(D, 4 D, gelu)
    LSTM                       attnlab.nn.rnn.RecurrentLayer("lstm", D, D) (torch.nn.LSTM)

    OMP_NUM_THREADS=1 python examples/studies/attention_cost/run.py            # about 6-10 minutes
    OMP_NUM_THREADS=1 python examples/studies/attention_cost/run.py --quick    # a reduced sweep, 1-2 minutes

Each point: one forward + backward (sum of the output) on a (1, T, D) input, once to warm up,
then `--repeats` times: the median wall-clock. A curve stops at the first length whose time
passes `--time-cap` seconds or whose peak memory passes `--mem-cap` MiB (and before a length
whose memory, extrapolated as T^2 from the last one, would pass it).

Peak memory, measured in a child process per curve (this script with --memory-worker): the
step's high-water mark of the process's resident memory (VmHWM), reset just before it
(`/proc/self/clear_refs` <- 5), minus the resident memory at that moment, after a warm-up step.
Not tracemalloc: it sees Python's allocator only, never the tensors' buffers, which torch takes
from malloc directly. Not ru_maxrss: it never goes down, so every point after the largest would
read the same. Not the torch profiler's memory events: on the CPU they come as per-operator
totals, not as the allocations in order, so they give no peak. For a freed tensor to leave the
resident set at once, the child tells glibc (mallopt) to serve every allocation above 64 KiB
with its own mmap and to trim its heap: what is read is then what the step holds at its worst
moment (activations saved for backward, gradients, a kernel's scratch buffers), to within a few
pages (`memory_check` in the JSON: a known 64 MiB tensor, as read). That set-up slows some
steps (fresh pages fault in), which is why the timings come from the parent, under glibc's
default allocator.

Predictions: `attnlab.inspect.cost.cost_table` (what `attnlab inspect cost` prints) gives the
forward FLOPs of the attention (projections + scores) and feed-forward rows and their
activation memory; forward + backward is taken as 3 x forward (backward multiplies twice per
forward product), and FLOPs become seconds at the dense FLOP rate measured here (sdpa's at its
longest length). cost_table counts every query against every key whatever the kernel, so for
the long-input kernels the study counts the pairs each kernel's pattern allows (`pattern_flops`:
its dense_mask, or the projected / compressed length) and scales those the same way. The LSTM
has no row in cost_table: its count is 2 x 4D x 2D per token (four gates over [x, h]).

Outputs in --out (default: this folder): results.json (or results_quick.json) with every point,
the predictions, the crossovers, the machine, the thread count and /proc/loadavg before and
after; attention_cost.png (or attention_cost_quick.png); and the table, printed. Files are
written atomically.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.inspect.cost import cost_table, crossover_seq_len
from attnlab.io.files import atomic_write_json, atomic_write_text
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kernels import KernelSetup, build_kernel
from attnlab.nn.layers import FeedForward
from attnlab.nn.rnn import RecurrentLayer

HERE = Path(__file__).resolve().parent
KERNEL_OPTIONS: dict[str, dict[str, Any]] = {  # the registry's defaults, but where noted
    "sdpa": {},
    "eager": {},
    "sliding_window": {"window": 256},
    "longformer": {"window": 256, "global_positions": [0]},  # one global token, as BERT's [CLS]
    "bigbird": {"block_size": 64, "window_blocks": 1, "global_blocks": 1, "random_blocks": 3},
    "local_block": {"block_size": 256},
    "linformer": {"k": 256},  # max_len: the longest T of the sweep
    "memory_compressed": {"compression": 3, "alternate": False},  # every layer compressed (no DMCA local layers)
}
CURVES = (*KERNEL_OPTIONS, "ffn", "lstm")
FULL = dict(lengths=[2 ** i for i in range(6, 14)], repeats=5, time_cap=1.5, mem_cap=2048)  # T = 64 .. 8192
QUICK = dict(lengths=[2 ** i for i in range(6, 12)], repeats=3, time_cap=0.4, mem_cap=512)  # T = 64 .. 2048
FWD_BWD = 3  # forward + backward FLOPs per forward FLOP (backward: two products per forward product)


# ---------------------------------------------------------------- measuring

def configure_malloc() -> bool:
    """glibc: every allocation above 64 KiB is its own mmap, and the heap is trimmed, so that a
    freed tensor leaves the resident set at once (see the module docstring). False elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024))
    except (OSError, AttributeError):
        return False


def _status_bytes(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {key}")


def peak_bytes(fn: Callable[[], Any]) -> int | None:
    """Bytes of resident memory `fn()` adds at its worst moment (Linux: VmHWM after a reset,
    minus VmRSS before); None where /proc cannot say."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current resident set
        before = _status_bytes("VmRSS")
    except OSError:
        return None
    fn()
    return max(0, _status_bytes("VmHWM") - before)


def build_curve(name: str, d_model: int, num_heads: int, d_ff: int, max_len: int) -> nn.Module:
    """The one layer of curve `name`: an attention kernel's MultiHeadAttention, `ffn` or `lstm`."""
    torch.manual_seed(0)
    if name == "ffn":
        return FeedForward(d_model, d_ff, "gelu")
    if name == "lstm":
        return RecurrentLayer("lstm", d_model, d_model)
    options = dict(KERNEL_OPTIONS[name])
    if name == "linformer":
        options["max_len"] = max_len
    kernel = build_kernel(name, options or None, KernelSetup(num_heads, d_model // num_heads))
    return MultiHeadAttention(d_model, num_heads, kernel=kernel)


def train_step(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """forward + backward of `module` on x (its output's sum as the loss), gradients cleared first."""

    def step() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = module(x)
        out = out[0] if isinstance(out, tuple) else out  # attention and LSTM return (output, extra)
        out.sum().backward()

    return step


def step_on(module: nn.Module, T: int, d_model: int) -> Callable[[], None]:
    """The forward + backward step of `module` on a fixed random (1, T, d_model) input."""
    x = torch.randn(1, T, d_model, generator=torch.Generator().manual_seed(T), requires_grad=True)
    return train_step(module, x)


def measure(module: nn.Module, T: int, d_model: int, repeats: int) -> dict[str, Any]:
    """One point's time: the median seconds of `repeats` forward + backward passes after a
    warm-up one (first-call allocations, kernel choices), and every time."""
    step = step_on(module, T, d_model)
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"T": T, "seconds": statistics.median(times), "times": [round(t, 6) for t in times]}


def memory_sweep(name: str, lengths: list[int], *, d_model: int, num_heads: int, d_ff: int, time_cap: float,
                 mem_cap_mib: float) -> dict[str, Any]:
    """The peak bytes of a curve's step at each length, after a warm-up step, in a process whose
    malloc was set up by `configure_malloc` (call it first). Stops after the length whose warm-up
    passes the time cap or whose peak passes the memory cap, and before a length whose peak,
    extrapolated as T^2 from the last one, would pass it. {"peaks": {T: bytes}, "stopped": why or None}."""
    module = build_curve(name, d_model, num_heads, d_ff, max(lengths))
    peaks: dict[int, int | None] = {}
    for T in lengths:
        if peaks and peaks[max(peaks)]:
            last = max(peaks)
            guess = peaks[last] * (T / last) ** 2 / 2 ** 20
            if guess > mem_cap_mib:
                return {"peaks": peaks, "stopped": f"T={T} not run: its memory, extrapolated as T^2 from T={last}, "
                                                   f"would be {guess:,.0f} MiB > the {mem_cap_mib:,.0f} MiB cap"}
        step = step_on(module, T, d_model)
        start = time.perf_counter()
        step()
        warm = time.perf_counter() - start
        peaks[T] = peak_bytes(step)
        if (peaks[T] or 0) / 2 ** 20 > mem_cap_mib:
            return {"peaks": peaks, "stopped": f"passed the memory cap at T={T} "
                                               f"({peaks[T] / 2 ** 20:,.0f} MiB > {mem_cap_mib:,.0f} MiB)"}
        if warm > time_cap:
            break
    return {"peaks": peaks, "stopped": None}


def memory_of(name: str, lengths: list[int], *, d_model: int, num_heads: int, d_ff: int, time_cap: float,
              mem_cap_mib: float) -> dict[str, Any]:
    """`memory_sweep` in a child process (this script with --memory-worker): its malloc set-up
    changes how the whole process allocates, and the timings are taken under the default one."""
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-worker", name, "--max-len", str(max(lengths)),
               "--d-model", str(d_model), "--heads", str(num_heads), "--d-ff", str(d_ff), "--time-cap", str(time_cap),
               "--mem-cap", str(mem_cap_mib)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"the memory worker of {name} failed: {out.stderr.strip()[-2000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["peaks"] = {int(T): v for T, v in data["peaks"].items() if int(T) in lengths}
    return data


def sweep(name: str, lengths: list[int], *, d_model: int, num_heads: int, d_ff: int, repeats: int,
          time_cap: float, mem_cap_mib: float, memory: bool = True,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """A curve's points over `lengths`: the peak memory first (`memory_of`, unless `memory` is
    False), then the times of the lengths it reached, stopped at the first that passes the time
    cap. {"points": [{"T", "seconds", "times", "peak_bytes"}, ...], "stopped": why or None}."""
    mem = memory_of(name, lengths, d_model=d_model, num_heads=num_heads, d_ff=d_ff, time_cap=time_cap,
                    mem_cap_mib=mem_cap_mib) if memory else {"peaks": {T: None for T in lengths}, "stopped": None}
    module = build_curve(name, d_model, num_heads, d_ff, max(lengths))
    points: list[dict[str, Any]] = []
    stopped = mem["stopped"]
    for T in lengths:
        if T not in mem["peaks"]:
            break
        point = {**measure(module, T, d_model, repeats), "peak_bytes": mem["peaks"][T]}
        points.append(point)
        mib = f"{point['peak_bytes'] / 2 ** 20:8.1f} MiB" if point["peak_bytes"] is not None else "unknown"
        log(f"{name:<18} T={T:>5}  {point['seconds'] * 1000:9.1f} ms  peak {mib}")
        if point["seconds"] > time_cap:
            stopped = f"passed the time cap at T={T} ({point['seconds']:.2f} s > {time_cap} s)"
            break
    return {"points": points, "stopped": stopped}


# ---------------------------------------------------------------- predicting

def layer_config(d_model: int, num_heads: int, d_ff: int) -> ModelConfig:
    """A one-layer encoder of the study's shape, for cost_table."""
    return ModelConfig(arch="encoder", vocab_size=8, d_model=d_model, num_layers=1, num_heads=num_heads, d_ff=d_ff,
                       activation="gelu")


def inspect_cost(cfg: ModelConfig, T: int, kernel: str) -> dict[str, int]:
    """Forward FLOPs and activation bytes (float32) of the layer's attention and feed-forward,
    as `attnlab inspect cost CONFIG --seq-len T --kernel KERNEL` counts them."""
    rows = {r.name: r for r in cost_table(cfg, T, kernel=kernel)}
    attn = [rows["layers.0.self_attn.projections"], rows["layers.0.self_attn.scores"]]
    return {"attention_flops": sum(r.flops for r in attn), "attention_bytes": 4 * sum(r.activations for r in attn),
            "ffn_flops": rows["layers.0.ffn"].flops, "ffn_bytes": 4 * rows["layers.0.ffn"].activations}


def pattern_pairs(name: str, T: int) -> int:
    """(query, key) score pairs kernel `name` computes over T positions (encoder): T^2 for the
    dense kernels, the pattern's allowed pairs for the sparse ones, T k (linformer), T ceil(T/c)
    (memory_compressed)."""
    options = KERNEL_OPTIONS[name]
    if name in ("sdpa", "eager"):
        return T * T
    if name == "linformer":
        return T * min(options["k"], T)
    if name == "memory_compressed":
        return T * math.ceil(T / options["compression"])
    kernel = build_kernel(name, options, KernelSetup(1, 1))
    return int(kernel.dense_mask(T, False).sum())


def pattern_flops(name: str, T: int, cfg: ModelConfig) -> int:
    """Forward FLOPs of the attention with kernel `name`: the projections, 2 x 2 Dh per score
    pair and head (q k^T and the weighted sum), and the kernel's own products along the
    sequence (linformer's E K and F V; memory_compressed's strided convolutions)."""
    D, H = cfg.d_model, cfg.num_heads
    Dh = D // H
    projections = 8 * T * D * D
    extra = 0
    if name == "linformer":
        extra = 2 * 2 * min(KERNEL_OPTIONS[name]["k"], T) * T * Dh * H
    elif name == "memory_compressed":
        extra = 2 * 2 * T * Dh * Dh * H  # each of T positions, c taps folded in: (T / c) blocks x c Dh x Dh
    return projections + 4 * H * Dh * pattern_pairs(name, T) + extra


def lstm_flops(T: int, d_model: int) -> int:
    """Forward FLOPs of one LSTM layer of width D: four gates of [x_t, h_t] (2D) -> D per token."""
    return 2 * T * 4 * d_model * 2 * d_model


def crossover(lengths: list[int], a: list[float], b: list[float]) -> float | None:
    """The T from which curve a stays above curve b: its last rise above b (earlier crossings,
    timing noise at short lengths, are passed over), interpolated in log-log space between the
    two lengths around it; None when a ends below b, or is above it from the start."""
    if not lengths or a[-1] <= b[-1]:
        return None
    i = len(lengths) - 1
    while i > 0 and a[i - 1] > b[i - 1]:
        i -= 1
    if i == 0:
        return None
    d0, d1 = math.log(a[i - 1] / b[i - 1]), math.log(a[i] / b[i])
    f = d0 / (d0 - d1)
    return math.exp(math.log(lengths[i - 1]) + f * (math.log(lengths[i]) - math.log(lengths[i - 1])))


def predictions(results: dict[str, dict], cfg: ModelConfig, lengths: list[int]) -> dict[str, Any]:
    """The predicted seconds of every curve at every length (FLOPs x FWD_BWD / the measured
    dense rate), the rate, and the crossovers, predicted and measured."""
    dense = results["sdpa"]["points"]
    if not dense:
        raise ValueError("no sdpa point: the dense FLOP rate cannot be measured")
    last = dense[-1]
    rate = FWD_BWD * inspect_cost(cfg, last["T"], "sdpa")["attention_flops"] / last["seconds"]
    costs = {T: inspect_cost(cfg, T, "sdpa") for T in lengths}
    eager = {T: inspect_cost(cfg, T, "eager") for T in lengths}
    attention = [costs[T]["attention_flops"] for T in lengths]
    flops = {"inspect_cost_attention": attention,
             "inspect_cost_ffn": [costs[T]["ffn_flops"] for T in lengths],
             "lstm": [lstm_flops(T, cfg.d_model) for T in lengths]}
    for name in KERNEL_OPTIONS:
        flops[f"pattern_{name}"] = [pattern_flops(name, T, cfg) for T in lengths]
    seconds = {key: [FWD_BWD * f / rate for f in values] for key, values in flops.items()}

    def measured(name: str) -> tuple[list[int], list[float]]:
        pts = results.get(name, {"points": []})["points"]
        return [p["T"] for p in pts], [p["seconds"] for p in pts]

    def measured_crossover(a: str, b: str) -> float | None:
        (ta, sa), (tb, sb) = measured(a), measured(b)
        common = [T for T in ta if T in tb]
        return crossover(common, [sa[ta.index(T)] for T in common], [sb[tb.index(T)] for T in common])

    return {
        "dense_flop_rate": rate, "rate_from": {"kernel": "sdpa", "T": last["T"]}, "fwd_bwd_factor": FWD_BWD,
        "lengths": lengths, "flops_forward": flops, "seconds": seconds,
        "activation_bytes": {"inspect_cost_sdpa": [costs[T]["attention_bytes"] for T in lengths],
                             "inspect_cost_eager": [eager[T]["attention_bytes"] for T in lengths],
                             "inspect_cost_ffn": [costs[T]["ffn_bytes"] for T in lengths]},
        "crossovers": {
            "inspect_cost_T_star": crossover_seq_len(cfg),  # 4 T^2 D = projections + FFN per token x T
            "predicted_attention_over_ffn": crossover(lengths, attention, flops["inspect_cost_ffn"]),
            "predicted_attention_over_lstm": crossover(lengths, attention, flops["lstm"]),
            "measured_sdpa_over_ffn": measured_crossover("sdpa", "ffn"),
            "measured_sdpa_over_lstm": measured_crossover("sdpa", "lstm"),
            "measured_eager_over_ffn": measured_crossover("eager", "ffn"),
            "measured_eager_over_lstm": measured_crossover("eager", "lstm"),
        },
    }


# ---------------------------------------------------------------- reporting

LABELS = {"sdpa": "attention, sdpa (dense, fused)", "eager": "attention, eager (dense reference)",
          "ffn": "feed-forward (4D)", "lstm": "LSTM (same width)"}


def label(name: str) -> str:
    return LABELS.get(name, f"attention, {name}")


def markdown_table(results: dict[str, dict], pred: dict[str, Any]) -> str:
    """Measured ms (and peak MiB) per curve and length, then the predicted ms."""
    lengths = pred["lengths"]
    head = "| ms per forward + backward (median) / peak MiB | " + " | ".join(f"T={T}" for T in lengths) + " |"
    lines = [head, "|" + "---|" * (len(lengths) + 1)]
    for name in CURVES:
        if name not in results:
            continue
        by_T = {p["T"]: p for p in results[name]["points"]}
        cells = []
        for T in lengths:
            p = by_T.get(T)
            mib = f" / {p['peak_bytes'] / 2 ** 20:.0f}" if p and p["peak_bytes"] is not None else ""
            cells.append(f"{p['seconds'] * 1000:.1f}{mib}" if p else "-")
        lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    for key, what in (("inspect_cost_attention", "predicted: attention, inspect cost (any kernel)"),
                      ("inspect_cost_ffn", "predicted: feed-forward, inspect cost"),
                      ("pattern_sliding_window", "predicted: sliding_window, pattern count"),
                      ("lstm", "predicted: LSTM, 16 T D^2")):
        lines.append(f"| {what} | " + " | ".join(f"{s * 1000:.1f}" for s in pred["seconds"][key]) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict], pred: dict[str, Any], path: Path, title: str) -> None:
    """Time vs T (log-log; measured lines, predicted dashed) and peak memory vs T."""
    from attnlab.inspect.plots import _figure, save_figure

    fig = _figure(14, 7.5)
    ax, mem = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors = {}
    lengths = pred["lengths"]
    for name in CURVES:
        pts = results.get(name, {"points": []})["points"]
        if not pts:
            continue
        (line,) = ax.plot([p["T"] for p in pts], [p["seconds"] for p in pts], marker="o", markersize=3,
                          label=label(name))
        colors[name] = line.get_color()
        known = [p for p in pts if p["peak_bytes"]]
        if known:
            mem.plot([p["T"] for p in known], [p["peak_bytes"] / 2 ** 20 for p in known], marker="o", markersize=3,
                     color=line.get_color(), label=label(name))
    s = pred["seconds"]
    ax.plot(lengths, s["inspect_cost_attention"], "k--", linewidth=1.2,
            label="predicted: attention (inspect cost, any kernel)")
    ax.plot(lengths, s["inspect_cost_ffn"], "--", color=colors.get("ffn", "gray"), linewidth=1,
            label="predicted: feed-forward (inspect cost) = LSTM (16 T D^2)")
    for name in ("sliding_window", "linformer", "memory_compressed"):
        if name in colors:
            ax.plot(lengths, s[f"pattern_{name}"], ":", color=colors[name], linewidth=1,
                    label=f"predicted: {name} (its pattern's pairs)")
    cross = pred["crossovers"]
    marks = (("inspect_cost_T_star", "-", "inspect cost T* = 2D + F:\nT^2 scores = projections + FFN"),
             ("predicted_attention_over_ffn", "--", "predicted: attention\n> FFN = LSTM"),
             ("measured_sdpa_over_ffn", "-.", "measured: sdpa > FFN"),
             ("measured_sdpa_over_lstm", ":", "measured: sdpa > LSTM"))
    where = ax.get_xaxis_transform()  # x in data, y in axes fractions
    for n, (key, style, what) in enumerate(marks):
        T = cross[key]
        if T and lengths[0] <= T <= lengths[-1]:
            ax.axvline(T, color="black" if n == 0 else "gray", linestyle=style, linewidth=0.8)
            ax.text(T, 0.02 + 0.09 * n, f" {what}\n T={T:,.0f}", transform=where, va="bottom", fontsize=6.5,
                    color="black" if n == 0 else "dimgray")
    act = pred["activation_bytes"]
    mem.plot(lengths, [b / 2 ** 20 for b in act["inspect_cost_eager"]], "--", color=colors.get("eager", "gray"),
             linewidth=1, label="predicted: eager activations (inspect cost, forward)")
    mem.plot(lengths, [b / 2 ** 20 for b in act["inspect_cost_sdpa"]], "k--", linewidth=1,
             label="predicted: sdpa activations (inspect cost, forward)")
    for a, what in ((ax, "seconds per forward + backward (median)"), (mem, "peak memory of the step (MiB)")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("sequence length T")
        a.set_ylabel(what)
        a.grid(alpha=0.3, which="both")
    ax.set_title(title, fontsize=9)
    mem.set_title("peak memory: measured (lines) and predicted forward activations (dashed)", fontsize=9)
    for a in (ax, mem):
        a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    save_figure(fig, path)


def machine() -> dict[str, Any]:
    """What the timings ran on."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            memory = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": memory, "python": platform.python_version(),
            "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}


def read_loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="One layer's time and memory against T, measured and predicted.")
    p.add_argument("--quick", action="store_true", help="a reduced sweep (T 64..2048, 3 repeats, lower caps)")
    p.add_argument("--out", type=Path, default=HERE, help="folder of results.json and the plot (default: this one)")
    p.add_argument("--curves", nargs="+", choices=CURVES, default=list(CURVES), help="a subset (sdpa is needed)")
    p.add_argument("--max-len", type=int, help="the longest T (default 8192; 2048 with --quick)")
    p.add_argument("--repeats", type=int, help="timed passes per point (default 5; 3 with --quick)")
    p.add_argument("--time-cap", type=float, help="seconds per pass that end a curve (default 1.5; 0.4 with --quick)")
    p.add_argument("--mem-cap", type=float, help="MiB that end a curve (default 2048; 512 with --quick)")
    p.add_argument("--replot", action="store_true",
                   help="redraw the plot and table from results.json (results_quick.json with --quick) in --out")
    p.add_argument("--memory-worker", metavar="CURVE", choices=CURVES, help=argparse.SUPPRESS)  # see memory_of
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    args = p.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    if args.max_len is not None:
        if args.max_len < 64:
            p.error("--max-len must be at least 64")
        plan["lengths"] = [2 ** i for i in range(6, int(math.log2(args.max_len)) + 1)]
    for key in ("repeats", "time_cap", "mem_cap"):
        if getattr(args, key) is not None:
            if getattr(args, key) <= 0:
                p.error(f"--{key.replace('_', '-')} must be positive")
            plan[key] = getattr(args, key)
    if "sdpa" not in args.curves:
        p.error("--curves must include sdpa: its measured FLOP rate turns the predicted FLOPs into seconds")
    args.plan = plan
    return args


def memory_worker(args: argparse.Namespace) -> None:
    """--memory-worker CURVE: `memory_sweep` in this process, its result as one JSON line."""
    torch.set_num_threads(1)
    configure_malloc()
    plan = args.plan
    result = memory_sweep(args.memory_worker, plan["lengths"], d_model=args.d_model, num_heads=args.heads,
                          d_ff=args.d_ff, time_cap=plan["time_cap"], mem_cap_mib=plan["mem_cap"])
    print(json.dumps(result))


def memory_check() -> dict[str, Any]:
    """What the memory reading gives for a known 64 MiB tensor, in a fresh process set up as
    the workers are."""
    code = ("import importlib.util, json, torch\n"
            f"spec = importlib.util.spec_from_file_location('s', {str(Path(__file__).resolve())!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "ok = m.configure_malloc(); make = lambda: torch.ones(64 * 2 ** 18); make()\n"
            "print(json.dumps({'mallopt': ok, 'allocated_bytes': 64 * 2 ** 20, 'measured_bytes': m.peak_bytes(make)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-500:]}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.memory_worker:
        memory_worker(args)
        return None
    suffix = "_quick" if args.quick else ""
    if args.replot:  # draw again from the saved numbers, nothing measured
        summary = json.loads((args.out / f"results{suffix}.json").read_text(encoding="utf-8"))
        write_report(summary, args.out, suffix)
        return summary
    plan = args.plan
    torch.set_num_threads(1)
    load_before = read_loadavg()
    started = time.perf_counter()
    results = {}
    for name in args.curves:
        results[name] = sweep(name, plan["lengths"], d_model=args.d_model, num_heads=args.heads, d_ff=args.d_ff,
                              repeats=plan["repeats"], time_cap=plan["time_cap"], mem_cap_mib=plan["mem_cap"])
        if results[name]["stopped"]:
            print(f"{name}: stopped: {results[name]['stopped']}", flush=True)
    cfg = layer_config(args.d_model, args.heads, args.d_ff)
    pred = predictions(results, cfg, plan["lengths"])
    load_after = read_loadavg()
    summary = {
        "study": "attention_cost", "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None
                                                                                     else sys.argv[1:])),
        "shape": {"batch": 1, "d_model": args.d_model, "num_heads": args.heads, "d_ff": args.d_ff, "dtype": "float32"},
        "plan": plan, "kernel_options": KERNEL_OPTIONS, "machine": machine(),
        "loadavg_before": load_before, "loadavg_after": load_after,
        "seconds": round(time.perf_counter() - started, 1),
        "memory_check": memory_check(),
        "results": results, "predictions": pred,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / f"results{suffix}.json", summary)
    write_report(summary, args.out, suffix)
    return summary


def write_report(summary: dict[str, Any], out: Path, suffix: str) -> None:
    """The plot and the table (also printed) of a study's summary."""
    shape, pred = summary["shape"], summary["predictions"]
    title = (f"one layer, D={shape['d_model']}, {shape['num_heads']} heads, F={shape['d_ff']}, batch 1, fp32, "
             f"1 thread; load {summary['loadavg_before'].split()[0]} -> {summary['loadavg_after'].split()[0]}")
    plot(summary["results"], pred, out / f"attention_cost{suffix}.png", title)
    table = markdown_table(summary["results"], pred)
    atomic_write_text(out / f"results{suffix}.md", table + "\n")
    print(table)
    print(f"dense FLOP rate (sdpa at T={pred['rate_from']['T']}): {pred['dense_flop_rate'] / 1e9:.1f} GFLOP/s")
    print("crossovers: " + ", ".join(f"{k} = {v:,.0f}" if v else f"{k} = none in range"
                                     for k, v in pred["crossovers"].items()))
    print(f"loadavg before: {summary['loadavg_before']}; after: {summary['loadavg_after']}; "
          f"{summary['seconds']:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
