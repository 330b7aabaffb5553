"""PNG plots (loss curves, attention maps, inspection curves), drawn with matplotlib's Agg backend.

Every function takes plain tensors or lists and a path, draws one figure and writes it
atomically (a temporary file in the same folder, then a rename), so an interrupted run never
leaves half a PNG. matplotlib is imported on first use only: `import attnlab` does not need it.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
from torch import Tensor

from attnlab.io.files import atomic_file


def _figure(width: float, height: float) -> Any:
    # Figure + FigureCanvasAgg draws off-screen without touching pyplot's global backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: str | os.PathLike) -> str:
    """Write `fig` to `path` as PNG through a temporary file and a rename; returns the path.

    Raises:
        ValueError: `path` does not end in .png.
    """
    path = os.fspath(path)
    if not path.lower().endswith(".png"):
        raise ValueError(f"path must end in .png, got {path!r}")
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    return path


def _matrix(weights: Tensor | Any, name: str) -> Tensor:
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (queries, keys) matrix, got shape {tuple(w.shape)}")
    return w


def plot_heatmap(weights: Tensor, path: str | os.PathLike, *, x_labels: Sequence[str] | None = None,
                 y_labels: Sequence[str] | None = None, title: str | None = None,
                 x_name: str = "key", y_name: str = "query") -> str:
    """One attention matrix (Tq, Tk) as a heatmap, rows = queries.

    Args:
        weights: (Tq, Tk) weights (any float tensor).
        path: where the PNG goes.
        x_labels, y_labels: token strings for the key and query axes.

    Returns:
        The path written.

    Raises:
        ValueError: weights is not 2-D, or the label counts do not match its shape.
    """
    w = _matrix(weights, "weights")
    for labels, n, axis in ((x_labels, w.shape[1], "x_labels"), (y_labels, w.shape[0], "y_labels")):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{axis} has {len(labels)} entries, expected {n}")
    fig = _figure(max(3.0, 0.35 * w.shape[1] + 1.5), max(2.5, 0.35 * w.shape[0] + 1.0))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(w.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    fig.colorbar(im, ax=ax)
    if x_labels is not None:
        ax.set_xticks(range(len(x_labels)), list(x_labels), rotation=90)
    if y_labels is not None:
        ax.set_yticks(range(len(y_labels)), list(y_labels))
    ax.set_xlabel(x_name)
    ax.set_ylabel(y_name)
    if title:
        ax.set_title(title)
    return save_figure(fig, path)


def plot_alignment(weights: Tensor, src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                   path: str | os.PathLike, title: str = "alignment") -> str:
    """A translation's alignment: target tokens (rows) against source tokens (columns)."""
    return plot_heatmap(weights, path, x_labels=src_tokens, y_labels=tgt_tokens, title=title,
                        x_name="source", y_name="target")


def plot_head_grid(weights: Tensor, path: str | os.PathLike, *, row_names: Sequence[str] | None = None,
                   title: str | None = None) -> str:
    """A grid of attention maps: one row per layer, one column per head.

    Args:
        weights: (L, H, Tq, Tk) (or (H, Tq, Tk) for one layer).
        row_names: a name per row (e.g. module names).

    Raises:
        ValueError: weights is not 3-D or 4-D.
    """
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() == 3:
        w = w[None]
    if w.dim() != 4:
        raise ValueError(f"weights must be (L, H, Tq, Tk) or (H, Tq, Tk), got shape {tuple(w.shape)}")
    L, H = w.shape[:2]
    fig = _figure(1.6 * H + 1, 1.6 * L + 0.6)
    for i in range(L):
        for h in range(H):
            ax = fig.add_subplot(L, H, i * H + h + 1)
            ax.imshow(w[i, h].numpy(), cmap="viridis", aspect="auto", vmin=0.0)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(row_names[i] if row_names else f"layer {i}", fontsize=7)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def plot_lines(series: dict[str, tuple[Sequence[float], Sequence[float]]], path: str | os.PathLike, *,
               xlabel: str, ylabel: str, title: str | None = None, logy: bool = False) -> str:
    """Named (x, y) series on one axis (log-scale y when `logy`).

    Raises:
        ValueError: no series, or an x/y length mismatch.
    """
    if not series:
        raise ValueError("series is empty: give at least one name -> (xs, ys)")
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for name, (xs, ys) in series.items():
        xs, ys = [float(v) for v in xs], [float(v) for v in ys]
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r}: {len(xs)} x values but {len(ys)} y values")
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    # below the axes: inside, long labels hid the curves they name
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize="small", frameon=False)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_scatter_fit(x_train: Sequence[float], y_train: Sequence[float], x_query: Sequence[float],
                     curves: dict[str, Sequence[float]], path: str | os.PathLike, title: str | None = None) -> str:
    """Training points as dots and fitted curves over `x_query` as lines (kernel regression)."""
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    ax.scatter([float(v) for v in x_train], [float(v) for v in y_train], s=8, alpha=0.5, label="data")
    xq = [float(v) for v in x_query]
    for name, ys in curves.items():
        ax.plot(xq, [float(v) for v in ys], label=name)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title:
        ax.set_title(title)
    ax.legend()
    return save_figure(fig, path)
