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
measures. What one product computes, the same whichever kernel runs it (so a cached step equals
the full forward):

    bf16:  y = bf16( bf16(x) @ W_bf16^T ) + b
    int8:  y = bf16( bf16(x) @ Q^T ) * s + b,   s[o] = max_k |W[o, k]| / 127,  Q = round(W / s) in [-127, 127]

each sum accumulated in fp32. The activations meet the matrix rounded to bf16 and the product
leaves it rounded to bf16 once, because the CPU kernels that make such weights pay take and
give bf16 (below); each rounding (relative error at most 2^-8) is small beside the weights'
own (int8: up to s / 2 per weight, about 1% of a row's typical weight; bf16: 2^-8).

The kernels (torch 2.13, CPU):
- int8, K a multiple of 32: `torch.ops.aten._weight_int8pack_mm`, which turns int8 into fp32
  in registers and accumulates in fp32 (AVX-512 / AVX2 code) for bf16 activations; for fp32
  activations the same op is a scalar loop, ten times slower than fp32 BLAS, hence the bf16
  activations. The scales are passed as ones and applied in fp32 after (the op would round
  them to bf16). It takes 4 rows at a time, so a long prompt (hundreds of rows) runs about
  1.4x slower than fp32 BLAS would; a step's row runs about 2.3x faster on the 384 x 50,304
  head of the benchmark (one thread), less on small matrices. Another K (or a GPU):
  the same product through fp32 BLAS on Q converted per call (its integers are exact in fp32).
- bf16 on a CPU with native bf16 (AVX-512 BF16, AMX): oneDNN's inner product on the weight
  reordered once into its blocked layout (cached beside the module, like the fp32 inference
  layouts of `attnlab.nn.linear`): twice as fast as on the plain matrix, yet for one row of a
  matrix that sits in cache slower than fp32 BLAS (94 against 45 µs on 384 x 1,152, one thread
  of a Xeon with AMX); on weights streamed from memory it reads them at 0.68 of the copy
  bandwidth (1.41x fp32 on a 355M-parameter model). A step reads 2 bytes per weight, but
  memory holds 4 (the plain bf16 buffer and the blocked copy). Elsewhere (AVX2,
  where bf16 products are emulated, or a GPU): `F.linear` in bf16 for one row (torch's bf16
  matrix-vector product keeps an fp32 accumulator) or on a GPU, else fp32 BLAS on W converted.

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

WEIGHT_FORMATS = ("fp32", "bf16", "int8")
_INT8_MM = torch.ops.aten._weight_int8pack_mm.default  # the overloads, resolved once: these run for every
_ONEDNN_LINEAR = torch.ops.mkldnn._linear_pointwise.default  # matrix of every decoding step


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
        # the int8 kernel's own scales, all 1: s is applied in fp32 after it
        self.register_buffer("_ones", torch.ones(out_features, dtype=torch.bfloat16) if weights == "int8" else None,
                             persistent=False)

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
        # a fresh, contiguous (so aligned) bf16 copy: the int8 kernel loads its rows with aligned loads
        xb = x.reshape(-1, self.in_features).to(torch.bfloat16, memory_format=torch.contiguous_format, copy=True)
        scale, bias = b["scale"], b["bias"]
        if scale is not None:
            y = self._int8_product(xb)  # (N, O) bf16
            y = torch.mul(y, scale) if bias is None else torch.addcmul(bias, y, scale)
        else:
            y = self._bf16_product(xb)
            y = y.float() if bias is None else torch.add(y, bias)
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def _int8_product(self, xb: Tensor) -> Tensor:
        """bf16(xb @ Q^T), fp32 accumulation."""
        q = self._buffers["qweight"]
        if self._int8_kernel_applies(q):
            return _INT8_MM(xb, q, self._buffers["_ones"])
        return reference_product(xb, q)

    def _int8_kernel_applies(self, q: Tensor) -> bool:
        # the kernel steps through K 16 (AVX-512) or 8 (AVX2) at a time with aligned loads
        return q.device.type == "cpu" and self.in_features % 32 == 0

    def _bf16_product(self, xb: Tensor) -> Tensor:
        """bf16(xb @ W^T), fp32 accumulation."""
        w = self._buffers["qweight"]
        if w.device.type != "cpu":
            return F.linear(xb, w)
        if _native_bf16():
            return _ONEDNN_LINEAR(xb, self._packed(), None, "none", [], "")
        if xb.shape[0] == 1:
            return F.linear(xb, w)
        return reference_product(xb, w)

    def inference_layout(self) -> Callable[[Tensor], Tensor]:
        """The call of a decoding step's rows, x (N, K) fp32 -> (N, O), with this module's
        tensors and kernel picked once: `attnlab.nn.linear.fixed_layouts` takes it for the
        length of a decoding loop (the weights do not change there), so that `project` skips
        nn.Module's call and the checks above. Anything else goes to `forward`."""
        b = self._buffers
        q, scale, bias, ones = b["qweight"], b["scale"], b["bias"], b["_ones"]
        forward = self.forward
        fp32 = torch.float32
        if scale is not None and self._int8_kernel_applies(q):
            def step(x: Tensor) -> Tensor:
                if x.dtype is not fp32:
                    return forward(x)
                y = _INT8_MM(x.to(torch.bfloat16, memory_format=torch.contiguous_format, copy=True), q, ones)
                return torch.mul(y, scale) if bias is None else torch.addcmul(bias, y, scale)
            return step
        if scale is None and q.device.type == "cpu" and _native_bf16():
            packed = self._packed()

            def step(x: Tensor) -> Tensor:
                if x.dtype is not fp32:
                    return forward(x)
                y = _ONEDNN_LINEAR(x.to(torch.bfloat16, memory_format=torch.contiguous_format, copy=True), packed,
                                   None, "none", [], "")
                return y.float() if bias is None else torch.add(y, bias)
            return step
        return forward

    def _packed(self) -> Tensor:
        """oneDNN's blocked copy of the bf16 matrix, made on first use, remade when the buffer changes."""
        w = self.qweight
        signature = (w.data_ptr(), w._version)
        hit = _PACKED.get(self)
        if hit is None or hit[0] != signature:
            hit = (signature, torch.ops.mkldnn._reorder_linear_weight(w, 1))
            _PACKED[self] = hit
        return hit[1]


def reference_product(xb: Tensor, qweight: Tensor) -> Tensor:
    """bf16(xb @ qweight^T) through fp32 BLAS: the products of bf16 activations with bf16 or
    int8 weights are exact in fp32, so this is what the kernels compute, up to the order of
    the fp32 sums. xb (N, K) bf16, qweight (O, K) bf16 or int8 -> (N, O) bf16."""
    return F.linear(xb.float(), qweight.float()).to(torch.bfloat16)


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


__all__ = ["QuantizedLinear", "WEIGHT_FORMATS", "check_weights", "int8_per_channel", "quantize_weights",
           "reference_product"]
