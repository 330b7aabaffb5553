"""Attention over image patches: what a ViT's (`attnlab.models.vision.VisionEncoder`) [CLS] token
and each patch attend to, drawn as a grid over the image, and the viewer page's patch labels.

A ViT reads T = 1 + N tokens: [CLS] at 0, then the N = g x g patches in raster order, patch
(r, c) at 1 + r g + c. A map's row is one query; its keys 1..N, reshaped (g, g), lie over the
image exactly where the patches were cut, so `on_grid` turns a row into a picture; the weight
on [CLS] itself (key 0) has no place in the image and is written in each panel's title.

    maps = image_attention(model, image)                # {name: (H, T, T)} of one image
    plot_cls_attention(image, maps, grid, "cls.png")    # rows: layers; columns: the image, heads, mean
    plot_patch_attention(image, maps["layers.0.self_attn"], grid, "layer0.png")  # each patch's view
    view = image_view(model, image)                     # an AttentionView for attnlab.inspect.viewer

Notation: C channels, S image side in pixels, g patches per side, N = g g, T = 1 + N, H heads.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import torch
from torch import Tensor, nn

from attnlab.inspect.attention_maps import attention_maps, select_modules
from attnlab.inspect.plots import save_figure

__all__ = ["CLS_LABEL", "DIGITS_SPLIT_SEED", "DIGITS_TEST_FRACTION", "image_attention", "image_view", "on_grid", "patch_labels", "plot_cls_attention",
           "plot_patch_attention"]

CLS_LABEL = "[CLS]"
# The digits split of examples/vit_digits (`attnlab.data.images.stratified_split`), whose test
# images `attnlab inspect attention --image N` picks by position.
DIGITS_TEST_FRACTION, DIGITS_SPLIT_SEED = 0.2, 0


def patch_labels(grid: int) -> list[str]:
    """The T = 1 + g^2 token labels of a ViT: `[CLS]`, then `p(r,c)` in raster order.

    Example: patch_labels(2) == ["[CLS]", "p(0,0)", "p(0,1)", "p(1,0)", "p(1,1)"].
    """
    return [CLS_LABEL] + [f"p({r},{c})" for r in range(grid) for c in range(grid)]


def on_grid(weights: Tensor, grid: int) -> Tensor:
    """(..., T) rows over [CLS] + patches -> (..., g, g): the patch keys where they lie in the image.

    Raises:
        ValueError: the last axis is not 1 + g^2 long.
    """
    if weights.shape[-1] != 1 + grid * grid:
        raise ValueError(f"expected rows over 1 + {grid}^2 = {1 + grid * grid} keys ([CLS] + patches), "
                         f"got {weights.shape[-1]}")
    return weights[..., 1:].reshape(*weights.shape[:-1], grid, grid)


def _one_image(model: nn.Module, image: Tensor) -> Tensor:
    """`image` as the (1, C, S, S) batch the model takes, from (S, S), (C, S, S) or (1, C, S, S).

    Raises:
        ValueError: another shape or dtype, or non-finite pixels (names what the model expects).
    """
    cfg = model.config
    want = (cfg.channels, cfg.image_size, cfg.image_size)
    x = torch.as_tensor(image)
    if x.dim() == 2 and cfg.channels == 1:
        x = x[None]
    if x.dim() == 4 and x.shape[0] == 1:
        x = x[0]
    if x.dim() != 3 or tuple(x.shape) != want:
        raise ValueError(f"the image must be {' x '.join(map(str, want))} (channels, height, width)"
                         + (f" or {want[1]} x {want[2]}" if cfg.channels == 1 else "") + f", got {tuple(x.shape)}")
    if x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"the image must hold real numbers, got {x.dtype}")
    x = x.float()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("the image has NaN or infinite pixels")
    return x[None].to(next(model.parameters()).device)


def image_attention(model: nn.Module, image: Tensor, *, names: Iterable[str] | str | None = None,
                    heads: Sequence[int] | None = None) -> dict[str, Tensor]:
    """The attention maps of a ViT on one image, {module name: (H', T, T)} float32 on the CPU.

    Args:
        model: a `VisionEncoder`.
        image: (S, S) for one channel, (C, S, S) or (1, C, S, S), pixels as the model was trained on.
        names: attention module names or shell patterns (`attention_maps`); None = all.
        heads: head indices to keep (None = all).

    Raises:
        ValueError: a wrong image shape, a pattern matching no module, a head out of range.
    """
    batch = _one_image(model, image)
    maps = attention_maps(model, batch, names=names, heads=heads)
    return {name: w[0].float().cpu() for name, w in maps.items()}


def _figure(width: float, height: float):
    """An off-screen matplotlib figure (Agg, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _grey(image: Tensor) -> Tensor:
    """(C, S, S) -> what imshow draws: (S, S) for one channel, (S, S, 3) clipped to [0, 1] for RGB."""
    image = torch.as_tensor(image).float().cpu()
    if image.dim() == 2:
        return image
    if image.shape[0] == 3:
        return image.permute(1, 2, 0).clamp(0, 1)
    return image.mean(0)


def _panel(ax, picture: Tensor, weights: Tensor, grid: int, *, query: tuple[int, int] | None = None) -> None:
    """The image in grey, the (g, g) weights over it (colour from 0 to their largest), patch borders,
    and the query patch outlined in red."""
    side = picture.shape[0]
    extent = (-0.5, side - 0.5, side - 0.5, -0.5)  # the g x g cells cover the S x S pixels exactly
    if picture.dim() == 2:
        ax.imshow(picture.numpy(), cmap="gray_r", extent=extent)
    else:
        ax.imshow(picture.numpy(), extent=extent)
    top = float(weights.max())
    ax.imshow(weights.numpy(), cmap="viridis", alpha=0.6, vmin=0.0, vmax=top if top > 0 else 1.0, extent=extent,
              interpolation="nearest")
    step = side / grid
    for k in range(1, grid):
        ax.axhline(k * step - 0.5, color="white", linewidth=0.4, alpha=0.7)
        ax.axvline(k * step - 0.5, color="white", linewidth=0.4, alpha=0.7)
    if query is not None:
        from matplotlib.patches import Rectangle

        r, c = query
        ax.add_patch(Rectangle((c * step - 0.5, r * step - 0.5), step, step, fill=False, edgecolor="red",
                               linewidth=1.5))
    ax.set_xlim(extent[0], extent[1])
    ax.set_ylim(extent[2], extent[3])
    ax.set_xticks([])
    ax.set_yticks([])


def _check_maps(maps: dict[str, Tensor], grid: int) -> None:
    if not maps:
        raise ValueError("maps is empty: give at least one module's (H, T, T) weights")
    for name, w in maps.items():
        if w.dim() != 3 or w.shape[1] != 1 + grid * grid or w.shape[2] != 1 + grid * grid:
            raise ValueError(f"{name}: expected (heads, {1 + grid * grid}, {1 + grid * grid}) weights over [CLS] + "
                             f"{grid}x{grid} patches, got {tuple(w.shape)}")


def plot_cls_attention(image: Tensor, maps: dict[str, Tensor], grid: int, path: str | os.PathLike, *,
                       heads: Sequence[int] | None = None, title: str | None = None) -> str:
    """Where [CLS] looks: one row per module, columns = the image, each head, the mean over heads;
    each panel is [CLS]'s row over the patch grid, its own weight on [CLS] in the title.

    Args:
        image: (C, S, S) or (S, S), drawn under the maps.
        maps: {module name: (H', T, T)}, as `image_attention` returns.
        grid: g, patches per side.
        path: the PNG to write.
        heads: the model's indices of the H' heads (for the column titles; default 0..H'-1).

    Returns:
        the path written.

    Raises:
        ValueError: maps of the wrong shape for `grid`.
    """
    _check_maps(maps, grid)
    picture = _grey(image)
    n_heads = next(iter(maps.values())).shape[0]
    heads = list(heads) if heads is not None else list(range(n_heads))
    columns = [f"head {h}" for h in heads] + (["mean"] if n_heads > 1 else [])
    fig = _figure(1.7 * (len(columns) + 1) + 0.5, 1.8 * len(maps) + 0.7)
    for i, (name, w) in enumerate(maps.items()):
        rows = [w[h, 0] for h in range(n_heads)] + ([w[:, 0].mean(0)] if n_heads > 1 else [])  # each (T,)
        ax = fig.add_subplot(len(maps), len(columns) + 1, i * (len(columns) + 1) + 1)
        ax.imshow(picture.numpy(), cmap="gray_r" if picture.dim() == 2 else None)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(name, fontsize=7)
        if i == 0:
            ax.set_title("image", fontsize=8)
        for j, row in enumerate(rows):
            ax = fig.add_subplot(len(maps), len(columns) + 1, i * (len(columns) + 1) + j + 2)
            _panel(ax, picture, on_grid(row, grid), grid)
            ax.set_title((f"{columns[j]}\n" if i == 0 else "") + f"{CLS_LABEL} {float(row[0]):.2f}", fontsize=7)
    fig.suptitle(title or f"{CLS_LABEL}'s attention over the {grid}x{grid} patches "
                          "(colour: 0 to each panel's largest weight)", fontsize=9)
    return save_figure(fig, path)


def plot_patch_attention(image: Tensor, weights: Tensor, grid: int, path: str | os.PathLike, *,
                         title: str | None = None) -> str:
    """Where each patch looks (one module, mean over its heads): a g x g arrangement of panels,
    panel (r, c) = the row of query p(r,c) over the patch grid with p(r,c) outlined in red, plus
    [CLS]'s row first; each title gives the query's weight on [CLS].

    Args:
        image: (C, S, S) or (S, S).
        weights: (H', T, T) of one module.
        grid: g.
        path: the PNG to write.

    Returns:
        the path written.

    Raises:
        ValueError: weights of the wrong shape for `grid`.
    """
    _check_maps({"weights": weights}, grid)
    picture = _grey(image)
    mean = weights.float().mean(0)  # (T, T)
    cols = grid + 1  # column 0: the image and [CLS]'s row; then the patch grid
    fig = _figure(1.45 * cols + 0.3, 1.55 * grid + 0.7)
    labels = patch_labels(grid)
    for r in range(grid):
        if r == 0:
            ax = fig.add_subplot(grid, cols, 1)
            _panel(ax, picture, on_grid(mean[0], grid), grid)
            ax.set_title(f"{CLS_LABEL} -> {CLS_LABEL} {float(mean[0, 0]):.2f}", fontsize=6)
        elif r == 1:
            ax = fig.add_subplot(grid, cols, cols + 1)
            ax.imshow(picture.numpy(), cmap="gray_r" if picture.dim() == 2 else None)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title("image", fontsize=6)
        for c in range(grid):
            q = 1 + r * grid + c
            ax = fig.add_subplot(grid, cols, r * cols + c + 2)
            _panel(ax, picture, on_grid(mean[q], grid), grid, query=(r, c))
            ax.set_title(f"{labels[q]} -> {CLS_LABEL} {float(mean[q, 0]):.2f}", fontsize=6)
    fig.suptitle(title or f"each patch's attention over the patches (mean over {weights.shape[0]} heads; "
                          "red: the query)", fontsize=8)
    return save_figure(fig, path)


def image_view(model: nn.Module, image: Tensor, *, names: Iterable[str] | str | None = None,
               heads: Sequence[int] | None = None):
    """What `attnlab.inspect.viewer.render_html` shows for a ViT on one image: one self-attention
    kind over the tokens `[CLS]`, `p(0,0)`, ..., with each kernel's allowed keys where it has a
    dense pattern (a ViT is bidirectional: nothing is causal).

    Args:
        model: a `VisionEncoder`.
        image, names, heads: as `image_attention`.

    Returns:
        an `attnlab.inspect.viewer.AttentionView`.
    """
    from attnlab.inspect.viewer import AttentionKind, AttentionMap, AttentionView
    from attnlab.nn.attention import MultiHeadAttention

    maps = image_attention(model, image, names=names, heads=heads)
    modules = select_modules(model, list(maps))
    labels = patch_labels(model.config.grid)
    kinds: dict[str, AttentionKind] = {}
    for layer_index, (name, w) in enumerate(maps.items()):
        parts = name.split(".")
        layer = int(parts[1]) if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit() else layer_index
        kind_id = ".".join(["layers", "*", *parts[2:]]) if parts[0] == "layers" else name
        kind = kinds.setdefault(kind_id, AttentionKind(kind_id, f"self-attention over the patches: {kind_id}",
                                                       "source", "source"))
        module = modules[name]
        kernel = module.kernel if isinstance(module, MultiHeadAttention) else None
        allowed, note = None, f"kernel {kernel.name if kernel is not None else '?'}: every key allowed"
        if kernel is not None and w.shape[1] == w.shape[2]:
            pattern = kernel.dense_mask(w.shape[2], False, batch=1)
            if pattern is not None:
                allowed = pattern.reshape(-1, w.shape[1], w.shape[2])[0].cpu()
                note = f"kernel {kernel.name}: grey keys are outside its pattern"
        key_labels = None if w.shape[2] == len(labels) else [f"#{j}" for j in range(w.shape[2])]
        head_ids = list(heads) if heads is not None else list(range(w.shape[0]))
        kind.maps.append(AttentionMap(name, layer, head_ids, w, allowed, key_labels, note))
    enc = model.config.encoder
    info = {"arch": "vit", "d_model": enc.d_model, "num_layers": enc.num_layers, "num_heads": enc.num_heads,
            "kernel": enc.attention.kernel, "image_size": model.config.image_size,
            "patch_size": model.config.patch_size}
    return AttentionView(labels, None, list(kinds.values()), None, info)
