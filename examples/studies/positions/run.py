"""Positions beyond the trained length (issue #17, study 4), on the built-in Shakespeare corpus.

The same small character-level GPT (4 layers, d_model 128, 4 heads, as
examples/shakespeare_char.json) is trained six times, once per `position.scheme` (`sinusoidal`,
`learned`, `rotary`, `alibi`, `t5_bias`, `none`), at context 128 (`data.seq_len` 128), with
the same recipe and an equal budget per model: `--steps N` optimisation steps, or `--minutes M`
of training wall-clock. Each run is evaluated on the validation text at every length of
`--lengths` (128, 256, 512, 1024): the mean loss per length, and the per-position loss (loss at
position t averaged over `--eval-windows` windows, t = 0 .. the longest length - 1).

    OMP_NUM_THREADS=1 python examples/studies/positions/run.py --out runs/positions
    ... --minutes 2 --jobs 1                   # a quick look (about 15 minutes)
    ... --resume                               # go on with an interrupted study

Outputs in --out: results.json (per scheme: steps, seconds, load averages, loss per length, the
per-position curve and its summary by position bins), per_position_loss.png (one line per
scheme, a vertical line at the trained length 128), results.md (the table, also printed), and
one run folder per scheme (an `attnlab train` run: config, metrics, checkpoints). Every file is
written atomically.

Positions past the table. `learned` has one trained row per position: its table is sized to
the training context (position.max_len 128), and attnlab refuses a longer input with a
ValueError naming position.max_len; the study records that error for the lengths past 128 and
the table says "not evaluable" there (nothing is clipped or wrapped). The other schemes compute
their positions from the ids and never read position.max_len (checked: they run at 1024 with
max_len 128); it is set to the longest evaluation length anyway so that the config does not
appear to forbid what is measured. They are all trained at context 128.

Parallel runs. `--jobs J` trains J models at once, each in its own process with one torch
thread and OMP_NUM_THREADS=1 (the default, 2, fills a 2-core machine; --minutes 12 then fits
the six in about 40 minutes). A model whose run folder holds a finished run of the same budget
is not trained again; one whose run was interrupted is continued with --resume (in --minutes
mode, with the wall-clock it had left at its last checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.io.files import atomic_write_json, atomic_write_text

SCHEMES = ("sinusoidal", "learned", "rotary", "alibi", "t5_bias", "none")
TRAIN_LEN = 128  # data.seq_len of every run: the context the models are trained at
WARMUP = 100  # warmup steps of the learning rate
CHECKPOINT_EVERY = 250  # steps between checkpoints (what an interrupted run loses at most)
CURVE_BIN = 32  # positions per point of the plotted curve (the raw curve is in results.json)


# ---------------------------------------------------------------- the runs


def model_section(scheme: str, max_eval_len: int) -> dict[str, Any]:
    """The model: examples/shakespeare_char.json's GPT with `scheme` positions. A learned table
    has TRAIN_LEN rows (the positions it is trained on); the other schemes ignore max_len."""
    max_len = TRAIN_LEN if scheme == "learned" else max(max_eval_len, TRAIN_LEN)
    return {"preset": "tiny-decoder", "d_model": 128, "num_layers": 4, "num_heads": 4, "d_ff": 512,
            "activation": "gelu", "dropout": 0.0, "norm_placement": "pre",
            "position": {"scheme": scheme, "max_len": max_len}}


def budget_of(args: argparse.Namespace) -> dict[str, float]:
    """The equal budget of every model: {"steps": N} or {"minutes": M}."""
    return {"minutes": args.minutes} if args.minutes is not None else {"steps": args.steps}


def run_config(scheme: str, run_dir: Path, tokenizer: Path, budget: dict, max_eval_len: int,
               minutes_left: float | None = None) -> dict[str, Any]:
    """One run: the same data, optimiser and schedule for every scheme. The schedule is constant
    after a warmup, so a --minutes run (whose step count is not known in advance) and a --steps
    run train alike."""
    if "steps" in budget:  # a short trial keeps a tenth of its steps for the warmup
        limits, warmup = {"max_steps": int(budget["steps"])}, min(WARMUP, max(1, int(budget["steps"]) // 10))
    else:
        limits, warmup = {"max_steps": 10 ** 7, "max_minutes": minutes_left or budget["minutes"]}, WARMUP
    return {
        "model": model_section(scheme, max_eval_len),
        "data": {"source": "shakespeare", "objective": "causal_lm", "seq_len": TRAIN_LEN, "batch_size": 16,
                 "tokenizer": {"kind": "char", "path": str(tokenizer)}},
        "optim": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1, "grad_clip": 1.0},
        "schedule": {"name": "constant", "warmup_steps": warmup},
        "train": {"out_dir": str(run_dir), **limits, "eval_every": CHECKPOINT_EVERY, "eval_batches": 10,
                  "log_every": 50, "checkpoint_every": CHECKPOINT_EVERY, "keep_last": 1, "seed": 0, "threads": 1},
    }


def shared_tokenizer(out: Path) -> Path:
    """The char tokenizer of the training text, trained once; every run loads it, so every
    model and the evaluation read the same ids."""
    from attnlab.data.sources import resolve_source
    from attnlab.training import TrainConfig
    from attnlab.training.data.batches import build_tokenizer

    path = out / "tokenizer.json"
    if not path.exists():
        data = TrainConfig.from_dict({"data": {"source": "shakespeare", "objective": "causal_lm"}}).data
        build_tokenizer(data, resolve_source("shakespeare", "train"), out)  # writes out/tokenizer.json atomically
    return path


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine's business beside the timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def read_json_or_none(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def seconds_at(clock: dict[str, float], step: int) -> float:
    """Training seconds spent up to `step` (the clock is kept at every checkpoint step; a
    checkpoint written between two, at a time limit, takes the one before it)."""
    known = [int(s) for s in clock if int(s) <= step]
    return clock[str(max(known))] if known else 0.0


def train_scheme(scheme: str, run_dir: Path, tokenizer: Path, budget: dict, max_eval_len: int,
                 resume: bool) -> dict[str, Any]:
    """Train one model (or go on with it, or reuse it when finished); returns its summary.

    Raises:
        SystemExit: a finished run of another budget, or an unfinished run without --resume.
    """
    from attnlab.io.checkpoints import list_checkpoints, read_index
    from attnlab.training import TrainConfig, Trainer

    done = read_json_or_none(run_dir / "summary.json")
    if done is not None:
        if done["budget"] != budget:
            raise SystemExit(f"{run_dir} holds a finished run of budget {done['budget']}, not {budget}: delete it, "
                             "or give another --out")
        return done
    started = bool(list_checkpoints(run_dir / "checkpoints"))
    if started and not resume:
        raise SystemExit(f"{run_dir} holds an unfinished run: continue it with --resume, or delete it")
    clock = (read_json_or_none(run_dir / "clock.json") or {}) if started else {}
    step0 = int(read_index(run_dir / "checkpoints")["latest"].split("-")[1]) if started else 0
    prior = seconds_at(clock, step0)
    minutes_left = max(budget["minutes"] - prior / 60, 1e-3) if "minutes" in budget else None
    cfg = TrainConfig.from_dict(run_config(scheme, run_dir, tokenizer, budget, max_eval_len, minutes_left))
    trainer = Trainer(cfg, show_progress=False, log=lambda line: print(f"[{scheme}] {line}", flush=True))
    load_before = loadavg()
    start = time.perf_counter()

    def on_step(info: dict[str, Any]) -> None:  # before the checkpoint of that step is written
        if info["step"] % CHECKPOINT_EVERY == 0:
            clock[str(info["step"])] = prior + time.perf_counter() - start
            atomic_write_json(run_dir / "clock.json", clock)

    summary = trainer.fit(resume=started, on_step=on_step)
    result = {"scheme": scheme, "budget": budget, "steps": summary["steps"],
              "seconds": round(prior + time.perf_counter() - start, 1), "resumed_from_step": step0 or None,
              "train_loss": summary["train_loss"], "val_loss_128": summary.get("val_loss"),
              "params": sum(p.numel() for p in trainer.model.parameters()),
              "precision": trainer.precision, "loadavg_before": load_before, "loadavg_after": loadavg()}
    atomic_write_json(run_dir / "summary.json", result)
    return result


# ---------------------------------------------------------------- evaluation


def eval_windows(tokens: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """`count` windows of length + 1 tokens (inputs and their next tokens) at evenly spaced
    starts from the first token to the last window that fits -> (count, length + 1): every
    length samples the whole validation text (96,617 characters: 90 windows of 1,025 do not
    overlap).

    Raises:
        ValueError: the text is shorter than one window.
    """
    n = tokens.numel()
    if n < length + 1:
        raise ValueError(f"the validation text has {n} tokens, fewer than one window of {length + 1}")
    starts = torch.linspace(0, n - length - 1, count).round().long()
    return torch.stack([tokens[s: s + length + 1] for s in starts.tolist()])


@torch.no_grad()
def per_position_loss(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Next-token cross-entropy (nats) at each position, averaged over the windows.

    Args:
        model: a causal LM returning logits (B, T, V).
        windows: (N, T + 1) token ids; position t predicts windows[:, t + 1] from windows[:, :t + 1].

    Returns:
        (T,) float64: the mean loss at position t = 0 .. T - 1.
    """
    total = torch.zeros(windows.shape[1] - 1, dtype=torch.float64)
    for i in range(0, windows.shape[0], batch_size):
        batch = windows[i: i + batch_size]
        logits = model(batch[:, :-1]).float()  # (B, T, V)
        loss = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")  # (B, T)
        total += loss.double().sum(0)
    return total / windows.shape[0]


