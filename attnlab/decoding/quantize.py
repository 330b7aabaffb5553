"""Reduced-precision weights for decoding (opt-in, weight-only): every plain `nn.Linear` of a
model becomes a `QuantizedLinear` that stores its matrix as bf16, or as int8 with one fp32
scale per output channel; the activations between the products, norms, attention and the KV
cache stay fp32.

    from attnlab.decoding import generate, quantize_weights
    fast = quantize_weights(model, "int8")       # a copy; the fp32 model stays as it is
    out = generate(fast, prompt_ids, 100)

Notation: N rows (tokens in one call), K in_features, O out_features.

A decoding step reads every weight once for a handful of rows: its time is the bytes of the
weights (4 per fp32 weight, 2 in bf16, 1 in int8) over the memory bandwidth, so fewer bytes per
weight is a faster step, at a cost in accuracy that `benchmarks/bench_generate.py --weights`
measures. What one product computes, the same whichever kernel runs it:

    int8:  y = fp32(round(x / sx) @ Q^T) * sx * s + b,   s[o] = max_k |W[o, k]| / 127,  Q = round(W / s)
           in [-127, 127];  sx[n] = max_k |x[n, k]| / 32767 (each row of activations in int16)
    bf16:  y = bf16( bf16(x) @ W_bf16^T ) + b,             summed in fp32

The int8 sums are exact integers, so every kernel and row count gives the same bits (a cached
decoding step equals the full forward exactly); the activations' int16 rounding (at most
max|x| / 65534 per value) is small beside the weights' own (up to s / 2 per weight, about 1% of
a row's typical weight). The bf16 product rounds the activations to bf16 and its result once
(relative error at most 2^-8 each), small beside the weights' own rounding (2^-8).

The kernels (`attnlab.nn.native`, compiled on first use; without a C++ compiler, their
PyTorch references after one warning):
- int8, any row count: `native.int8_rows`, which widens int8 weights to int16 in registers and
  multiplies them with the int16 activations in integer pairs (AVX2), the whole product and its
  scales in one call. On a 2-core AMD EPYC (Zen 1) a 355M-parameter model's int8 steps ran 3.1x
  faster than fp32 on two threads, 2.4x on one (docs/concepts/decoding.md). The reference (and a
  GPU) sums in float64.
- bf16, up to `BF16_KERNEL_ROWS` rows on a CPU: `native.bf16_rows` (fp32 sums, AVX2). More rows:
  on a CPU with native bf16 (AVX-512 BF16, AMX), oneDNN's inner product on the weight reordered
  once into its blocked layout (cached beside the module, like the fp32 inference layouts of
  `attnlab.nn.linear`; memory then holds the matrix twice); elsewhere fp32 BLAS on W converted
  per call; on a GPU, `F.linear` in bf16.

Embedding tables stay fp32: a step reads one row of each, so their storage costs no time. A
tied LM head (the output matrix is the token embedding) is quantized as a Linear of its own —
at a large vocabulary it is the largest matrix a step reads — so the embedding keeps its exact
fp32 table beside the head's reduced copy. Subclasses of `nn.Linear` (LoRA, tensor-parallel
shards) and torch's recurrent layers (nn.LSTM, nn.GRU) stay as they are.
"""

from __future__ import annotations

import copy
import functools
import weakref
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn import native

WEIGHT_FORMATS = ("fp32", "bf16", "int8")
_ONEDNN_LINEAR = torch.ops.mkldnn._linear_pointwise.default  # resolved once: it runs for every matrix of a step
BF16_KERNEL_ROWS = 4  # up to this many rows take native.bf16_rows (beyond, it falls behind fp32 BLAS on 2 cores)


