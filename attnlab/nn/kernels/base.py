"""What every attention kernel is: one call, a declaration of what it supports, its options.

Notation: B batch, H query heads, G key/value heads (G divides H), Tq/Tk query/key lengths,
Dh head_dim.

The shared call, after the score function prepared q and k (`ScoreFunction.prepare`):

    kernel(q (B, H, Tq, Dh), k (B, G, Tk, Dh), v (B, G, Tk, Dh), *, scale, mask, bias, dropout_p,
           causal, need_weights) -> (out (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None)

computes softmax(scale q k^T + bias, masked) v or an approximation of it. `mask` is bool (True =
may attend), `bias` additive float scores, both broadcastable to (B, H, Tq, Tk); `causal` says
the call is a decoder's self-attention (kernels whose pattern applies causality read it; the
others leave causality to the mask).

A kernel declares what it can do in `supports` (`Supports`); `MultiHeadAttention`, the config
checks, the cost counters and tensor parallelism read those flags, never a kernel's name. Its
options (`Options`, a dataclass in the kernel's own file) are the `attention.kernel_options` of a
config: plain data, each field's `metadata` saying what is allowed (`min`, `choices`,
`token_id`), checked by `attnlab.config`; `legacy` maps the flat `attention.*` field names of
older configs onto them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Supports:
    """What a kernel can do. A call it cannot do takes the dense reference path instead (the eager
    computation with `dense_mask` as a bool mask) where `dense_reference` allows, else it fails."""

    kv_cache: bool = True  # keys beyond the queries (a KV cache): else the dense reference runs
    weights: bool = True  # returns the weights when asked: else the dense reference runs
    any_score: bool = True  # any score function; False: dot-product-shaped ones only (scale q'.k')
    wide_qk: bool = True  # q', k' may have more features than v (the Gaussian score appends one)
    score_bias: bool = True  # an additive (query, key) bias: ALiBi, T5, Shaw's key term
    value_term: bool = True  # Shaw et al.'s relative term on the values (computed from the weights)
    causal: bool = True  # a decoder's self-attention; False: encoders only
    cross_attention: bool = True  # False: self-attention only; cross-attention layers then take `auto`
    grouped_kv: bool = True  # takes G < H key/value heads; else they are repeated to H first
    pattern: bool = False  # a sparse pattern (`dense_mask`) that applies causality itself: no (T, T) mask
    dense_reference: bool = True  # the eager computation (under `dense_mask`) is the same function
    fused: bool = False  # PyTorch's fused scaled_dot_product_attention
    materializes_weights: bool = False  # holds the (B, H, Tq, Tk) weights in memory (cost counters)
    tensor_parallel: bool = True  # its heads may be split over tensor-parallel ranks


@dataclass
class NoOptions:
    """The options of a kernel that has none."""

    legacy: ClassVar[dict[str, str]] = {}


@dataclass(frozen=True)
class KernelSetup:
    """What a layer tells its kernel when building it.

    Attributes:
        num_heads: H.
        head_dim: Dh.
        layer: the layer's index in its stack (kernels that draw a random pattern per layer).
        token_ids: the stack's `TokenIds`, for kernels whose options ask for the input ids.
        num_kv_heads: G, the key/value heads (grouped-query attention); None = H. A kernel with
            per-head parameters over keys or values (a convolution compressing them) holds G sets.
    """

    num_heads: int
    head_dim: int
    layer: int = 0
    token_ids: "TokenIds | None" = None
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        g = self.num_kv_heads
        if g is not None and (not isinstance(g, int) or isinstance(g, bool) or g < 1 or self.num_heads % g):
            raise ValueError(f"num_kv_heads must be a positive integer dividing num_heads={self.num_heads}, "
                             f"got {g!r}")

    @property
    def kv_heads(self) -> int:
        """G: num_kv_heads, or H when not given."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@dataclass(frozen=True)
class KernelCost:
    """What one call of a kernel costs (`Kernel.cost`; read by `attnlab.inspect.cost`).

    Attributes:
        flops: matrix-multiplication FLOPs, 2 per multiply-add (as torch.utils.flop_counter counts).
        activations: elements the call holds besides its (B, H, Tq, Dv) output: the weights it
            materialises, compressed keys and values.
    """

    flops: int
    activations: int


class TokenIds:
    """The (B, T) input ids of a stack's current forward, set by a forward pre-hook on its
    embeddings (`hook`) before its layers run, for kernels that pick tokens by id."""

    def __init__(self):
        self.value: Tensor | None = None

    def hook(self, module: nn.Module, args: tuple) -> None:
        self.value = args[0]


class Kernel(nn.Module):
    """Base of the attention kernels: see the module docstring for the call.

    Subclasses set `name` (their registry key), `supports`, `Options`, and implement `forward`;
    sparse ones also `dense_mask`. `build` makes one from its options; `needs_token_ids` says
    whether it wants the stack's `TokenIds`.
    """

    name: ClassVar[str] = ""
    supports: ClassVar[Supports] = Supports()
    Options: ClassVar[type] = NoOptions

    @classmethod
    def build(cls, options: Any, setup: KernelSetup) -> "Kernel":
        """The kernel of one layer from its `Options` (default: takes none)."""
        return cls()

    @staticmethod
    def needs_token_ids(options: Any) -> bool:
        """Whether a stack must record its input ids (`TokenIds`) for this kernel."""
        return False

    def resolve(self, *, fused_score: bool, value_term: bool) -> "Kernel":
        """The kernel that runs for a score (dot-product-shaped or not) and a values term; only a
        kernel that picks another (`auto`) returns anything but itself."""
        return self

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor | None:
        """The kernel's pattern over T self-attention positions as a bool (T, T) or (B, 1, T, T)
        mask (True = may attend); None: every key (a dense kernel)."""
        return None

    def cost(self, t_q: int, t_k: int, *, num_heads: int, num_kv_heads: int, qk_dim: int, v_dim: int,
             causal: bool) -> KernelCost:
        """The cost of one call on one sequence: Tq queries over Tk keys, H query heads, G key/value
        heads, q'/k' of qk_dim features (a score may widen them), values of v_dim.

        The dense default: 2 H Tq Tk qk_dim (q k^T) + 2 H Tq Tk v_dim (weights v), holding the
        H Tq Tk weights when `supports.materializes_weights` (a fused kernel holds none). A sparse
        kernel that computes less overrides it."""
        flops = 2 * num_heads * t_q * t_k * (qk_dim + v_dim)
        return KernelCost(flops, num_heads * t_q * t_k if self.supports.materializes_weights else 0)

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


def repeat_kv(k: Tensor, v: Tensor, num_heads: int) -> tuple[Tensor, Tensor]:
    """k, v (B, G, T, Dh) -> (B, H, T, Dh): each key/value head serves H/G query heads."""
    if k.shape[1] == num_heads:
        return k, v
    n = num_heads // k.shape[1]
    return k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1)