def curve_bins(curve: list[float], edges: tuple[int, ...]) -> dict[str, float]:
    """Mean loss over the position ranges [edges[i], edges[i + 1]) the curve reaches."""
    bins = {}
    for lo, hi in zip(edges, edges[1:]):
        if lo < len(curve):
            part = curve[lo: min(hi, len(curve))]
            bins[f"{lo}-{min(hi, len(curve)) - 1}"] = sum(part) / len(part)
    return bins


def bin_edges(lengths: list[int]) -> tuple[int, ...]:
    """0, 16 (the first positions have little context), the trained length, then the lengths."""
    return tuple(sorted({0, 16, TRAIN_LEN, *lengths}))


def evaluate_model(model: torch.nn.Module, tokens: torch.Tensor, lengths: list[int], count: int) -> dict[str, Any]:
    """Loss per length, and the per-position curve of the longest length the model takes.

    A length the model refuses (a learned table shorter than it) is recorded with the
    library's error message as not evaluable; nothing is clipped.
    """
    model.eval()
    per_length, curve = {}, None
    for length in sorted(lengths):
        windows = eval_windows(tokens, length, count)
        try:
            losses = per_position_loss(model, windows, batch_size=max(1, 4096 // length))
        except ValueError as err:
            per_length[str(length)] = {"evaluable": False, "error": str(err)}
            print(f"warning: length {length} not evaluable: {err}", flush=True)
            continue
        per_length[str(length)] = {"evaluable": True, "loss": float(losses.mean())}
        curve = losses
    values = [round(float(v), 5) for v in curve] if curve is not None else []
    return {"lengths": per_length, "windows": count, "curve": values,
            "curve_bins": curve_bins(values, bin_edges(lengths))}


def validation_tokens(tokenizer: Path) -> torch.Tensor:
    """The validation text as ids (the toolkit's own token file of the split)."""
    from attnlab.training import TrainConfig
    from attnlab.training.data.batches import DataPipeline

    data = TrainConfig.from_dict({"data": {"source": "shakespeare", "objective": "causal_lm", "seq_len": TRAIN_LEN,
                                           "tokenizer": {"kind": "char", "path": str(tokenizer)}}}).data
    valid = DataPipeline.build(data, None, show_progress=False).valid
    return torch.from_numpy(valid.tokens[:].astype("int64"))


def evaluate_scheme(run_dir: Path, tokenizer: Path, lengths: list[int], count: int) -> dict[str, Any]:
    """Evaluate the run's last checkpoint (the model the budget bought), or reuse an evaluation
    of the same settings."""
    import attnlab
    from attnlab.io.checkpoints import resolve_checkpoint

    settings = {"lengths": sorted(lengths), "windows": count}
    done = read_json_or_none(run_dir / "eval.json")
    if done is not None and done["settings"] == settings:
        return done
    checkpoint = resolve_checkpoint(run_dir / "checkpoints", "latest")
    model = attnlab.load(checkpoint).float()
    start, load_before = time.perf_counter(), loadavg()
    result = {"settings": settings, "checkpoint": checkpoint.name,
              **evaluate_model(model, validation_tokens(tokenizer), lengths, count),
              "eval_seconds": round(time.perf_counter() - start, 1), "eval_loadavg_before": load_before,
              "eval_loadavg_after": loadavg()}
    atomic_write_json(run_dir / "eval.json", result)
    return result


# ---------------------------------------------------------------- the report


def fmt_loss(entry: dict | None) -> str:
    if entry is None:
        return "-"
    return f"{entry['loss']:.3f}" if entry["evaluable"] else "not evaluable"


def markdown_table(schemes: dict[str, dict], lengths: list[int]) -> str:
    """One row per scheme: budget spent, loss per length, and the long curve's bins past 128."""
    lengths = sorted(lengths)
    edges = bin_edges(lengths)
    far = [f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:]) if lo >= 16]
    head = ["scheme", "steps", "train s", "load avg (1 min)"] + [f"loss @ {n}" for n in lengths] + \
        [f"@ {lengths[-1]} - @ {lengths[0]}"] + [f"pos {b}" for b in far]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for name, r in schemes.items():
        load = r.get("loadavg_after") or ["?"]
        row = [name, str(r["steps"]), f"{r['seconds']:.0f}", str(load[0])]
        row += [fmt_loss(r["lengths"].get(str(n))) for n in lengths]
        first, last = (r["lengths"].get(str(n)) for n in (lengths[0], lengths[-1]))
        row.append(f"{last['loss'] - first['loss']:+.3f}" if first and last and last["evaluable"] else "-")
        row += [f"{r['curve_bins'][b]:.3f}" if b in r["curve_bins"] else "-" for b in far]
        lines.append("| " + " | ".join(row) + " |")
        refused = [e["error"] for e in r["lengths"].values() if not e["evaluable"]]
        if refused:
            notes.append(f"{name}: not evaluable past its table: {refused[0]}")
    lines.append("")
    lines.append(f"loss: mean next-character cross-entropy (nats) on the validation text; every model trained at "
                 f"context {TRAIN_LEN}; `@ {lengths[-1]} - @ {lengths[0]}`: what the longest length adds (negative: "
                 "the longer context helps); `pos a-b`: mean loss at positions a..b of the longest window the model "
                 "takes")
    lines += notes
    return "\n".join(lines) + "\n"


