"""Optimizers with weight-decay groups, and learning-rate schedules.

Weight decay applies to the weight matrices of linear layers only: norms, biases and
embedding tables (token, position, segment, relative-position) go to a no-decay group, as in
GPT-2/BERT practice (Loshchilov & Hutter 2019, https://arxiv.org/abs/1711.05101).

Schedules (multipliers of the base learning rate, s = step counted from 1):

    constant:  1 (after an optional linear warmup)
    cosine:    s / w during warmup, then min + (1 - min) * (1 + cos(pi * progress)) / 2
    noam:      d_model^-0.5 * min(s^-0.5, s * w^-1.5)     (Vaswani et al. 2017, eq. 3;
               https://arxiv.org/abs/1706.03762 — set optim.lr = 1 for the paper's rate)
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn


# modules whose parameters are norms' gains or lookup tables (positions, relative biases)
_NO_DECAY_MODULES = ("Norm", "Position", "Embedding", "RelativeBias")


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split parameters into a decayed and a not-decayed group.

    No decay: every parameter of an `nn.Embedding`, a norm (LayerNorm, RMSNorm) or a position
    table (learned positions, Shaw relative tables, T5's relative bias), every bias, and any
    other parameter with fewer than 2 dimensions. Shared (tied) parameters appear once, in the group of their first owner that
    says "no decay" (a tied output projection shares the embedding's group).

    Returns:
        `[{"params": [...], "weight_decay": wd, "names": [...]}, {"params": [...],
        "weight_decay": 0.0, "names": [...]}]`.
    """
    no_decay: dict[int, str] = {}
    for module_name, module in model.named_modules():
        kind = type(module).__name__
        is_table = isinstance(module, nn.Embedding) or any(k in kind for k in _NO_DECAY_MODULES)
        for name, p in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if is_table or name.endswith("bias") or p.dim() < 2:
                no_decay.setdefault(id(p), full)
    decay, keep, decay_names, keep_names = [], [], [], []
    for name, p in model.named_parameters():  # named_parameters lists each shared tensor once
        if not p.requires_grad:
            continue
        if id(p) in no_decay:
            keep.append(p)
            keep_names.append(name)
        else:
            decay.append(p)
            decay_names.append(name)
    return [{"params": decay, "weight_decay": weight_decay, "names": decay_names},
            {"params": keep, "weight_decay": 0.0, "names": keep_names}]


def build_optimizer(model: nn.Module, name: str = "adamw", lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.99),
                    eps: float = 1e-8, weight_decay: float = 0.1, *, groups: list[dict] | None = None
                    ) -> torch.optim.Optimizer:
    """AdamW (decoupled decay) or Adam (L2 decay added to the gradient) over `decay_groups`
    (or the given `groups`, e.g. layer-wise lr decay), with PyTorch's fused implementation where
    the parameters allow it (else foreach).

    Args:
        groups: parameter groups with their own "weight_decay" and an optional "lr_scale"
            (the group's learning rate relative to `lr`, kept by `Schedule`); bookkeeping keys
            ("names", "depth") are dropped.

    Raises:
        ValueError: unknown name.
    """
    if groups is None:
        groups = decay_groups(model, weight_decay)
    keep = ("params", "weight_decay", "lr_scale")
    groups = [{k: v for k, v in g.items() if k in keep} for g in groups if g["params"]]
    for g in groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    if name not in ("adamw", "adam"):
        raise ValueError(f"optimizer name={name!r} is not one of adamw, adam")
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return cls(groups, lr=lr, betas=betas, eps=eps, **adam_kernel(p for g in groups for p in g["params"]))


