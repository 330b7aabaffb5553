"""Normalisation layers, by config name (`ModelConfig.norm`): LayerNorm (gain and bias, Ba et al.
2016) or RMSNorm (gain only, no centring, Zhang & Sennrich 2019)."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

NORMS: dict[str, Callable[[int, float, bool], nn.Module]] = {
    "layernorm": lambda d_model, eps, bias: nn.LayerNorm(d_model, eps=eps, bias=bias),
    "rmsnorm": lambda d_model, eps, bias: nn.RMSNorm(d_model, eps=eps),  # no bias to have
}


def make_norm(kind: str, d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """The norm called `kind` over d_model features.

    Raises:
        ValueError: an unknown kind, listing the registered ones.
    """
    if kind not in NORMS:
        raise ValueError(f"unknown norm {kind!r}; choose one of {', '.join(NORMS)}")
    return NORMS[kind](d_model, eps, bias)


def apply_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """norm(x). A LayerNorm or RMSNorm without hooks is called as the function its `forward` is,
    without nn.Module dispatch: a decoding step goes through a dozen norms, and for one token the
    dispatch costs more than the arithmetic. Any other norm, or one with hooks, is called as a module.
    """
    kind = type(norm)
    if (kind is not nn.LayerNorm and kind is not nn.RMSNorm) or norm._forward_hooks or norm._forward_pre_hooks:
        return norm(x)
    p = norm._parameters
    if kind is nn.LayerNorm:
        return F.layer_norm(x, norm.normalized_shape, p["weight"], p["bias"], norm.eps)
    return F.rms_norm(x, norm.normalized_shape, p["weight"], norm.eps)
