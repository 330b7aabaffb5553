"""Building blocks, one concept per file: masks, positions, scores, kernels, attention, layers.

The variant seams are registries (plain dicts from a config string to an implementation):
`kernels.KERNELS`, `scores.SCORES`, `positions.POSITION_SCHEMES`, `activations.ACTIVATIONS`,
`norms.NORMS`.
"""

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import FeedForward, Residual, TransformerLayer
from attnlab.nn.masks import causal_mask, padding_mask, positions_from_mask, prefix_lm_mask
from attnlab.nn.norms import make_norm
from attnlab.nn.scores import build_score

__all__ = [
    "FeedForward", "MultiHeadAttention", "Residual", "TransformerLayer", "build_score", "causal_mask",
    "make_norm", "padding_mask", "positions_from_mask", "prefix_lm_mask",
]
