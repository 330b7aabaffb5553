"""Patching and ablation results drawn: a PNG heatmap (rows: points or layers, columns: positions
or heads) and a page of the attention viewer (`attnlab.inspect.viewer`) over the same grid.

    plot_patching(result, "resid.png", column_labels=tokens)      # normalised scores, 0 white
    write_patching_html("resid.html", result, column_labels=tokens)

The viewer draws weights in [0, 1]; a score can have either sign, so the page holds two "heads"
over the grid: head 0 is the score where it is positive (the piece restores the clean metric),
head 1 minus the score where it is negative (the piece pushes the other way), each cut at 1.
"""

from __future__ import annotations

import os
from typing import Sequence, Union

import torch
from torch import Tensor

from attnlab.inspect.ablation import AblationResult
from attnlab.inspect.patching import PatchResult
from attnlab.inspect.plots import _figure, save_figure

__all__ = ["grid_of", "patching_view", "plot_patching", "write_patching_html"]

Result = Union[PatchResult, AblationResult]


def grid_of(result: Result) -> tuple[Tensor, str]:
    """The grid drawn and what it is: a patch's normalised score, an ablation's effect."""
    if isinstance(result, PatchResult):
        what = "normalised score (patched - corrupted) / (clean - corrupted)"
        return result.normalised().float(), what if result.direction != "path" else what + ", paths only"
    if isinstance(result, AblationResult):
        return result.effect().float(), f"{result.method} ablation: metric - unablated metric"
    raise TypeError(f"result must be a PatchResult or an AblationResult, got {type(result).__name__}")


def _columns(result: Result, column_labels: Sequence[str] | None) -> list[str]:
    if column_labels is None:
        return list(result.columns)
    if len(column_labels) != len(result.columns):
        raise ValueError(f"column_labels has {len(column_labels)} entries; the result has {len(result.columns)} "
                         f"{result.axis} columns")
    return [f"{i}:{t}" for i, t in enumerate(column_labels)] if result.axis == "position" else list(column_labels)


def plot_patching(result: Result, path: str | os.PathLike, *, column_labels: Sequence[str] | None = None,
                  title: str | None = None) -> str:
    """A heatmap of `grid_of(result)` (blue: towards the clean run or up, red: away; white 0; blank:
    not computed), with the values written in the cells when the grid is small.

    Args:
        column_labels: labels of the columns (tokens for a position axis), default the result's.

    Returns:
        the path written (a PNG, atomically).
    """
    grid, what = grid_of(result)
    columns = _columns(result, column_labels)
    rows, cols = grid.shape
    fig = _figure(max(4.0, 0.5 * cols + 3.0), max(2.5, 0.4 * rows + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    finite = grid[torch.isfinite(grid)]
    bound = max(1.0 if isinstance(result, PatchResult) else 0.0, float(finite.abs().max()) if finite.numel() else 0.0)
    bound = bound or 1.0
    im = ax.imshow(grid.numpy(), cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
    fig.colorbar(im, ax=ax, label="normalised score" if isinstance(result, PatchResult) else "metric change")
    ax.set_xticks(range(cols), columns, rotation=90 if result.axis == "position" else 0)
    ax.set_yticks(range(rows), result.rows, fontsize=7)
    ax.set_xlabel(result.axis.replace("_", " "))
    if rows * cols <= 200:
        for i in range(rows):
            for j in range(cols):
                if torch.isfinite(grid[i, j]):
                    ax.text(j, i, f"{float(grid[i, j]):.2f}", ha="center", va="center", fontsize=6)
    ax.set_title(title or what, fontsize=9)
    return save_figure(fig, path)


def patching_view(result: Result, *, column_labels: Sequence[str] | None = None, title: str = "patching"):
    """The grid as an `AttentionView` the viewer page shows (module docstring): rows as the
    "queries", columns as the "keys", two heads (positive part, negative part)."""
    from attnlab.inspect.viewer import AttentionKind, AttentionMap, AttentionView

    grid, what = grid_of(result)
    grid = torch.nan_to_num(grid, nan=0.0)
    weights = torch.stack((grid.clamp(0, 1), (-grid).clamp(0, 1)))  # (2, rows, columns)
    kind = AttentionKind("patching", title, "source", "target",
                         [AttentionMap("patching", 0, [0, 1], weights, note=f"{what}; head 0: where positive, "
                                                                                "head 1: minus where negative")])
    info = {"grid": what, "rows": "hook points" if result.axis == "position" else "attention modules",
            "columns": result.axis}
    if isinstance(result, PatchResult):
        info.update(clean=round(result.clean, 4), corrupted=round(result.corrupted, 4), direction=result.direction)
    else:
        info.update(baseline=round(result.baseline, 4), method=result.method)
    notice = (f"{what}. Rows: {', '.join(result.rows[:3])}{', ...' if len(result.rows) > 3 else ''}; "
              f"columns: {result.axis.replace('_', ' ')}s. Head 0 shows the score where positive, head 1 minus "
              "the score where negative (both cut at 1).")
    return AttentionView(list(result.rows), _columns(result, column_labels), [kind], notice, info)


def write_patching_html(path: str | os.PathLike, result: Result, *, column_labels: Sequence[str] | None = None,
                        title: str = "patching") -> str:
    """Write the viewer page of `patching_view(result)` to `path` atomically; returns the path."""
    from attnlab.inspect.viewer import render_html
    from attnlab.io.files import atomic_write_text

    if os.path.isdir(path):
        raise ValueError(f"path: {os.fspath(path)!r} is a folder; give a file path such as patching.html")
    return os.fspath(atomic_write_text(path, render_html(patching_view(result, column_labels=column_labels,
                                                                        title=title), title)))
