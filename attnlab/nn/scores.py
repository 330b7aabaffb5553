"""Score functions f(q, k): how well each query matches each key.

Notation: q (B, H, Tq, Dh), k (B, H, Tk, Dh) -> scores (B, H, Tq, Tk).

Dot-product-shaped scores (`fused = True`) are written as scale * q' . k' for some
transformed q', k', so PyTorch's fused `scaled_dot_product_attention` can compute them
without materialising the T x T matrix; the others need the eager kernel. A score whose q', k'
are wider than the values (`widens = True`: the Gaussian appends one feature) runs on the kernels
that allow it (`Supports.wide_qk`).

`SCORES` maps the config name (`attention.score`) to the class; each class builds itself from
the layer's sizes and the config's score options (`build`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ScoreFunction(nn.Module):
    """Base: f(q, k) = scale * q' . k' with (q', k', scale) from `prepare`."""

    fused = True
    widens = False

    @classmethod
    def build(cls, num_heads: int, head_dim: int, **options: Any) -> "ScoreFunction":
        """One layer's score function from its sizes and the score options of `AttentionConfig`
        (`cosine_temperature`, `additive_dim`, `gaussian_sigma`; each class reads its own)."""
        return cls()

    def prepare(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        raise NotImplementedError

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        q, k, scale = self.prepare(q, k)
        return (q @ k.transpose(-2, -1)) * scale


class ScaledDot(ScoreFunction):
    """q . k / sqrt(Dh) (Vaswani et al. 2017): keeps the logits' variance near 1 as Dh grows."""

    def prepare(self, q, k):
        return q, k, q.shape[-1] ** -0.5


class Dot(ScoreFunction):
    """q . k (Luong et al. 2015, "dot")."""

    def prepare(self, q, k):
        return q, k, 1.0


class Cosine(ScoreFunction):
    """cos(q, k) / temperature: bounded logits, so the temperature sets how peaked the weights
    can get (as in Swin v2, Liu et al. 2022)."""

    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    @classmethod
    def build(cls, num_heads, head_dim, **options):
        return cls(options.get("cosine_temperature", 0.1))

    def prepare(self, q, k):
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1), 1.0 / self.temperature


class General(ScoreFunction):
    """q W_h k^T with a learned (Dh, Dh) matrix per head (Luong et al. 2015, "general").
    W starts as I / sqrt(Dh), so an untrained model scores exactly like scaled_dot."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(num_heads, 1, 1) * head_dim**-0.5)

    @classmethod
    def build(cls, num_heads, head_dim, **options):
        return cls(num_heads, head_dim)

    def prepare(self, q, k):
        return q @ self.weight.to(q.dtype), k, 1.0  # (B, H, Tq, Dh) @ (H, Dh, Dh)


class Additive(ScoreFunction):
    """v_h^T tanh(W_q q + W_k k) per head (Bahdanau et al. 2015, https://arxiv.org/abs/1409.0473).
    Builds a (B, H, Tq, Tk, hidden) tensor: for teaching and short inputs."""

    fused = False

    def __init__(self, num_heads: int, head_dim: int, hidden: int):
        super().__init__()
        self.w_q = nn.Parameter(torch.empty(num_heads, head_dim, hidden))
        self.w_k = nn.Parameter(torch.empty(num_heads, head_dim, hidden))
        self.v = nn.Parameter(torch.empty(num_heads, hidden))
        for p in (self.w_q, self.w_k):
            nn.init.normal_(p, std=head_dim**-0.5)
        nn.init.normal_(self.v, std=hidden**-0.5)

    @classmethod
    def build(cls, num_heads, head_dim, **options):
        return cls(num_heads, head_dim, options.get("additive_dim") or head_dim)

    def forward(self, q, k):
        a = q @ self.w_q.to(q.dtype)  # (B, H, Tq, A)
        b = k @ self.w_k.to(k.dtype)  # (B, H, Tk, A)
        hidden = torch.tanh(a[:, :, :, None, :] + b[:, :, None, :, :])  # (B, H, Tq, Tk, A)
        return (hidden * self.v[None, :, None, None, :].to(q.dtype)).sum(-1)


class Gaussian(ScoreFunction):
    """-||q - k||^2 / (2 sigma^2): a radial kernel, high where the query is near the key (the
    lectures' table of score functions). sigma defaults to Dh^(1/4), so that its q.k part is
    q.k / sqrt(Dh), as in scaled_dot.

    `forward` is the definition. The kernels get the expanded square instead:
    -||q - k||^2 / (2 sigma^2) = (q.k - ||k||^2 / 2) / sigma^2 - ||q||^2 / (2 sigma^2), and the last
    term is the same for every key of a query, so the softmax over keys drops it. What remains is
    dot-product-shaped with one feature appended: q' = [q, 1], k' = [k, -||k||^2 / 2],
    scale = 1 / sigma^2 — the fused kernel computes it without the (Tq, Tk) distance matrix.
    """

    widens = True

    def __init__(self, sigma: float):
        super().__init__()
        self.sigma = sigma

    @classmethod
    def build(cls, num_heads, head_dim, **options):
        sigma = options.get("gaussian_sigma")
        return cls(head_dim**0.25 if sigma is None else sigma)

    def prepare(self, q, k):
        ones = q.new_ones(q.shape[:-1] + (1,))
        half_norm = -0.5 * (k * k).sum(-1, keepdim=True)
        return torch.cat([q, ones], -1), torch.cat([k, half_norm], -1), self.sigma**-2

    def forward(self, q, k):
        sq = (q * q).sum(-1, keepdim=True) + (k * k).sum(-1)[..., None, :] - 2 * (q @ k.transpose(-2, -1))
        return -sq / (2 * self.sigma**2)


SCORES: dict[str, type[ScoreFunction]] = {
    "scaled_dot": ScaledDot,
    "dot": Dot,
    "cosine": Cosine,
    "additive": Additive,
    "general": General,
    "gaussian": Gaussian,
}


def build_score(name: str, num_heads: int, head_dim: int, **options: Any) -> ScoreFunction:
    """The score function called `name` (see `AttentionConfig.score`), with the config's score
    options (`cosine_temperature`, `additive_dim`, `gaussian_sigma`).

    Raises:
        ValueError: an unknown name, listing the registered ones.
    """
    if name not in SCORES:
        raise ValueError(f"unknown score function {name!r}; choose one of {', '.join(SCORES)}")
    return SCORES[name].build(num_heads, head_dim, **options)
