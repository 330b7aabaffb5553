"""Memory-compressed attention and the DMCA decoder (Liu et al. 2018, "Generating Wikipedia by
Summarizing Long Sequences", https://arxiv.org/abs/1801.10198, section 4.2.3).

Notation: B batch, H query heads, G key/value heads (G divides H; grouped-query attention), Tq/Tk
query/key lengths, Dh head_dim, c compression (kernel size = stride), NB = ceil(Tk / c)
compressed blocks, b local block size.

Keys and values are compressed along the sequence by a learned strided convolution, one per
key/value head over the head's features: block j of positions [c j, c j + c - 1] becomes

    k~_{g,j} = sum_r W_k[g, r] k_{g, c j + r} + b_k[g]       (W: (G, c, Dh, Dh), b: (G, Dh); v alike)

and the queries attend to the NB compressed keys and values of their key/value head (query head h
reads head g = h // (H / G), as in grouped-query attention): softmax(scale q_h k~_g^T) v~_g, a
(Tq, NB) score matrix, c times fewer keys. The last block, when c does not divide Tk, is padded
with zeros. With G < H the compressed memory is G heads, shared as the keys and values are.

Causality (a decoder): query i may attend to block j only if c j + c - 1 <= i (no compressed
block holds its future), so the first c - 1 queries, which see no complete block, get zeros. In
an encoder every block is visible. Under a KV cache the compressed keys and values are recomputed
from all Tk cached keys at each call (exact: the blocks a query sees are those of the full
forward; O(Tk Dh^2) per head and step).

Masks: a key no query may see (padding) is zeroed before the compression, so a block's
compressed key and value depend on its real positions only; query i sees block j when its mask
row allows at least one position of the block (and causality does). With right padding this is
padding-invariant: real positions' outputs do not depend on the padded tokens. A (query, key)
bias (ALiBi, T5) has no place over compressed keys and is refused.

DMCA (`alternate=True`): the layers with an even index (`KernelSetup.layer`) attend locally in
blocks of b positions instead (causal within a block for a decoder; `block_diagonal`), the odd
ones to the compressed memory, as in the paper's decoder. The local layers hold no parameters.

A kernel built without `KernelSetup.num_kv_heads` holds H convolutions (the layout of checkpoints
written before it was passed): given G < H key/value heads, it repeats them to H first and each
query head compresses its own copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.kernels.base import Kernel, KernelCost, KernelSetup, Supports, repeat_kv
from attnlab.nn.kernels.block_diagonal import block_diagonal_attention, block_diagonal_flops, block_pattern
from attnlab.nn.kernels.eager import eager_attention


@dataclass
class MemoryCompressedOptions:
    """`attention.kernel_options` of kernel `memory_compressed`."""

    compression: int = field(default=3, metadata={"min": 1})  # c: the convolution's kernel size and stride
    block_size: int = field(default=256, metadata={"min": 1})  # b: positions per block of the local layers
    alternate: bool = True  # even layers local, odd layers compressed (DMCA); False: every layer compressed

    legacy: ClassVar[dict[str, str]] = {}


class MemoryCompressedKernel(Kernel):
    """`attention.kernel='memory_compressed'`: see the module docstring.

    Args:
        num_heads: H.
        head_dim: Dh.
        compression: c >= 1.
        block_size: b >= 1, of the local layers.
        local: this layer attends locally in blocks (DMCA's even layers) instead.
        num_kv_heads: G, the key/value heads, each with its own convolutions; None = H.

    Raises:
        ValueError: for a non-positive size, or num_kv_heads not dividing num_heads.
    """

    name = "memory_compressed"
    # native KV cache (the compressed memory is recomputed; no dense equivalent to fall back on), weights
    # over the compressed blocks, dot-product-shaped scores as wide as v, no bias, self-attention only;
    # takes the G key/value heads as they are (compressed per head, then shared by H / G query heads)
    supports = Supports(any_score=False, wide_qk=False, score_bias=False, value_term=False, cross_attention=False,
                        grouped_kv=True, pattern=True, dense_reference=False, tensor_parallel=False)
    Options = MemoryCompressedOptions

    def __init__(self, num_heads: int, head_dim: int, compression: int = 3, block_size: int = 256,
                 local: bool = False, num_kv_heads: int | None = None):
        super().__init__()
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for name, value in (("num_heads", num_heads), ("head_dim", head_dim), ("compression", compression),
                            ("block_size", block_size), ("num_kv_heads", kv_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if num_heads % kv_heads:
            raise ValueError(f"num_kv_heads={kv_heads} must divide num_heads={num_heads}")
        self.compression, self.block_size, self.local = compression, block_size, local
        self.num_heads, self.num_kv_heads = num_heads, kv_heads
        if local:
            return
        bound = (compression * head_dim) ** -0.5  # nn.Conv1d's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        shape = (kv_heads, compression, head_dim, head_dim)
        self.k_conv_weight = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.k_conv_bias = nn.Parameter(torch.empty(kv_heads, head_dim).uniform_(-bound, bound))
        self.v_conv_weight = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.v_conv_bias = nn.Parameter(torch.empty(kv_heads, head_dim).uniform_(-bound, bound))

    @classmethod
    def build(cls, options: MemoryCompressedOptions, setup: KernelSetup) -> "MemoryCompressedKernel":
        local = options.alternate and setup.layer % 2 == 0
        return cls(setup.num_heads, setup.head_dim, options.compression, options.block_size, local=local,
                   num_kv_heads=setup.num_kv_heads)

    def compress(self, k: Tensor, v: Tensor, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """k, v (B, G, Tk, Dh) -> compressed (B, G, NB, Dh) each, G = the heads holding convolutions;
        keys with keep False (a bool broadcastable to (B, G, Tk)) are zeroed first."""
        if keep is not None:
            keep = keep[..., None].to(k.dtype)
            k, v = k * keep, v * keep
        return (_strided_conv(k, self.k_conv_weight, self.k_conv_bias),
                _strided_conv(v, self.v_conv_weight, self.v_conv_bias))

    def visible(self, t_q: int, t_k: int, causal: bool, mask: Tensor | None,
                device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """(blocks each query may attend to (B', H', Tq, NB) bool or None = all, keys to keep
        (B', H', Tk) bool or None = all) for the last Tq of Tk positions."""
        c, nb = self.compression, math.ceil(t_k / self.compression)
        allowed = keep = None
        if causal:
            i = torch.arange(t_k - t_q, t_k, device=device)[:, None]
            allowed = c * torch.arange(nb, device=device)[None, :] + c - 1 <= i  # (Tq, NB)
        if mask is not None:
            if mask.dtype != torch.bool:
                raise ValueError(f"mask must be bool (True = may attend), got {mask.dtype}")
            if mask.dim() > 4 or mask.shape[-1] not in (1, t_k) or (mask.dim() > 1 and mask.shape[-2] not in (1, t_q)):
                raise ValueError(f"mask must broadcast to (B, H, Tq, Tk) with Tq = {t_q}, Tk = {t_k}, got "
                                 f"{tuple(mask.shape)}")
            m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            m = m.expand(*m.shape[:3], t_k)
            keep = m.any(-2)  # a key no query may see is padding
            seen = F.pad(m, (0, nb * c - t_k)).unflatten(-1, (nb, c)).any(-1)  # (B', H', Tq | 1, NB)
            allowed = seen if allowed is None else seen & allowed
        return allowed, keep

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        """q (B, H, Tq, Dh), the last Tq of k's Tk positions -> ((B, H, Tq, Dh), weights or None):
        (B, H, Tq, NB) over the compressed blocks, (B, H, Tq, Tk) in a local layer."""
        H = q.shape[1]
        if self.local:
            k, v = repeat_kv(k, v, H)
            return self._local(q, k, v, scale, mask, bias, dropout_p, causal, need_weights)
        if bias is not None:
            raise ValueError("attention.kernel='memory_compressed' cannot add a position bias over compressed "
                             "keys; use position.scheme none, sinusoidal, learned, binary or rotary")
        G = self.k_conv_weight.shape[0]
        if k.shape[1] != G:
            if G != H or H % k.shape[1]:
                raise ValueError(f"memory_compressed holds convolutions for {G} key/value heads, got keys of "
                                 f"{k.shape[1]} heads for {H} query heads")
            k, v = repeat_kv(k, v, H)  # built without num_kv_heads: one convolution per query head
        allowed, keep = self.visible(q.shape[2], k.shape[2], causal, mask, q.device)
        if keep is not None and keep.shape[1] not in (1, G):  # a per-query-head mask: a group keeps a key
            keep = keep.unflatten(1, (G, keep.shape[1] // G)).any(2)  # that any of its query heads may see
        kc, vc = repeat_kv(*self.compress(k, v, keep), H)  # (B, H, NB, Dh): each group reads its head's
        scores = torch.matmul(q, kc.transpose(-1, -2)) * scale  # (B, H, Tq, NB)
        out, weights = eager_attention(scores, vc, mask=allowed, dropout_p=dropout_p)  # no block: zeros
        return out, (weights if need_weights else None)

    def _local(self, q, k, v, scale, mask, bias, dropout_p, causal, need_weights):
        """A DMCA local layer: attention within blocks of `block_size` positions."""
        if not need_weights:
            return block_diagonal_attention(q, k, v, block=self.block_size, causal=causal, scale=scale, mask=mask,
                                            bias=bias, dropout_p=dropout_p), None
        pattern = block_pattern(q.shape[2], k.shape[2], self.block_size, causal, device=q.device)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        return eager_attention(scores, v, mask=pattern if mask is None else mask & pattern, dropout_p=dropout_p)

    def cost(self, t_q, t_k, *, num_heads, num_kv_heads, qk_dim, v_dim, causal) -> KernelCost:
        """A local layer: attention within blocks, 2 H NB b^2 (qk_dim + v_dim). A compressed one: the two
        strided convolutions, 2 x 2 G' NB c Dh^2 (G' = the heads holding convolution weights), then
        attention over the NB = ceil(Tk / c) compressed blocks, 2 H Tq NB (qk_dim + v_dim), c times
        less than dense; it holds the H Tq NB weights and the 2 G' NB Dh compressed keys and values."""
        if self.local:
            return KernelCost(block_diagonal_flops(t_q, t_k, self.block_size, num_heads, qk_dim, v_dim), 0)
        c, nb = self.compression, math.ceil(t_k / self.compression)
        g = self.k_conv_weight.shape[0]
        conv = 2 * 2 * g * nb * c * v_dim * v_dim
        return KernelCost(conv + 2 * num_heads * t_q * nb * (qk_dim + v_dim),
                          num_heads * t_q * nb + 2 * g * nb * v_dim)

    def extra_repr(self) -> str:
        if self.local:
            return f"name={self.name!r}, local, block_size={self.block_size}"
        return f"name={self.name!r}, compression={self.compression}, kv_heads={self.k_conv_weight.shape[0]}"


def _strided_conv(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """x (B, H, T, Dh) -> (B, H, ceil(T / c), Dh): per head, the convolution of kernel size and
    stride c over positions (the last block padded with zeros), weight (H, c, Dh, Dh), bias (H, Dh)."""
    B, H, T, Dh = x.shape
    c = weight.shape[1]
    nb = math.ceil(T / c)
    blocks = F.pad(x, (0, 0, 0, nb * c - T)).reshape(B, H, nb, c * Dh)  # row r Dh + d: position r, feature d
    return torch.matmul(blocks, weight.reshape(H, c * Dh, Dh).to(x.dtype)) + bias.to(x.dtype)[:, None, :]
