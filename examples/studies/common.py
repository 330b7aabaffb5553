"""What the studies share: training on a CPU-time clock with marks, one process per model, and
the small file helpers. A study's run.py imports it with its own folder's parent on sys.path:

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from common import cpu_clock_training, cpu_time, loadavg, read_json, run_workers, shared_tokenizer, write_json

The clock is the training process's CPU time (evaluations excluded), one torch thread per
process: on an idle core it equals wall-clock, and on a machine shared with other work it still
gives every model the same computation. Wall-clock and the load average are recorded beside it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

CHUNK = 25  # training steps between looks at the clock


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def cpu_time() -> float:
    """CPU seconds of this process plus its finished children (an evaluation that runs `attnlab
    translate` in a child process counts the child's time too)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def cpu_minutes(text: str) -> int | float:
    """argparse type of a mark: positive CPU minutes, an int when whole (so `5` names `marks/5min`)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPU minutes, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be positive CPU minutes, got {text}")
    return int(value) if value.is_integer() else value


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def write_json(path: Path, data: Any) -> None:
    from attnlab.io.files import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def shared_tokenizer(out: Path, corpus: str, objective: str) -> Path:
    """`out/tokenizer.json`: one byte-level BPE of 8,000 trained on both sides of `corpus`'s training
    pairs, with `objective`'s special tokens, shared by every model of a study (trained once)."""
    from attnlab.data.sources import resolve_source
    from attnlab.training import TrainConfig
    from attnlab.training.data.batches import build_tokenizer

    path = out / "tokenizer.json"
    if not path.exists():
        cfg = TrainConfig.from_dict({"data": {"source": corpus, "objective": objective,
                                              "tokenizer": {"kind": "bpe", "vocab_size": 8000}}}).data
        build_tokenizer(cfg, resolve_source(corpus, "train"), out)
    return path


def clock_config(model: dict[str, Any], data: dict[str, Any], lr: float, schedule: dict[str, Any],
                 run_dir: Path) -> dict[str, Any]:
    """The `attnlab train` config of one model of a study that compares models on
    `cpu_clock_training`: Adam (0.9, 0.98) at `lr`, label smoothing 0.1, clipping at 1, fp32, one
    thread, seed 0; no step limit, in-training evaluation or periodic checkpoint (the clock stops
    the run and saves it)."""
    return {
        "model": model,
        "data": data,
        "optim": {"name": "adam", "lr": lr, "betas": [0.9, 0.98], "eps": 1e-9, "weight_decay": 0.0,
                  "grad_clip": 1.0, "label_smoothing": 0.1},
        "schedule": schedule,
        "train": {"out_dir": str(run_dir), "max_steps": 10 ** 7, "eval_every": 10 ** 7, "eval_batches": 1,
                  "bleu_samples": 0, "log_every": 100, "checkpoint_every": 10 ** 7, "keep_last": 1,
                  "seed": 0, "threads": 1, "precision": "fp32"},
    }


def cpu_clock_training(config: dict[str, Any], run_dir: Path, marks: list[float], name: str) -> dict[str, Any]:
    """Train `config` (an `attnlab train` config dict whose train.out_dir is `run_dir`) in this
    process until its CPU time passes the last of `marks` (minutes), saving the model with its
    tokenizer (`attnlab.save`) to `run_dir/marks/<m>min/` as each mark passes. The clock lives in
    `run_dir/clock.json`; an interrupted run continues from its last checkpoint and clock (steps
    done after the last clock entry are counted at the mean rate). Returns the clock."""
    import torch

    import attnlab
    from attnlab.training import TrainConfig, Trainer

    torch.set_num_threads(1)
    clock = read_json(run_dir / "clock.json") or {"cpu_seconds": 0.0, "wall_seconds": 0.0, "step": 0,
                                                   "marks": {}, "loadavg": []}
    done = lambda: all(str(m) in clock["marks"] for m in marks)
    if done():
        return clock
    with open(run_dir.parent / f"{run_dir.name}.log", "a", encoding="utf-8") as log:
        trainer = Trainer(TrainConfig.from_dict(config), show_progress=False,
                          log=lambda line: print(f"[{name}] {line}", file=log, flush=True))
        tokenizer = trainer.task.pipeline.tokenizer
        resume = (run_dir / "checkpoints").exists()
        if resume:
            trainer.resume()
            resume = False
            if trainer.step > clock["step"] > 0:
                clock["cpu_seconds"] += (trainer.step - clock["step"]) * clock["cpu_seconds"] / clock["step"]
                clock["step"] = trainer.step
        while not done():
            cpu0, wall0 = time.process_time(), time.perf_counter()
            trainer.fit(resume=resume, stop_at=trainer.step + CHUNK)
            resume = False
            clock["cpu_seconds"] += time.process_time() - cpu0
            clock["wall_seconds"] += time.perf_counter() - wall0
            clock["step"] = trainer.step
            clock["loadavg"].append(loadavg()[:1] + [round(clock["cpu_seconds"])])
            for m in marks:
                if str(m) not in clock["marks"] and clock["cpu_seconds"] >= 60 * m:
                    attnlab.save(trainer.model, run_dir / "marks" / f"{m}min", tokenizer=tokenizer)
                    clock["marks"][str(m)] = {"step": trainer.step, "cpu_seconds": round(clock["cpu_seconds"], 1),
                                              "wall_seconds": round(clock["wall_seconds"], 1)}
                    print(f"[{name}] mark {m} min: step {trainer.step}", file=log, flush=True)
            write_json(run_dir / "clock.json", clock)
    return clock


def run_workers(commands: dict[str, list[str]], jobs: int, before: Callable[[str], None] = lambda name: None) -> None:
    """Each command in its own one-thread process, `jobs` at a time (`before(name)` runs first)."""
    pending, running = list(commands), {}
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            before(name)
            running[name] = subprocess.Popen(commands[name], env={**os.environ, "OMP_NUM_THREADS": "1"})
            print(f"started {name} (pid {running[name].pid})", flush=True)
        time.sleep(5)
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                print(f"{name} finished with exit code {proc.returncode}", flush=True)
                del running[name]


def translate(folder: Path, sources: list[str], work: Path, beams: int = 4) -> list[str]:
    """`attnlab translate --num-beams 4` over `sources` (the command users run)."""
    src, hyp = work / "src.txt", work / "hyp.txt"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    cmd = [sys.executable, "-m", "attnlab.cli.main", "translate", str(folder), "--input", str(src), "--output",
           str(hyp), "--num-beams", str(beams), "--max-new-tokens", "160", "--batch-size", "16", "--quiet"]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return hyp.read_text(encoding="utf-8").splitlines()
