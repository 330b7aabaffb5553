"""Linformer attention (Wang et al. 2020, https://arxiv.org/abs/2006.04768).

Notation: B batch, H heads, T length (<= n = max_len), Dh head_dim, k projected length.

    out = softmax(Q (E K)^T / sqrt(Dh)) (F V),   E, F: (k, n) learned, applied along the sequence

so the score matrix is (T, k) instead of (T, T): time and memory O(T k). For T < n the first T
columns of E and F are used. Padded keys are zeroed before the projection, so padding changes
nothing at real positions' inputs to E K and F V.

Causal use is refused: E K mixes every position into each projected key, so a query would see
the future; the Linformer paper's causal variant is not implemented here. For the same reason
there is no dense equivalent to fall back on under a KV cache, and no (query, key) bias.
Projections are shared by the heads of a layer (`sharing='layer'`, the paper's "headwise
sharing") or one pair per head (`sharing='head'`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.nn.kernels.base import Kernel, KernelSetup, Supports, repeat_kv

SHARINGS = ("layer", "head")


@dataclass
class LinformerOptions:
    """`attention.kernel_options` of kernel `linformer`."""

    k: int = field(default=256, metadata={"min": 1})  # projected length
    max_len: int = field(default=4096, metadata={"min": 1})  # the longest sequence the projections cover
    sharing: str = field(default="layer", metadata={"choices": SHARINGS})

    legacy: ClassVar[dict[str, str]] = {"linformer_k": "k", "linformer_max_len": "max_len",
                                        "linformer_sharing": "sharing"}


class LinformerKernel(Kernel):
    """`attention.kernel='linformer'`: sequence projections E, F held by the kernel.

    Args:
        max_len: n, the longest sequence the projections cover.
        k: projected length.
        num_heads: H (used when sharing='head').
        sharing: `layer` (one E and one F for all heads) or `head` (one pair per head).

    Raises:
        ValueError: for a non-positive size or an unknown sharing.
    """

    name = "linformer"
    supports = Supports(kv_cache=False, any_score=False, score_bias=False, value_term=False, causal=False,
                        cross_attention=False, dense_reference=False, tensor_parallel=False)
    Options = LinformerOptions

    def __init__(self, max_len: int, k: int, num_heads: int, sharing: str = "layer"):
        super().__init__()
        for name, value in (("max_len", max_len), ("k", k), ("num_heads", num_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if sharing not in SHARINGS:
            raise ValueError(f"sharing={sharing!r} is not one of {', '.join(SHARINGS)}")
        self.max_len, self.k, self.sharing = max_len, k, sharing
        shape = (k, max_len) if sharing == "layer" else (num_heads, k, max_len)
        self.e_proj = nn.Parameter(torch.randn(shape) * k**-0.5)  # N(0, 1/k), as a random projection
        self.f_proj = nn.Parameter(torch.randn(shape) * k**-0.5)

    @classmethod
    def build(cls, options: LinformerOptions, setup: KernelSetup) -> "LinformerKernel":
        return cls(options.max_len, options.k, setup.num_heads, options.sharing)

    def project(self, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """k, v (B, H, T, Dh) -> E K, F V (B, H, k, Dh); keys with mask False are zeroed first.

        Raises:
            ValueError: when T > max_len or the mask is not a key mask (B, 1, 1, T).
        """
        T = k.shape[2]
        if T > self.max_len:
            raise ValueError(f"linformer projections cover attention.kernel_options.max_len={self.max_len} "
                             f"positions, got T = {T}")
        if mask is not None:
            if mask.dim() != 4 or mask.shape[-2] != 1 or mask.shape[-1] != T:
                raise ValueError(f"linformer takes a key padding mask (B, 1, 1, T), got {tuple(mask.shape)}")
            keep = mask.transpose(-1, -2).to(k.dtype)  # (B, 1 or H, T, 1)
            k, v = k * keep, v * keep
        e = self.e_proj[..., :T].to(k.dtype)  # (k, T) or (H, k, T)
        f = self.f_proj[..., :T].to(v.dtype)
        if self.sharing == "head":
            e, f = e[None], f[None]  # broadcast over the batch
        return torch.matmul(e, k), torch.matmul(f, v)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        """softmax(scale * Q (E K)^T) (F V): q (B, H, T, Dh) -> ((B, H, T, Dh), weights (B, H, T, k) or None)."""
        if causal:
            raise ValueError("attention.kernel='linformer' is bidirectional only (E K mixes future positions "
                             "into every key); use it in an encoder")
        if bias is not None:
            raise ValueError("attention.kernel='linformer' cannot add a position bias over projected keys; "
                             "use position.scheme none, sinusoidal, learned, binary or rotary")
        k, v = repeat_kv(k, v, q.shape[1])
        kp, vp = self.project(k, v, mask)
        scores = torch.matmul(q, kp.transpose(-1, -2)) * scale  # (B, H, T, k)
        weights = torch.softmax(scores, dim=-1)
        dropped = nn.functional.dropout(weights, dropout_p) if dropout_p else weights
        return torch.matmul(dropped, vp), (weights if need_weights else None)
