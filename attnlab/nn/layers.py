"""Feed-forward, norms, residual blocks and the Transformer layer.

Norm placement around a sublayer f (Xiong et al. 2020, https://arxiv.org/abs/2002.04745):

    post (the paper):  x = Norm(x + Dropout(f(x)))
    pre:               x = x + Dropout(f(Norm(x)))            (needs a final norm on the stack)
    both (sandwich, the attention half of NormFormer, Shleifer et al. 2021):
                       x = x + Dropout(Norm'(f(Norm(x))))
"""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import LayerKV

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,
}
# Shazeer 2020, https://arxiv.org/abs/2002.05202; geglu_tanh is T5 v1.1's "gated-gelu" (tanh GELU)
_GATED = {"reglu": "relu", "geglu": "gelu", "geglu_tanh": "gelu_tanh", "swiglu": "silu"}


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """The element-wise function called `name` (gated names give their gate's function)."""
    name = _GATED.get(name, name)
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join([*_ACTIVATIONS, *_GATED])}")
    return _ACTIVATIONS[name]


class FeedForward(nn.Module):
    """Position-wise W2 act(W1 x + b1) + b2; gated variants use W2 (act(W1 x) * W3 x)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True):
        super().__init__()
        self.act = activation_fn(activation)
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias) if activation in _GATED else None
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(h)


def make_norm(kind: str, d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """LayerNorm (gain and bias) or RMSNorm (gain only, Zhang & Sennrich 2019)."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; choose layernorm or rmsnorm")


class Residual(nn.Module):
    """A residual connection around one sublayer, with the norm(s) where `placement` says."""

    def __init__(self, make: Callable[[], nn.Module], placement: str, dropout: float):
        super().__init__()
        if placement not in ("post", "pre", "both"):
            raise ValueError(f"placement={placement!r} is not one of post, pre, both")
        self.placement = placement
        self.norm = make()
        self.post_norm = make() if placement == "both" else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.placement == "post":
            return self.norm(x + self.dropout(sublayer(x)))
        h = sublayer(self.norm(x))
        if self.post_norm is not None:
            h = self.post_norm(h)
        return x + self.dropout(h)


class TransformerLayer(nn.Module):
    """Self-attention, optional cross-attention to a memory, feed-forward; each in a Residual.

    An encoder layer has no cross-attention; a decoder layer of an encoder-decoder has one.
    Causality is the mask's business, not the layer's.
    """

    def __init__(self, self_attn: MultiHeadAttention, ffn: FeedForward, *, make_norm: Callable[[], nn.Module],
                 placement: str = "post", dropout: float = 0.1, cross_attn: MultiHeadAttention | None = None):
        super().__init__()
        self.self_attn = self_attn
        self.self_attn_block = Residual(make_norm, placement, dropout)
        self.cross_attn = cross_attn
        self.cross_attn_block = Residual(make_norm, placement, dropout) if cross_attn is not None else None
        self.ffn = ffn
        self.ffn_block = Residual(make_norm, placement, dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, bias: Tensor | None = None,
                positions: Tensor | None = None, key_positions: Tensor | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None,
                cache: LayerKV | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D). `positions` (B or 1, T) feed rotary/relative schemes
        (`key_positions`: those of every key when a cache holds earlier ones); `memory`
        (B, S, D) with bool `memory_mask` broadcastable to (B, H, T, S)."""
        k_pos = positions if key_positions is None else key_positions
        x = self.self_attn_block(
            x, lambda h: self.self_attn(h, mask=mask, bias=bias, q_pos=positions, k_pos=k_pos, cache=cache)[0])
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this layer has cross-attention: pass the encoder output as `memory`")
            x = self.cross_attn_block(x, lambda h: self.cross_attn(h, memory, mask=memory_mask, cache=cache)[0])
        return self.ffn_block(x, self.ffn)