def plot_per_position(schemes: dict[str, dict], path: Path) -> None:
    """The per-position loss, one line per scheme (means over bins of CURVE_BIN positions),
    and a vertical line at the trained length."""
    from attnlab.inspect.plots import _figure, save_figure

    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    top = 0.0
    for name, r in schemes.items():
        curve = r["curve"]
        xs, ys = [], []
        for lo in range(0, len(curve), CURVE_BIN):
            part = curve[lo: lo + CURVE_BIN]
            xs.append(lo + (len(part) - 1) / 2)
            ys.append(sum(part) / len(part))
        ax.plot(xs, ys, label=name + ("" if len(curve) >= max(len(s["curve"]) for s in schemes.values())
                                      else f" (table ends at {len(curve)})"))
        top = max(top, max(ys[1:] or ys))
    ax.axvline(TRAIN_LEN, color="black", linestyle="--", linewidth=1)
    ax.text(TRAIN_LEN, ax.get_ylim()[1], f" trained length {TRAIN_LEN}", va="top", fontsize=8)
    ax.set_xlabel("position in the window")
    ax.set_ylabel(f"loss (nats), mean over {CURVE_BIN}-position bins")
    ax.set_title("next-character loss by position, Shakespeare validation text")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def write_report(out: Path, schemes: dict[str, dict], args: dict[str, Any], seconds: float) -> str:
    """results.json, results.md and per_position_loss.png (all atomic); returns the table."""
    lengths = args["lengths"]
    table = markdown_table(schemes, lengths)
    report = {"study": "positions beyond the trained length", "train_len": TRAIN_LEN, "args": args,
              "schemes": schemes, "seconds": round(seconds, 1), "loadavg_end": loadavg(), "torch": torch.__version__,
              "cpu_count": os.cpu_count()}
    atomic_write_json(out / "results.json", report)
    atomic_write_text(out / "results.md", table)
    plot_per_position(schemes, out / "per_position_loss.png")
    return table


