"""Mixture-of-experts feed-forward (Shazeer et al. 2017, https://arxiv.org/abs/1701.06538): E
feed-forward experts, a router that sends each token to k of them, the token's output the
gate-weighted sum of theirs.

Notation: N tokens (batch x length, flattened), D d_model, E experts, k experts per token.

    logits = x W_g                                        (N, E)
    noisy  = logits + eps * softplus(x W_noise)           training only, eps ~ N(0, 1)  (noisy top-k)
    top-k of noisy -> experts e_1..e_k, gates = softmax over those k values
    y      = sum_j gates_j * FFN_{e_j}(x)

Load balance (the Switch Transformer form, Fedus et al. 2021, https://arxiv.org/abs/2101.03961):
    balance = E * sum_e f_e * P_e
where f_e is the fraction of the N k routing assignments that chose expert e and P_e the mean
over tokens of softmax(logits)_e (the router's probability, without noise). It is 1 when both are
uniform and grows as the router concentrates; the training loss adds `moe.balance_weight` times
its mean over the model's MoE layers (`balance_loss`).

Capacity (training only): each expert takes at most ceil(capacity_factor * N k / E) assignments,
first come first served in token order; the assignments past it are dropped (that expert adds
nothing for the token, whose residual path carries it) and counted in `last_stats`. At
inference every token reaches its k experts, so a step of cached decoding equals the full
forward whatever else is in the batch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.hook_points import HookPoint, tap


class MoEFeedForward(nn.Module):
    """E feed-forward experts behind a top-k router (see the module docstring).

    Args:
        make_expert: () -> one expert (an `attnlab.nn.FeedForward`), called E times.
        d_model: D.
        num_experts: E >= 2.
        top_k: k in [1, E].
        capacity_factor: assignments an expert takes per its fair share in training; None = no limit.
        noisy: add the learned, input-dependent gating noise in training.
    """

    def __init__(self, make_expert: Any, d_model: int, num_experts: int, top_k: int = 2,
                 capacity_factor: float | None = 1.25, noisy: bool = True):
        super().__init__()
        if num_experts < 2 or not 1 <= top_k <= num_experts:
            raise ValueError(f"need num_experts >= 2 and 1 <= top_k <= num_experts, got {num_experts}, {top_k}")
        self.experts = nn.ModuleList(make_expert() for _ in range(num_experts))
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.noise = nn.Linear(d_model, num_experts, bias=False) if noisy else None
        self.top_k, self.capacity_factor = top_k, capacity_factor
        # hook points over the N tokens of a call, in row-major order: the router's logits (N, E) before
        # any noise, and the experts each token is sent to (N, k) (a replaced choice keeps the gates' values)
        self.hook_router_logits, self.hook_experts = HookPoint(), HookPoint()
        self.balance: Tensor | None = None  # the balance term of the last forward
        self.last_stats: dict[str, int] = {"assignments": 0, "dropped": 0}

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (N, D) -> (experts (N, k), gates (N, k), router probabilities (N, E) without noise)."""
        logits = tap(self.hook_router_logits, self.router(x).float())
        noisy = logits
        if self.training and self.noise is not None:
            noisy = logits + torch.randn_like(logits) * F.softplus(self.noise(x).float())
        top, experts = noisy.topk(self.top_k, dim=-1)
        return tap(self.hook_experts, experts), top.softmax(-1), logits.softmax(-1)

    def capacity(self, n_tokens: int) -> int | None:
        """Assignments one expert takes from a batch of n_tokens in training; None = all."""
        if not self.training or self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * n_tokens * self.top_k / self.num_experts)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        experts, gates, probs = self.route(flat)
        E, limit = self.num_experts, self.capacity(flat.shape[0])
        chosen = F.one_hot(experts, E).sum(1)  # (N, E) 0/1: token n sent to e
        self.balance = E * ((chosen.sum(0).float() / experts.numel()) * probs.mean(0)).sum()
        out = torch.zeros_like(flat)
        dropped = 0
        for e, expert in enumerate(self.experts):
            rows, slot = (experts == e).nonzero(as_tuple=True)  # token order
            if limit is not None and rows.numel() > limit:
                dropped += rows.numel() - limit
                rows, slot = rows[:limit], slot[:limit]
            if rows.numel():
                y = expert(flat[rows]) * gates[rows, slot, None].to(flat.dtype)
                out.index_add_(0, rows, y)
        self.last_stats = {"assignments": experts.numel(), "dropped": dropped}
        return out.view(shape)


def balance_loss(model: nn.Module) -> Tensor | None:
    """Mean balance term over the MoE layers of `model` from their last forward, or None without any."""
    terms = [m.balance for m in model.modules() if isinstance(m, MoEFeedForward) and m.balance is not None]
    return torch.stack(terms).mean() if terms else None


__all__ = ["MoEFeedForward", "balance_loss"]
