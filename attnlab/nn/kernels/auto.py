"""`attention.kernel='auto'`: PyTorch's fused kernel whenever the variant allows it (a
dot-product-shaped score and no relative values term), else the eager kernel. Resolved once,
when the attention module is built; a call that asks for the weights takes the eager reference."""

from __future__ import annotations

from attnlab.nn.kernels.base import Kernel, Supports
from attnlab.nn.kernels.eager import EagerKernel
from attnlab.nn.kernels.sdpa import SdpaKernel


class AutoKernel(Kernel):
    """Resolves to `SdpaKernel` or `EagerKernel` (see `resolve`); supports what eager does."""

    name = "auto"
    supports = Supports()

    def resolve(self, *, fused_score: bool, value_term: bool) -> Kernel:
        return SdpaKernel() if fused_score and not value_term else EagerKernel()

    def forward(self, q, k, v, **kwargs):  # called unresolved: q and k are dot-product-shaped
        return self.resolve(fused_score=True, value_term=False)(q, k, v, **kwargs)