def adam_kernel(params) -> dict[str, bool]:
    """The Adam(W) keyword choosing its implementation: PyTorch's fused kernel (one pass over each
    parameter; about 7x the foreach step on a CPU core for a GPT-2-small-sized model) when every
    parameter allows it (plain floating-point tensors on a device it supports), else foreach."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = _get_fused_kernels_supported_devices()
    fused = all(type(p) in (torch.Tensor, nn.Parameter) and p.is_floating_point() and p.device.type in devices
                for p in params)
    return {"fused": True} if fused else {"foreach": True}


def noam_factor(step: int, d_model: int, warmup_steps: int) -> float:
    """d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), with step counted from 1."""
    s = max(step, 1)
    return d_model ** -0.5 * min(s ** -0.5, s * warmup_steps ** -1.5)


def lr_factor(name: str, step: int, *, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.1,
              d_model: int = 512) -> float:
    """The multiplier of the base learning rate at optimisation step `step` (0-based: the
    factor applied to the update that takes the model from step to step + 1).

    Raises:
        ValueError: unknown schedule name.
    """
    s = step + 1
    if name == "noam":
        return noam_factor(s, d_model, warmup_steps)
    warm = s / warmup_steps if warmup_steps and s <= warmup_steps else 1.0
    if name == "constant":
        return warm
    if name == "cosine":
        if warmup_steps and s <= warmup_steps:
            return warm
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    raise ValueError(f"schedule name={name!r} is not one of constant, cosine, noam")


class Schedule:
    """Sets each group's learning rate to `lr_scale * base_lr * lr_factor(...)` before every
    step (`lr_scale`: the group's own factor, e.g. layer-wise decay; 1 when absent).

    Its state is the step count and the settings (JSON-serialisable), so a resumed run continues
    exactly; one resumed with other settings (a larger train.max_steps stretches a cosine) is
    warned of when that changes the learning rate.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, name: str, base_lr: float, *, total_steps: int,
                 warmup_steps: int = 0, min_lr_ratio: float = 0.1, d_model: int = 512):
        lr_factor(name, 0, total_steps=total_steps, warmup_steps=warmup_steps, d_model=d_model)  # validates name
        self.optimizer, self.name, self.base_lr = optimizer, name, base_lr
        self.kwargs = dict(total_steps=total_steps, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                           d_model=d_model)
        self.step_count = 0
        self.apply()

    def lr(self, step: int | None = None) -> float:
        step = self.step_count if step is None else step
        return self.base_lr * lr_factor(self.name, step, **self.kwargs)

    def apply(self) -> None:
        lr = self.lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def step(self) -> None:
        self.step_count += 1
        self.apply()

    def state_dict(self) -> dict:
        return {"name": self.name, "step_count": self.step_count, "base_lr": self.base_lr, **self.kwargs}

    def load_state_dict(self, state: dict) -> None:
        """Go on from `state`'s step.

        Raises:
            ValueError: the checkpoint used another schedule name.
        Warns:
            UserWarning: the settings differ from the checkpoint's and move the learning rate at
                this step (a schedule is a function of them: the run's curve changes from here).
        """
        if state.get("name") != self.name:
            raise ValueError(f"checkpoint schedule {state.get('name')!r} differs from the configured {self.name!r}")
        self.step_count = int(state["step_count"])
        saved = {key: state[key] for key in ("base_lr", *self.kwargs) if key in state}  # (older checkpoints: none)
        changed = {key: (value, self.base_lr if key == "base_lr" else self.kwargs[key]) for key, value in saved.items()
                   if value != (self.base_lr if key == "base_lr" else self.kwargs[key])}
        if changed:
            before = saved.get("base_lr", self.base_lr) * lr_factor(
                self.name, self.step_count, **{**self.kwargs, **{k: v for k, v in saved.items() if k != "base_lr"}})
            now = self.lr()
            if not math.isclose(before, now, rel_tol=1e-9, abs_tol=0.0):
                names = {"base_lr": "optim.lr", "total_steps": "train.max_steps", "warmup_steps":
                         "schedule.warmup_steps", "min_lr_ratio": "schedule.min_lr_ratio", "d_model": "model.d_model"}
                listed = ", ".join(f"{names[k]} {old!r} -> {new!r}" for k, (old, new) in changed.items())
                warnings.warn(f"the {self.name} schedule's settings differ from the checkpoint's ({listed}): the "
                              f"learning rate at step {self.step_count} goes from {before:.3g} to {now:.3g} and "
                              "follows the new curve from here", stacklevel=2)
        self.apply()
