"""Score functions f(q, k): how well each query matches each key.

Notation: q (B, H, Tq, Dh), k (B, H, Tk, Dh) -> scores (B, H, Tq, Tk).

Dot-product-shaped scores (`fused = True`) are written as scale * q' . k' for some
transformed q', k', so PyTorch's fused `scaled_dot_product_attention` can compute them
without materialising the T x T matrix; the others need the eager kernel.

`SCORES` maps the config name (`attention.score`) to the class; each class builds itself from
the layer's sizes and the config's score options (`build`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ScoreFunction(nn.Module):
    """Base: f(q, k) = scale * q' . k' with (q', k', scale) from `prepare`."""

    fused = True

    @classmethod
    def build(cls, num_heads: int, head_dim: int, *, cosine_temperature: float = 0.1,
              additive_dim: int | None = None) -> "ScoreFunction":
        """One layer's score function from its sizes and the score options (default: takes none)."""
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
    def build(cls, num_heads, head_dim, *, cosine_temperature=0.1, additive_dim=None):
        return cls(cosine_temperature)

    def prepare(self, q, k):
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1), 1.0 / self.temperature


class General(ScoreFunction):
    """q W_h k^T with a learned (Dh, Dh) matrix per head (Luong et al. 2015, "general").
    W starts as I / sqrt(Dh), so an untrained model scores exactly like scaled_dot."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(num_heads, 1, 1) * head_dim**-0.5)

    @classmethod
    def build(cls, num_heads, head_dim, *, cosine_temperature=0.1, additive_dim=None):
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
    def build(cls, num_heads, head_dim, *, cosine_temperature=0.1, additive_dim=None):
        return cls(num_heads, head_dim, additive_dim or head_dim)

    def forward(self, q, k):
        a = q @ self.w_q.to(q.dtype)  # (B, H, Tq, A)
        b = k @ self.w_k.to(k.dtype)  # (B, H, Tk, A)
        hidden = torch.tanh(a[:, :, :, None, :] + b[:, :, None, :, :])  # (B, H, Tq, Tk, A)
        return (hidden * self.v[None, :, None, None, :].to(q.dtype)).sum(-1)


SCORES: dict[str, type[ScoreFunction]] = {
    "scaled_dot": ScaledDot,
    "dot": Dot,
    "cosine": Cosine,
    "additive": Additive,
    "general": General,
}


def build_score(name: str, num_heads: int, head_dim: int, *, cosine_temperature: float = 0.1,
                additive_dim: int | None = None) -> ScoreFunction:
    """The score function called `name` (see `AttentionConfig.score`).

    Raises:
        ValueError: an unknown name, listing the registered ones.
    """
    if name not in SCORES:
        raise ValueError(f"unknown score function {name!r}; choose one of {', '.join(SCORES)}")
    return SCORES[name].build(num_heads, head_dim, cosine_temperature=cosine_temperature, additive_dim=additive_dim)
