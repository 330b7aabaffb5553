"""Local attention in blocks (Liu et al. 2018, "Generating Wikipedia by Summarizing Long
Sequences", https://arxiv.org/abs/1801.10198, section 4.2.3).

Notation: B batch, H heads, T length, Dh head_dim, b block size.

The sequence is cut into blocks of b positions and each query attends within its own block only
(causal within it for a decoder): query i sees the keys j with j // b == i // b (and j <= i).
Blocks are computed independently, as one batched call of PyTorch's fused attention over them
(`attnlab.nn.kernels.block_diagonal`): time O(T b Dh) and no T x T matrix. A query in a
decoder sees between 1 and b keys (none from the previous block, however close).

Padding masks, any bool mask and position biases (ALiBi, T5) are cut into their diagonal
blocks. Under a KV cache the kernel reads only the keys of the new queries' blocks: the query at
position i (of Tk keys so far) sees the keys in [b (i // b), i]. The weights, when asked for,
come from the dense reference (the eager computation under `dense_mask`, the same function).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from attnlab.nn.kernels.base import Kernel, KernelCost, KernelSetup, Supports
from attnlab.nn.kernels.block_diagonal import block_diagonal_attention, block_diagonal_flops, block_pattern


@dataclass
class LocalBlockOptions:
    """`attention.kernel_options` of kernel `local_block`."""

    block_size: int = field(default=256, metadata={"min": 1})  # positions per block

    legacy: ClassVar[dict[str, str]] = {}


class LocalBlockKernel(Kernel):
    """`attention.kernel='local_block'`: attention within blocks of `block_size` positions.

    Args:
        block_size: b >= 1.

    Raises:
        ValueError: for a block size < 1.
    """

    name = "local_block"
    # self-attention only, dot-product-shaped scores (fused per block); weights from the dense reference
    supports = Supports(weights=False, any_score=False, value_term=False, cross_attention=False, grouped_kv=False,
                        pattern=True, tensor_parallel=False)
    Options = LocalBlockOptions

    def __init__(self, block_size: int):
        super().__init__()
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.block_size = block_size

    @classmethod
    def build(cls, options: LocalBlockOptions, setup: KernelSetup) -> "LocalBlockKernel":
        return cls(options.block_size)

    def dense_mask(self, t: int, causal: bool, device: torch.device | None = None, batch: int = 1) -> Tensor:
        """The pattern as a bool (T, T) mask: block-diagonal, and lower-triangular when causal."""
        return block_pattern(t, t, self.block_size, causal, device=device)

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        """q (B, H, Tq, Dh), the last Tq of k's Tk positions -> ((B, H, Tq, Dh), None)."""
        out = block_diagonal_attention(q, k, v, block=self.block_size, causal=causal, scale=scale, mask=mask,
                                       bias=bias, dropout_p=dropout_p)
        return out, None

    def cost(self, t_q, t_k, *, num_heads, num_kv_heads, qk_dim, v_dim, causal) -> KernelCost:
        """SDPA within blocks: 2 H NB b^2 (qk_dim + v_dim) FLOPs, T b per head instead of T^2 (see
        `block_diagonal_flops`); no weights held (fused per block)."""
        return KernelCost(block_diagonal_flops(t_q, t_k, self.block_size, num_heads, qk_dim, v_dim), 0)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, block_size={self.block_size}"
