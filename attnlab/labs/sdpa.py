"""Lab `sdpa`: scaled dot-product attention written as an attention kernel.

The student writes `attention(q, k, v, *, scale, mask, bias, dropout_p) -> (out, weights)`; the
checks hold it to attnlab's eager kernel (`attnlab.nn.kernels.eager`, the reference every kernel
is tested against) and to the properties its tests use: masked keys get weight 0, causality,
padding invariance, a query with no key gives zeros. A passing piece is registered as the kernel
`lab-sdpa` (`model.attention.kernel: lab-sdpa`).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from attnlab.labs.base import Check, CheckFailed, Lab, close, need
from attnlab.nn.kernels import KERNELS, Kernel, Supports
from attnlab.nn.kernels.base import repeat_kv
from attnlab.nn.kernels.eager import EagerKernel

KERNEL_NAME = "lab-sdpa"

STUB = '''"""Lab sdpa: scaled dot-product attention (Vaswani et al. 2017, eq. 1), as an attnlab kernel.

Check it with `attnlab lab check sdpa`; once it passes, `attnlab --lab DIR train ...` can use it
as the kernel `lab-sdpa` (model.attention.kernel: lab-sdpa).
"""

import torch
import torch.nn.functional as F


def attention(q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0):
    """softmax(scale * q k^T + bias, masked) v.

    Args:
        q: queries (B, H, Tq, Dh).
        k, v: keys and values (B, H, Tk, Dh).
        scale: the number the scores are multiplied by (1 / sqrt(Dh) for scaled dot product).
        mask: None, or a bool tensor broadcastable to (B, H, Tq, Tk): True = may attend,
            False = the query must give that key weight exactly 0.
        bias: None, or float scores broadcastable to (B, H, Tq, Tk), added to the scaled scores
            before the softmax (ALiBi and T5 positions come in this way).
        dropout_p: the probability of dropping a weight (training only): apply
            F.dropout(weights, dropout_p) before multiplying by v.

    Returns:
        (out (B, H, Tq, Dh), weights (B, H, Tq, Tk)): the weights before dropout; each row sums
        to 1 over the keys it may attend. A query that may attend no key at all gets a row of
        zero weights and a zero output (never NaN).

    Hints:
        - scores = (q @ k.transpose(-2, -1)) * scale  -> (B, H, Tq, Tk)
        - masked scores: scores.masked_fill(~mask, float("-inf")) before the softmax
        - a row that is all -inf gives NaN from softmax: find those rows (mask.any(-1)) and zero them
    """
    raise NotImplementedError("write attention(): see the docstring")
'''

SOLUTION = '''"""The reference solution of lab sdpa: attnlab's eager kernel."""

from attnlab.nn.kernels.eager import EagerKernel

_eager = EagerKernel()


def attention(q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0):
    return _eager(q, k, v, scale=scale, mask=mask, bias=bias, dropout_p=dropout_p)
