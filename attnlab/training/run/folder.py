"""A training run's folder: everything the Trainer writes, in one object.

    OUT/.attnlab.lock        held while the run writes here (attnlab.io.lock)
    OUT/config.json          the resolved config, the model's, seed, precision, versions, command
    OUT/metrics.jsonl        one JSON object per log window and per evaluation (NaN as null)
    OUT/loss.png             train (blue) and validation (red) loss
    OUT/tensorboard/         the same scalars and text samples (train.tensorboard)
    OUT/checkpoints/         attnlab.io.checkpoints: step-N/ folders, index.json (latest, best)

Under torchrun every rank has a RunFolder, and only rank 0's writes (`writes`); a checkpoint is
gathered first on every rank (the strategy), then written by rank 0 while the others wait.
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.io.checkpoints import list_checkpoints, read_index, save_checkpoint
from attnlab.io.files import append_line, atomic_write_json, atomic_write_text, json_text
from attnlab.io.lock import RunLock
from attnlab.training.config import absolute_paths
from attnlab.training.run.loss_curve import write_loss_curve
from attnlab.training.run.tensorboard import TensorBoardLog


def versions() -> dict[str, str]:
    """Versions a run records beside its config."""
    import platform

    import numpy

    from attnlab._version import __version__

    return {"attnlab": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}


class RunFolder:
    """The files of the run in `out` (see the module docstring).

    Attributes:
        out: the folder (train.out_dir).
        writes: whether this process writes (rank 0).
        history: {"train": [(step, loss)], "valid": [(step, val_loss)]}, what loss.png plots.
    """

    def __init__(self, out: str | Path, *, writes: bool = True):
        self.out = Path(out)
        self.writes = writes
        self.history: dict[str, list[tuple[int, float]]] = {"train": [], "valid": []}
        self.tensorboard: TensorBoardLog | None = None  # open during a fit (train.tensorboard)

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"

    def lock(self) -> AbstractContextManager:
        """Held while a run writes here: a second run on the folder is refused, naming the first."""
        return RunLock(self.out, what="train.out_dir") if self.writes else nullcontext()

    def start(self, *, resumed: bool) -> None:
        """Before the first step: a fresh run refuses a folder holding another run's checkpoints
        and starts metrics.jsonl anew; a resumed one keeps both."""
        self.out.mkdir(parents=True, exist_ok=True)
        if resumed:
            return
        if list_checkpoints(self.checkpoints):
            raise ValueError(f"train.out_dir={str(self.out)!r} already holds checkpoints; continue that run with "
                             f"`attnlab train --resume {self.out}`, or choose another train.out_dir")
        if (self.out / "metrics.jsonl").exists() and self.writes:
            (self.out / "metrics.jsonl").unlink()

    def write_config(self, config: dict[str, Any], model_config: dict[str, Any], *, seed: int, precision: str) -> None:
        """OUT/config.json: paths made absolute, so the folder works from any directory."""
        if not self.writes:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"config": absolute_paths(config), "model": model_config, "seed": seed, "precision": precision,
                "versions": versions(), "command": " ".join(sys.argv)}
        atomic_write_json(self.out / "config.json", data, indent=2)

    # ---------------------------------------------------------------- metrics
    def open_tensorboard(self, config: dict[str, Any], step: int, *, fresh: bool) -> None:
        if self.writes:
            self.tensorboard = TensorBoardLog(self.out / "tensorboard", start_step=step, fresh=fresh)
            self.tensorboard.config(config, step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def record(self, record: dict[str, Any]) -> None:
        """One line of metrics.jsonl (whole lines; NaN as null), and the same to TensorBoard."""
        if not self.writes:
            return
        append_line(self.out / "metrics.jsonl", json_text(record))
        if self.tensorboard is not None:
            self.tensorboard.record(record)

    def text(self, tag: str, text: str, step: int) -> None:
        """A text sample for TensorBoard (nothing without it)."""
        if self.tensorboard is not None:
            self.tensorboard.text(tag, text, step)

    def trim_metrics(self, step: int) -> None:
        """After a resume at `step`: drop the records of later steps (they will be redone) and read
        the kept losses back into `history`."""
        path = self.out / "metrics.jsonl"
        if not path.exists() or not self.writes:
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = {k: math.nan if v is None else v for k, v in json.loads(line).items()}  # null: NaN
            except (json.JSONDecodeError, AttributeError):  # a line cut by the crash
                continue
            if record.get("step", 0) <= step:
                kept.append(line)
                if "train_loss" in record:
                    self.history["train"].append((record["step"], record["train_loss"]))
                if "val_loss" in record:
                    self.history["valid"].append((record["step"], record["val_loss"]))
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    def plot(self) -> None:
        """loss.png beside metrics.jsonl (train in blue, validation in red)."""
        if (self.history["train"] or self.history["valid"]) and self.writes:
            write_loss_curve(self.out / "loss.png", self.history)

    # ---------------------------------------------------------------- checkpoints
    def save(self, *, step: int, model: nn.Module | None, optimizer: torch.optim.Optimizer | None,
             schedule_state: dict[str, Any], data_generator: torch.Generator, extra: dict[str, Any],
             metric: float | None, keep_last: int) -> Path:
        """Write checkpoint `step` (rank 0; the model and optimizer gathered whole) and return
        its folder; other ranks return the checkpoints folder."""
        if not self.writes:
            return self.checkpoints
        return save_checkpoint(self.checkpoints, step=step, model=model, optimizer=optimizer,
                               schedule_state=schedule_state, data_generator=data_generator, extra=extra,
                               metric=metric, keep_last=keep_last)

    def latest(self) -> Path | None:
        """The run's latest checkpoint (where a resume goes on from), None before the first."""
        name = read_index(self.checkpoints).get("latest")
        return self.checkpoints / name if name else None

    def best(self) -> str | None:
        """The name of the checkpoint that scored the best validation loss."""
        return read_index(self.checkpoints).get("best")
