"""Lab `pre-ln-layer`: the forward of a pre-LN Transformer layer (Xiong et al. 2020).

The student writes `pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask) -> x'`: the residual
story of one layer, given its modules. The checks hold it to `attnlab.nn.layers.TransformerLayer`
with `placement="pre"` and the same modules (so the same weights), and tell it apart from post-LN.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from attnlab.labs.base import Check, CheckFailed, Lab, close, need
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import FeedForward, TransformerLayer
from attnlab.nn.norms import make_norm

STUB = '''"""Lab pre-ln-layer: one pre-LN Transformer layer (Xiong et al. 2020, https://arxiv.org/abs/2002.04745).

Check it with `attnlab lab check pre-ln-layer`: it is compared with attnlab's TransformerLayer
(norm_placement="pre") built from the same modules.
"""


def pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask=None):
    """Self-attention then feed-forward, each inside a residual connection, the norm placed
    before the sublayer (pre-LN):

        x = x + SelfAttention(Norm1(x))
        x = x + FeedForward(Norm2(x))

    (post-LN, the original paper's, puts the norm after the sum: x = Norm(x + f(x)).)

    Args:
        x: hidden states (B, T, D).
        self_attn: attnlab's MultiHeadAttention: self_attn(h, mask=mask) returns (out (B, T, D),
            weights) -- take out.
        ffn: the position-wise feed-forward: ffn(h) -> (B, T, D).
        norm1, norm2: the norms before self-attention and before the feed-forward (LayerNorm or
            RMSNorm modules): norm1(x) -> (B, T, D).
        mask: None or a bool mask broadcastable to (B, H, T, T), True = may attend; hand it to
            self_attn.

    Returns:
        the layer's output (B, T, D). No dropout: the checks run in eval mode.
    """
    raise NotImplementedError("write pre_ln_layer(): see the docstring")
'''

SOLUTION = '''"""The reference solution of lab pre-ln-layer: attnlab's TransformerLayer's residual blocks."""

from attnlab.nn.layers import Residual


def pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask=None):
    attn_block, ffn_block = Residual(lambda: norm1, "pre", 0.0), Residual(lambda: norm2, "pre", 0.0)
    x = attn_block.add(x, self_attn(attn_block.normed(x), mask=mask)[0])
    return ffn_block.add(x, ffn(ffn_block.normed(x)))
'''

D, H = 16, 4


def _layer(seed: int, norm: str = "layernorm") -> TransformerLayer:
    torch.manual_seed(seed)
    layer = TransformerLayer(MultiHeadAttention(D, H, kernel="eager"), FeedForward(D, 32, "gelu"),
                             make_norm=lambda: make_norm(norm, D), placement="pre", dropout=0.0).eval()
    with torch.no_grad():  # norms with gains and biases away from 1 and 0, so that misplacing one shows
        for block in (layer.self_attn_block, layer.ffn_block):
            for p in block.norm.parameters():
                p.add_(torch.randn_like(p) * 0.5)
    return layer


def _student(module: ModuleType, layer: TransformerLayer, x: Tensor, mask: Tensor | None) -> Tensor:
    fn = need(module, "pre_ln_layer")
    return fn(x, layer.self_attn, layer.ffn, layer.self_attn_block.norm, layer.ffn_block.norm, mask=mask)


def _x(T=6, seed=0) -> Tensor:
    return torch.randn(2, T, D, generator=torch.Generator().manual_seed(seed)) * 2 + 1


def _causal(T: int) -> Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()


def check_equals_reference(module):
    layer, x = _layer(0), _x()
    got = _student(module, layer, x, None)
    expected = layer(x)
    post = layer.self_attn_block.norm(x + layer.self_attn(x)[0])
    post = layer.ffn_block.norm(post + layer.ffn(post))
    if isinstance(got, Tensor) and got.shape == expected.shape and torch.allclose(got, post, atol=1e-5):
        raise CheckFailed("got the post-LN layer, Norm(x + f(x)); pre-LN is x + f(Norm(x))")
    close(got, expected, "the layer's output, no mask")


def check_mask(module):
    layer, x = _layer(1), _x(seed=1)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., :2] = False  # the second sequence's first two tokens are padding
    close(_student(module, layer, x, mask), layer(x, mask), "the output under a padding mask")


def check_causal(module):
    layer, x = _layer(2), _x(seed=2)
    out = _student(module, layer, x, _causal(6))
    x2 = x.clone()
    x2[:, 5] = torch.randn(2, D, generator=torch.Generator().manual_seed(9)) * 3  # (not a constant: a norm removes it)
    out2 = _student(module, layer, x2, _causal(6))
    for i in range(5):
        change = (out2[:, i] - out[:, i]).abs().max().item()
        if change > 1e-5:
            raise CheckFailed(f"causal mask: output at position {i} changed when token 5 changed (by {change:.3g}); "
                              "hand the mask to self_attn")


def check_rmsnorm(module):
    layer, x = _layer(3, "rmsnorm"), _x(seed=3)
    close(_student(module, layer, x, _causal(6)), layer(x, _causal(6)), "with RMSNorm norms and a causal mask")


def check_gradients(module):
    layer = _layer(4)
    x = _x(seed=4).requires_grad_()
    (grad,) = torch.autograd.grad(_student(module, layer, x, None).square().sum(), x)
    x2 = x.detach().requires_grad_()
    (expected,) = torch.autograd.grad(layer(x2).square().sum(), x2)
    close(grad, expected, "the gradient with respect to x", atol=1e-4)


def check_residual(module):
    layer, x = _layer(5), _x(seed=5)
    with torch.no_grad():  # sublayers that output 0: the layer is the identity, whatever the norms
        layer.self_attn.out_proj.weight.zero_()
        layer.self_attn.out_proj.bias.zero_()
        layer.ffn.w2.weight.zero_()
        layer.ffn.w2.bias.zero_()
    close(_student(module, layer, x, None), x, "sublayers that output zeros: expected x itself (the residual path)")


CHECKS = (
    Check("equals attnlab's pre-LN TransformerLayer", check_equals_reference),
    Check("padding mask", check_mask),
    Check("causal mask", check_causal),
    Check("RMSNorm", check_rmsnorm),
    Check("residual path", check_residual),
    Check("gradients", check_gradients),
)

LAB = Lab(name="pre-ln-layer", filename="pre_ln_layer.py", writes="pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask)",
          lecture="[T] The Transformer: the layer", stub=STUB, solution=SOLUTION, checks=CHECKS)