@functools.cache
def _native_bf16() -> bool:
    """Whether oneDNN runs bf16 products natively on this CPU (AVX-512 BF16 or AMX)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# QuantizedLinear -> (signature, oneDNN's blocked bf16 weight); an entry leaves with its module.
# Kept out of the module: the blocked tensor is opaque (no storage to copy, save or move).
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_weights(weights: str) -> str:
    """`weights` if it is one of WEIGHT_FORMATS.

    Raises:
        ValueError: anything else, naming the allowed values.
    """
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    return weights


def int8_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8: (Q (O, K) int8, s (O,) fp32) with s = max|W[o]| / 127
    and Q = round(W / s), so that W ~ Q * s[:, None]. A row of zeros gets s = 1 (and Q = 0).

    Example: W = [[0.5, -1.27]] -> s = [0.01], Q = [[50, -127]].
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class QuantizedLinear(nn.Module):
    """A Linear whose matrix is stored as bf16 (`weights="bf16"`), or as int8 with one fp32
    scale per output channel (`weights="int8"`), for inference; see the module docstring for
    what it computes and which kernel runs it. Build one with `QuantizedLinear.from_linear`.

    Buffers: `qweight` (O, K) bf16 or int8, `scale` (O,) fp32 (int8 only), `bias` (O,) fp32 or None.
    """

    def __init__(self, in_features: int, out_features: int, *, weights: str, bias: bool = True):
        super().__init__()
        if check_weights(weights) == "fp32":
            raise ValueError("QuantizedLinear stores bf16 or int8 weights; for fp32 keep the nn.Linear")
        self.in_features, self.out_features, self.weights = in_features, out_features, weights
        dtype = torch.int8 if weights == "int8" else torch.bfloat16
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=dtype))
        self.register_buffer("scale", torch.ones(out_features) if weights == "int8" else None)
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, weights: str) -> QuantizedLinear:
        """`linear`'s weight (and fp32 bias) in the given storage, on its device."""
        w = linear.weight.detach()
        made = cls(linear.in_features, linear.out_features, weights=weights, bias=linear.bias is not None)
        made.to(w.device)
        if weights == "int8":
            q, s = int8_per_channel(w)
            made.qweight.copy_(q)
            made.scale.copy_(s)
        else:
            made.qweight.copy_(w.to(torch.bfloat16))
        if linear.bias is not None:
            made.bias.copy_(linear.bias.detach().float())
        return made

    @property
    def weight(self) -> Tensor:
        """The stored matrix in fp32, (O, K) (for code that reads a Linear's matrix; a new tensor)."""
        w = self.qweight.float()
        return w * self.scale[:, None] if self.scale is not None else w

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weights={self.weights}")

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., O) in x's dtype (see the module docstring)."""
        b = self._buffers  # read once: a buffer read as an attribute takes nn.Module's slow fallback
        rows = x.reshape(-1, self.in_features)
        if b["scale"] is not None:
            y = native.int8_rows(rows.float(), b["qweight"], b["scale"], b["bias"])
        else:
            y = self._bf16_product(rows.to(torch.bfloat16))
            y = y.float() if b["bias"] is None else torch.add(y, b["bias"])
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def _bf16_product(self, xb: Tensor) -> Tensor:
        """bf16(xb @ W^T), fp32 accumulation."""
        w = self._buffers["qweight"]
        if w.device.type != "cpu":
            return F.linear(xb, w)
        if xb.shape[0] <= BF16_KERNEL_ROWS and native.kernels() is not None:
            return native.bf16_rows(xb, w)
        if _native_bf16():
            return _ONEDNN_LINEAR(xb.contiguous(), self._packed(), None, "none", [], "")
        if xb.shape[0] == 1:
            return F.linear(xb, w)  # torch's bf16 matrix-vector product keeps an fp32 accumulator
        return native.bf16_rows_reference(xb, w)

    def inference_layout(self) -> Callable[[Tensor], Tensor]:
        """The call of a decoding step's rows, x (N, K) fp32 -> (N, O), with this module's
        tensors and kernel picked once: `attnlab.nn.linear.fixed_layouts` takes it for the
        length of a decoding loop (the weights do not change there), so that `project` skips
        nn.Module's call and the checks above. Anything else goes to `forward`."""
        b = self._buffers
        q, scale, bias = b["qweight"], b["scale"], b["bias"]
        forward = self.forward
        ops = native.kernels() if q.device.type == "cpu" else None
        if ops is None:
            return forward
        fp32, rows_max = torch.float32, BF16_KERNEL_ROWS
        if scale is not None:
            int8 = ops.int8_rows

            def step(x: Tensor) -> Tensor:
                return int8(x.contiguous(), q, scale, bias) if x.dtype is fp32 else forward(x)
            return step
        bf16 = ops.bf16_rows

        def step(x: Tensor) -> Tensor:
            if x.dtype is not fp32 or x.shape[0] > rows_max:
                return forward(x)
            y = bf16(x.to(torch.bfloat16, memory_format=torch.contiguous_format), q)
            return y.float() if bias is None else torch.add(y, bias)
        return step

    def _packed(self) -> Tensor:
        """oneDNN's blocked copy of the bf16 matrix, made on first use, remade when the buffer changes."""
        w = self.qweight
        signature = (w.data_ptr(), w._version)
        hit = _PACKED.get(self)
        if hit is None or hit[0] != signature:
            hit = (signature, torch.ops.mkldnn._reorder_linear_weight(w, 1))
            _PACKED[self] = hit
        return hit[1]


def quantize_weights(model: nn.Module, weights: str = "int8", *, inplace: bool = False) -> nn.Module:
    """The model with every plain `nn.Linear` (LM head included) stored in `weights` for decoding.

    Args:
        model: any attnlab model (decoder, encoder-decoder, recurrent); put it in eval mode.
        weights: "int8" (one fp32 scale per output channel), "bf16", or "fp32" (the model as
            it is: the default of `attnlab generate`, exact).
        inplace: swap the modules of `model` itself (saves a copy's memory) instead of a copy.

    Returns:
        The quantized model (a copy unless `inplace`), for inference only: the quantized
        matrices are buffers, not parameters, so it neither trains nor saves as an attnlab
        checkpoint (keep the fp32 model for that).

    Raises:
        ValueError: `weights` is not one of WEIGHT_FORMATS.
    """
    check_weights(weights)
    target = model if inplace else copy.deepcopy(model)
    if weights == "fp32":
        return target
    done: dict[int, QuantizedLinear] = {}  # a Linear shared by two parents stays shared
    for parent in list(target.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                if id(child) not in done:
                    done[id(child)] = QuantizedLinear.from_linear(child, weights)
                setattr(parent, name, done[id(child)])
    return target


__all__ = ["BF16_KERNEL_ROWS", "QuantizedLinear", "WEIGHT_FORMATS", "check_weights", "int8_per_channel",
           "quantize_weights"]