# ---------------------------------------------------------------- driving


def worker_command(args: argparse.Namespace, scheme: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", scheme, "--out", str(args.out),
           "--eval-windows", str(args.eval_windows), "--lengths", *map(str, args.lengths)]
    cmd += ["--minutes", str(args.minutes)] if args.minutes is not None else ["--steps", str(args.steps)]
    return cmd + (["--resume"] if args.resume else [])


def run_workers(args: argparse.Namespace, schemes: list[str]) -> dict[str, int]:
    """Train and evaluate each scheme in its own one-thread process, `args.jobs` at a time;
    returns their exit codes. Ctrl-C reaches the workers too: each saves a checkpoint."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    pending, running, codes = list(schemes), {}, {}
    try:
        while pending or running:
            while pending and len(running) < args.jobs:
                name = pending.pop(0)
                running[name] = subprocess.Popen(worker_command(args, name), env=env)
            for name, proc in list(running.items()):
                if proc.poll() is not None:
                    codes[name] = proc.returncode
                    del running[name]
            time.sleep(0.2)
    except KeyboardInterrupt:
        for proc in running.values():
            proc.wait()
        again = sys.argv + ([] if "--resume" in sys.argv else ["--resume"])
        raise SystemExit(f"interrupted; go on with: {' '.join(again)}")
    return codes


def worker(args: argparse.Namespace) -> None:
    """One scheme: train (or go on, or reuse), then evaluate (or reuse)."""
    from attnlab.training.run.signals import TrainingInterrupted

    torch.set_num_threads(1)
    out, name = Path(args.out), args.worker
    tokenizer = out / "tokenizer.json"
    try:
        train_scheme(name, out / name, tokenizer, budget_of(args), max(args.lengths), args.resume)
    except TrainingInterrupted as err:
        print(f"[{name}] {err}", flush=True)
        raise SystemExit(130)
    evaluate_scheme(out / name, tokenizer, args.lengths, args.eval_windows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/positions"), help="output folder")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, default=None,
                        help="training wall-clock per model (default 12: six models, --jobs 2, about 40 minutes)")
    budget.add_argument("--steps", type=int, default=None, help="optimisation steps per model instead")
    p.add_argument("--jobs", type=int, default=2, help="models trained at once, one thread each")
    p.add_argument("--resume", action="store_true", help="go on with runs an interruption left unfinished")
    p.add_argument("--eval-windows", type=int, default=90, help="validation windows per length")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024], help="evaluation lengths")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES, help="a subset of the schemes")
    p.add_argument("--worker", choices=SCHEMES, help=argparse.SUPPRESS)  # one scheme, in a child process
    args = p.parse_args(argv)
    if args.minutes is None and args.steps is None:
        args.minutes = 12.0
    for name, value, ok in (("--minutes", args.minutes, args.minutes is None or args.minutes > 0),
                            ("--steps", args.steps, args.steps is None or args.steps > 0),
                            ("--jobs", args.jobs, args.jobs > 0), ("--eval-windows", args.eval_windows,
                                                                   args.eval_windows > 0)):
        if not ok:
            p.error(f"{name}: expected a positive number, got {value}")
    if min(args.lengths) < 1:
        p.error(f"--lengths: expected positive lengths, got {args.lengths}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    torch.set_num_threads(1)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    shared_tokenizer(out)
    validation_tokens(out / "tokenizer.json")  # tokenise both splits into the cache once, before the workers
    codes = run_workers(args, args.schemes)
    failed = {name: code for name, code in codes.items() if code != 0}
    if failed:
        raise SystemExit(f"failed: {failed} (exit codes; see their lines above); finished runs are kept, run again "
                         "with --resume")
    schemes = {}
    for name in args.schemes:
        run = out / name
        schemes[name] = {**read_json_or_none(run / "summary.json"), **read_json_or_none(run / "eval.json")}
    shown = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "worker"}
    table = write_report(out, schemes, shown, time.perf_counter() - start)
    print(table)


if __name__ == "__main__":
    main()
