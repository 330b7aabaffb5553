import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.activations import activation_fn
from attnlab.nn.layers import FeedForward, Residual
from attnlab.nn.norms import make_norm


def test_feed_forward_formula():
    ffn = FeedForward(8, 16, "relu")
    x = torch.randn(2, 3, 8)
    expected = F.linear(F.relu(F.linear(x, ffn.w1.weight, ffn.w1.bias)), ffn.w2.weight, ffn.w2.bias)
    torch.testing.assert_close(ffn(x), expected)


def test_gated_feed_forward_formula():
    ffn = FeedForward(8, 16, "swiglu", bias=False)
    x = torch.randn(2, 3, 8)
    w1, w3 = ffn.w13.weight.chunk(2)  # fused: W1's rows, then W3's
    expected = (F.silu(x @ w1.T) * (x @ w3.T)) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)


def test_unknown_activation():
    with pytest.raises(ValueError, match="tanh"):
        activation_fn("tanh")


def test_rmsnorm_formula():
    norm = make_norm("rmsnorm", 8, eps=1e-6)
    x = torch.randn(4, 8)
    torch.testing.assert_close(norm(x), x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt())


@pytest.mark.parametrize("placement", ["post", "pre", "both"])
def test_residual_placements(placement):
    block = Residual(lambda: nn.LayerNorm(8), placement, dropout=0.0)
    with torch.no_grad():
        for norm in (block.norm, block.post_norm):
            if norm is not None:
                norm.weight.uniform_(0.5, 2)
                norm.bias.normal_()
    x = torch.randn(3, 8)

    def f(h):
        return 2 * h + 1

    expected = {
        "post": lambda: block.norm(x + f(x)),
        "pre": lambda: x + f(block.norm(x)),
        "both": lambda: x + block.post_norm(f(block.norm(x))),
    }[placement]()
    torch.testing.assert_close(block(x, f), expected)
