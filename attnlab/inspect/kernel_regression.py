"""Attention as Nadaraya-Watson kernel regression (Nadaraya 1964, Watson 1964).

Given training pairs (x_i, y_i), predict at a query x:

    f(x) = sum_i alpha(x, x_i) y_i,   alpha(x, x_i) = K((x - x_i) / h) / sum_j K((x - x_j) / h)

With the Gaussian kernel K(u) = exp(-u^2 / 2) the weights are a softmax over keys of the score
-(x - x_i)^2 / (2 h^2): attention whose queries are the x, keys the x_i, values the y_i and
score function the negative squared distance. The weights are a distribution, so f(x) lies in
the convex hull of the y_i; a small bandwidth h gives peaked weights (close to nearest
neighbour), a large one averages everything.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from attnlab.nn.kernels import attention_weights


def nadaraya_watson(queries: Tensor, keys: Tensor, values: Tensor, bandwidth: float = 1.0) -> tuple[Tensor, Tensor]:
    """Gaussian-kernel regression as attention.

    Args:
        queries: (Q,) or (Q, d) points to predict at.
        keys: (N,) or (N, d) training inputs.
        values: (N,) or (N, m) training targets.
        bandwidth: h > 0.

    Returns:
        (predictions (Q,) or (Q, m), weights (Q, N) with rows summing to 1).

    Raises:
        ValueError: bandwidth not positive, or keys and values of different lengths.
    """
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth!r}")
    q = queries[:, None] if queries.dim() == 1 else queries  # (Q, d)
    k = keys[:, None] if keys.dim() == 1 else keys  # (N, d)
    if values.shape[0] != k.shape[0]:
        raise ValueError(f"keys has {k.shape[0]} points but values has {values.shape[0]}")
    scores = -torch.cdist(q, k).pow(2) / (2 * bandwidth**2)  # (Q, N)
    weights = attention_weights(scores)
    return weights @ values, weights


def toy_data(n: int = 50, *, seed: int = 0, noise: float = 0.5) -> tuple[Tensor, Tensor]:
    """x ~ sorted U(0, 5), y = 2 sin(x) + x^0.8 + N(0, noise^2): a smooth curve to recover."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.sort(torch.rand(n, generator=gen) * 5).values
    return x, true_function(x) + noise * torch.randn(n, generator=gen)


def true_function(x: Tensor) -> Tensor:
    return 2 * torch.sin(x) + x**0.8


def kernel_regression_demo(path: str | os.PathLike, *, bandwidths: tuple[float, ...] = (0.1, 0.5, 2.0),
                           n: int = 50, seed: int = 0) -> dict[float, float]:
    """Fit the toy data with several bandwidths, plot the fits and the truth; returns
    {bandwidth: mean squared error against the true function on a grid}."""
    from attnlab.inspect.plots import plot_scatter_fit

    x, y = toy_data(n, seed=seed)
    grid = torch.linspace(0, 5, 100)
    curves, errors = {"truth": true_function(grid).tolist()}, {}
    for h in bandwidths:
        pred, _ = nadaraya_watson(grid, x, y, h)
        curves[f"h = {h:g}"] = pred.tolist()
        errors[h] = float((pred - true_function(grid)).pow(2).mean())
    plot_scatter_fit(x.tolist(), y.tolist(), grid.tolist(), curves, path,
                     title="Nadaraya-Watson = softmax(-(x - x_i)^2 / 2h^2) attention")
    return errors


def gaussian_kernel(u: Tensor) -> Tensor:
    """K(u) = exp(-u^2 / 2) / sqrt(2 pi)."""
    return torch.exp(-u.pow(2) / 2) / math.sqrt(2 * math.pi)
