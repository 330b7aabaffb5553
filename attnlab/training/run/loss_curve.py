"""The run's loss curve, as a PNG beside its checkpoints."""

from __future__ import annotations

import os

from attnlab.inspect.plots import plot_lines


def write_loss_curve(path: str | os.PathLike, series: dict[str, list[tuple[float, float]]]) -> None:
    """Plot `series` ({name: [(step, loss), ...]}, e.g. train and valid) and write a PNG atomically.
    Empty series are left out; nothing is written when all are empty."""
    lines = {name: ([s for s, _ in pts], [v for _, v in pts]) for name, pts in series.items() if pts}
    if lines:
        plot_lines(lines, path, xlabel="step", ylabel="loss", title="loss")
