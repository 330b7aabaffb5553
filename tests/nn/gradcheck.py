"""Checking a function's gradient by central differences along random directions."""

from __future__ import annotations

import torch


def assert_directional_derivatives(f, inputs: tuple[torch.Tensor, ...], directions: int = 2, eps: float = 1e-6) -> None:
    """For float64 `inputs` (requiring grad): the analytic derivative of sum(f(*inputs) * g)
    along random directions equals the central difference (atol = rtol = 1e-6)."""
    g = torch.randn_like(f(*inputs))
    grads = torch.autograd.grad((f(*inputs) * g).sum(), inputs)
    gen = torch.Generator().manual_seed(0)
    for _ in range(directions):
        dirs = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in inputs]
        with torch.no_grad():
            plus = (f(*(x + eps * d for x, d in zip(inputs, dirs))) * g).sum()
            minus = (f(*(x - eps * d for x, d in zip(inputs, dirs))) * g).sum()
        analytic = sum((gr * d).sum() for gr, d in zip(grads, dirs))
        torch.testing.assert_close(analytic, (plus - minus) / (2 * eps), atol=1e-6, rtol=1e-6)
