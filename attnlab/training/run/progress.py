"""The training log: the setup line a run starts with, then steps gathered into windows of `train.log_every`, each reported once as a
metrics record and a line.

    step    200/2000 | loss 2.3141 | lr 3.00e-04 | 41,112 tok/s | ETA 3m12s

tokens/s counts a window's input tokens over its wall time, less what was set aside (evaluation,
checkpoints, and compiling: `aside`); the ETA is the steady time per step so far times the steps
left, capped by `train.max_minutes`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from attnlab.io.progress import format_seconds
from attnlab.training.setup.precision import native_bf16, native_fp16


class StepResult(NamedTuple):
    """One optimisation step: its loss (NaN when skipped by the NaN policy), named parts, input
    tokens, whether the weights were left as they were (NaN policy, or an fp16 overflow), and
    the gradient norm before clipping (None without optim.grad_clip, or when not finite)."""

    loss: float
    parts: dict[str, float]
    tokens: int
    skipped: bool
    grad_norm: float | None = None


class StepWindow:
    """The steps since the last log line, and the run's totals the line needs.

    Args:
        first_step: the step the run (or its resume) starts from.
        max_steps, max_minutes: the run's limits (for the ETA).
    """

    def __init__(self, first_step: int, max_steps: int, max_minutes: float | None):
        self.first_step, self.max_steps, self.max_minutes = first_step, max_steps, max_minutes
        self.start = time.perf_counter()
        self.set_aside = 0.0  # compile time over the run: kept out of the ETA
        self.first_loss = self.last_loss = float("nan")
        self._reset()

    def _reset(self) -> None:
        self.losses: list[tuple[float, dict[str, float]]] = []
        self.norms: list[float] = []
        self.tokens = 0
        self.began = time.perf_counter()

    def add(self, result: StepResult) -> None:
        self.tokens += result.tokens
        if not math.isnan(result.loss):  # (an fp16 overflow skips the update, not the loss)
            self.losses.append((result.loss, result.parts))
            self.last_loss = result.loss
            self.first_loss = result.loss if math.isnan(self.first_loss) else self.first_loss
        if result.grad_norm is not None:
            self.norms.append(result.grad_norm)

    def aside(self, seconds: float, *, compiling: bool = False) -> None:
        """Time not spent training (evaluation, checkpoints, compiling): out of tokens/s."""
        self.began += seconds
        self.set_aside += seconds if compiling else 0.0

    @property
    def elapsed(self) -> float:
        """Seconds since the run (or its resume) began."""
        return time.perf_counter() - self.start

    def report(self, step: int, lr: float, parts: dict[str, float], extra: dict[str, Any],
               skipped: bool) -> tuple[dict, str]:
        """The window's metrics record and log line; a new window begins."""
        seconds = max(time.perf_counter() - self.began, 1e-9)
        n = len(self.losses)
        mean = sum(x for x, _ in self.losses) / n if n else float("nan")
        means = {k: sum(p.get(k, 0.0) for _, p in self.losses) / n for k in parts}
        tps = self.tokens / seconds
        done = self.elapsed
        eta = (done - self.set_aside) / max(step - self.first_step, 1) * (self.max_steps - step)
        if self.max_minutes is not None:  # the time limit may come first
            eta = min(eta, max(0.0, 60 * self.max_minutes - done))
        norms = {"grad_norm": sum(self.norms) / len(self.norms)} if self.norms else {}  # before clipping
        record = {"step": step, "train_loss": mean, **means, "lr": lr, **norms, **extra, "tokens_per_s": tps,
                  "elapsed_s": done, "skipped": skipped}
        line = (f"step {step:>6}/{self.max_steps} | loss {mean:.4f} | lr {lr:.2e} | {tps:,.0f} tok/s | "
                f"ETA {format_seconds(eta)}")
        self._reset()
        return record, line


def setup_line(config: Any, model: nn.Module, strategy: Any, precision: str, scaler: torch.amp.GradScaler, *,
               task: Any = None) -> str:
    """`setup: decoder, 1,234 parameters | causal_lm on shakespeare, seq_len 256, batch 32 x 1 | 2,000
    steps | precision: fp32 (auto on cpu) | device cpu | out runs/x`; `task` (a task other than the
    pretraining objective of config.data) is named instead of the data."""
    n_params = sum(p.numel() for p in {id(p): p for p in strategy.held.parameters()}.values())
    run, data = config.train, config.data
    kind = getattr(model.config, "arch", None) or type(model).__name__  # (a ViT's config has no arch)
    what = f"{kind}, {n_params:,} parameters{strategy.describe()}"
    if task is None:
        batch = f"{data.batch_tokens} tokens" if data.batch_tokens else f"{data.batch_size}"
        work = f"{data.objective} on {data.source}, seq_len {data.seq_len}, batch {batch} x {run.grad_accum}"
    else:
        work = type(task).__name__
    return (f"setup: {what} | {work} | {run.max_steps:,} steps | {_precision(config, precision, scaler, strategy.device)}"
            f" | device {strategy.device} | out {Path(run.out_dir)}")


def _precision(config: Any, precision: str, scaler: torch.amp.GradScaler, device: torch.device) -> str:
    """`precision: bf16 (auto on cpu)`; fp16 names its loss scale; auto on a GPU with fp16 but
    without bf16 (V100, T4) says that fp16 would be faster."""
    line = f"precision: {precision}"
    if config.train.precision == "auto":
        line += f" (auto on {device.type})"
        if precision == "fp32" and device.type == "cuda" and native_fp16(device) and not native_bf16(device):
            line += "; this GPU has no bf16 but fast fp16: train.precision=fp16 (loss-scaled) is faster"
    if scaler.is_enabled():
        line += f", loss scaling from {scaler.get_scale():g}"
    return line