'''


def _inputs(B=2, H=3, Tq=5, Tk=5, Dh=8, seed=0) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, Dh, generator=g) for T in (Tq, Tk, Tk))


def _reference(q, k, v, **kw) -> tuple[Tensor, Tensor]:
    return EagerKernel()(q, k, v, **kw)


def _call(module: ModuleType, q, k, v, **kw) -> tuple[Tensor, Tensor]:
    """The student's (out, weights), or CheckFailed when the result is not a pair of tensors."""
    result = need(module, "attention")(q, k, v, **kw)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"expected attention() to return (out, weights), got {type(result).__name__}")
    return result


def _causal(T: int) -> Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()


def check_shapes(module):
    q, k, v = _inputs(Tq=3, Tk=7)
    out, weights = _call(module, q, k, v, scale=0.5)
    if tuple(out.shape) != (2, 3, 3, 8):
        raise CheckFailed(f"out: expected shape (B, H, Tq, Dh) = (2, 3, 3, 8), got {tuple(out.shape)}")
    if tuple(weights.shape) != (2, 3, 3, 7):
        raise CheckFailed(f"weights: expected shape (B, H, Tq, Tk) = (2, 3, 3, 7), got {tuple(weights.shape)}")


def check_equals_reference(module):
    q, k, v = _inputs(Tq=4, Tk=6, seed=1)
    out, weights = _call(module, q, k, v, scale=8 ** -0.5)
    ref_out, ref_weights = _reference(q, k, v, scale=8 ** -0.5)
    close(weights, ref_weights, "weights (no mask)")
    close(out, ref_out, "out (no mask)")


def check_scale(module):
    q, k, v = _inputs(seed=2)
    out, _ = _call(module, q, k, v, scale=2.0)
    close(out, _reference(q, k, v, scale=2.0)[0], "scale=2.0 (the scores are multiplied by `scale`)")


def check_mask(module):
    q, k, v = _inputs(seed=3)
    mask = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[..., 0] = True  # every query may attend somewhere
    out, weights = _call(module, q, k, v, scale=0.3, mask=mask)
    masked = weights.detach().masked_select(~mask.expand_as(weights))
    if masked.abs().max() > 0:
        raise CheckFailed(f"masked keys (mask False) must get weight exactly 0, got up to {masked.abs().max():.3g}")
    ref_out, ref_weights = _reference(q, k, v, scale=0.3, mask=mask)
    close(weights, ref_weights, "weights under a (B, 1, Tq, Tk) mask")
    close(out, ref_out, "out under a (B, 1, Tq, Tk) mask")


def check_rows_sum_to_one(module):
    q, k, v = _inputs(seed=4)
    _, weights = _call(module, q, k, v, scale=1.0, mask=_causal(5))
    sums = weights.detach().sum(-1)
    close(sums, torch.ones_like(sums), "each query's weights sum to 1")


def check_causal(module):
    q, k, v = _inputs(Tq=6, Tk=6, seed=5)
    out, _ = _call(module, q, k, v, scale=0.35, mask=_causal(6))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5], v2[:, :, 5] = torch.randn(2, 2, 3, 8, generator=torch.Generator().manual_seed(12)) * 3
    out2, _ = _call(module, q, k2, v2, scale=0.35, mask=_causal(6))
    for i in range(5):
        change = (out2[:, :, i] - out[:, :, i]).abs().max().item()
        if change > 1e-6:
            raise CheckFailed(f"output at position {i} changed when token 5 changed (by {change:.3g}), "
                              "expected it unchanged under a causal mask")


def check_padding_invariance(module):
    q, k, v = _inputs(Tq=4, Tk=4, seed=6)
    out, _ = _call(module, q, k, v, scale=0.35)
    pad = torch.randn(2, 3, 3, 8, generator=torch.Generator().manual_seed(7)) * 10
    kp, vp = torch.cat([k, pad], 2), torch.cat([v, pad], 2)
    mask = torch.tensor([True] * 4 + [False] * 3).view(1, 1, 1, 7)
    padded, _ = _call(module, q, kp, vp, scale=0.35, mask=mask)
    close(padded, out, "adding 3 padded keys (mask False) must leave the output unchanged")


def check_no_key(module):
    q, k, v = _inputs(seed=8)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    mask[..., 2, :] = False  # query 2 may attend nowhere
    out, weights = _call(module, q, k, v, scale=0.35, mask=mask)
    if torch.isnan(out).any() or torch.isnan(weights).any():
        raise CheckFailed("a query that may attend no key gave NaN, expected zero weights and a zero output")
    close(out[:, :, 2], torch.zeros_like(out[:, :, 2]), "the output of a query that may attend no key")
    close(weights[:, :, 2], torch.zeros_like(weights[:, :, 2]), "the weights of a query that may attend no key")


def check_bias(module):
    q, k, v = _inputs(seed=9)
    bias = torch.randn(1, 3, 5, 5, generator=torch.Generator().manual_seed(9))
    out, _ = _call(module, q, k, v, scale=0.35, bias=bias, mask=_causal(5))
    close(out, _reference(q, k, v, scale=0.35, bias=bias, mask=_causal(5))[0], "out with a score bias and a mask")


def check_gradients(module):
    q, k, v = (t.requires_grad_() for t in _inputs(seed=10))
    out, _ = _call(module, q, k, v, scale=0.35, mask=_causal(5))
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad(_reference(q2, k2, v2, scale=0.35, mask=_causal(5))[0].square().sum(), (q2, k2, v2))
    for name, got, want in zip("qkv", grads, expected):
        close(got, want, f"gradient with respect to {name}", atol=1e-4)


def check_dropout(module):
    q, k, v = _inputs(seed=11)
    plain, weights = _call(module, q, k, v, scale=0.35)
    torch.manual_seed(0)
    dropped, weights_d = _call(module, q, k, v, scale=0.35, dropout_p=0.5)
    if torch.allclose(plain, dropped):
        raise CheckFailed("dropout_p=0.5 left the output unchanged, expected some weights dropped")
    close(weights_d, weights, "the returned weights with dropout_p=0.5 (expected those before dropout)")


CHECKS = (
    Check("shapes of out and weights", check_shapes),
    Check("equals the eager kernel", check_equals_reference),
    Check("scale", check_scale),
    Check("bool mask (True = may attend)", check_mask),
    Check("weights sum to 1", check_rows_sum_to_one),
    Check("causal mask", check_causal),
    Check("padding invariance", check_padding_invariance),
    Check("query with no key", check_no_key),
    Check("score bias", check_bias),
    Check("gradients", check_gradients),
    Check("dropout", check_dropout),
)


class LabKernel(Kernel):
    """The student's `attention` as an attention kernel (grouped key/value heads are repeated to
    the query heads before the call, as the contract has one key/value head per query head)."""

    name = KERNEL_NAME
    supports = Supports(any_score=False, value_term=False, grouped_kv=False, materializes_weights=True)
    fn = None  # set by `plug`: the student's function

    def forward(self, q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0, causal=False, need_weights=False):
        k, v = repeat_kv(k, v, q.shape[1])
        return type(self).fn(q, k, v, scale=scale, mask=mask, bias=bias, dropout_p=dropout_p)


def plug(module: ModuleType) -> list[str]:
    """Register the student's kernel as `lab-sdpa`."""
    LabKernel.fn = staticmethod(module.attention)
    KERNELS[KERNEL_NAME] = LabKernel
    return [f"attention.kernel={KERNEL_NAME}"]


def unplug() -> None:
    KERNELS.pop(KERNEL_NAME, None)


LAB = Lab(name="sdpa", filename="sdpa.py", writes="attention(q, k, v, *, scale, mask, bias, dropout_p): a kernel",
          lecture="[A] Attention", stub=STUB, solution=SOLUTION, checks=CHECKS, plug=plug, unplug=unplug)
