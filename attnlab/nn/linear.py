"""A Linear at decoding time: its weight in an inference layout, one column block per CPU thread.

Notation: N rows (batch x beams: a handful at decoding time), in/out the Linear's widths,
T torch threads.

A decoding step is a chain of products of a few rows with each weight, bound by reading the
weights once. `nn.Linear` keeps W as (out, in); a row times the transposed, row-major (in, out)
matrix streams it in order (about twice as fast on a CPU for a wide (D, V) head). A BLAS call
with one row still streams the whole weight on one core (24 GB/s measured on a 2-core EPYC);
cut into T column blocks stored (T, in, out / T) and multiplied in one batched call, one block
per thread, it reaches 35 GB/s, and for a few rows it is 1.2-1.35x faster too. The blocks'
outputs lie side by side: (T, 1, out / T) is the (1, out) row as it is; more rows need one
(N, out) copy.

    y = project(linear, x)       # == linear(x) up to float rounding, x (N, in)
    y = project(linear, x3)      # == linear(x3): a (B, T, in) sequence takes the module's call

The layout is a copy of the weight, built on first use and kept beside the module (dropped
with it), rebuilt when the weight's or bias's storage or in-place version changes (an optimizer
step, load_state_dict, .to()) or the thread count does. It applies with autograd off to a
plain `nn.Linear` without hooks; anything else (training, subclasses such as tensor-parallel
linears, hooks) is the module's own call.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn


class InferenceLayout:
    """W (out, in) and b of a Linear, laid out for products with a few rows (see the module docstring)."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        n_out, n_in = weight.shape
        T = torch.get_num_threads()
        self.blocks = T if T > 1 and n_out % T == 0 and weight.device.type == "cpu" else 1
        w = weight.detach().t()  # (in, out)
        b = None if bias is None else bias.detach()
        if self.blocks == 1:
            self.w, self.b = w.contiguous(), b
        else:
            self.w = w.reshape(n_in, T, n_out // T).transpose(0, 1).contiguous()  # (T, in, out / T)
            self.b = None if b is None else b.reshape(T, 1, n_out // T)

    def __call__(self, x: Tensor) -> Tensor:
        """x (N, in) -> (N, out)."""
        if self.blocks == 1:
            return torch.mm(x, self.w) if self.b is None else torch.addmm(self.b, x, self.w)
        N = x.shape[0]
        xs = x.expand(self.blocks, N, x.shape[1])  # a new leading dim, no copy
        y = torch.bmm(xs, self.w) if self.b is None else torch.baddbmm(self.b, xs, self.w)  # (T, N, out / T)
        return y.view(1, -1) if N == 1 else y.transpose(0, 1).reshape(N, -1)


# id(linear) -> (signature, layout); an entry leaves with its module (weakref.finalize). A plain
# dict keyed by id: its lookup is one C call, and `project` runs for every matrix of every step.
_LAYOUTS: dict[int, tuple[tuple, InferenceLayout]] = {}


def layout(linear: nn.Linear) -> InferenceLayout:
    """The inference layout of `linear`, built on first use, rebuilt when its parameters (storage
    or in-place version) or the thread count change."""
    # _parameters, not .weight: a module's attribute lookup of a parameter is a slow Python fallback
    w, b = linear._parameters["weight"], linear._parameters["bias"]
    signature = (torch.get_num_threads(), w.data_ptr(), w._version, None if b is None else (b.data_ptr(), b._version))
    hit = _LAYOUTS.get(id(linear))
    if hit is not None and hit[0] == signature:
        return hit[1]
    if hit is None:
        weakref.finalize(linear, _LAYOUTS.pop, id(linear), None)
    made = InferenceLayout(w, b)
    _LAYOUTS[id(linear)] = (signature, made)
    return made


def plain(linear: nn.Module) -> bool:
    """Whether `linear` is an `nn.Linear` whose call the inference layout may replace."""
    return type(linear) is nn.Linear and not (linear._forward_hooks or linear._forward_pre_hooks)


class _Fixed(threading.local):
    layouts: dict[int, InferenceLayout] = {}  # id(linear) -> its layout, inside `fixed_layouts` (per thread)


_FIXED = _Fixed()


@contextmanager
def fixed_layouts(module: nn.Module) -> Iterator[None]:
    """A block in which the weights of `module` do not change (a decoding loop: autograd off, no
    optimizer step): the layout of each of its plain Linears is checked once, here, and `project`
    then takes it without its per-call checks (type, hooks, autograd, the weight's version).

    A module with an `inference_layout()` method (a Linear with reduced-precision weights,
    `attnlab.decoding.quantize`) gives its own call for the block.

    Blocks nest, and each thread has its own; on exit the layouts go back to being checked per call.
    """
    saved = _FIXED.layouts
    made = {id(m): layout(m) for m in module.modules() if plain(m)}
    made.update((id(m), m.inference_layout()) for m in module.modules() if hasattr(m, "inference_layout")
                and not (m._forward_hooks or m._forward_pre_hooks))
    _FIXED.layouts = {**saved, **made}
    try:
        yield
    finally:
        _FIXED.layouts = saved


def project(linear: nn.Module, x: Tensor) -> Tensor:
    """linear(x), through the inference layout when x is (N, in) (a decoding step's rows),
    autograd is off and the module is a plain Linear (see the module docstring); otherwise
    (a whole sequence (B, T, in), training, hooks, subclasses) the module's own call."""
    if x.dim() == 2:
        fixed = _FIXED.layouts.get(id(linear))  # inside `fixed_layouts`: checked on entry
        if fixed is not None:
            return fixed(x)
    if x.dim() != 2 or torch.is_grad_enabled() or type(linear) is not nn.Linear or linear._forward_hooks \
            or linear._forward_pre_hooks:
        return linear(x)
    # `layout` inlined: this runs for every matrix of every decoding step
    params = linear._parameters
    w, b = params["weight"], params["bias"]
    signature = (torch.get_num_threads(), w.data_ptr(), w._version, None if b is None else (b.data_ptr(), b._version))
    hit = _LAYOUTS.get(id(linear))
    made = hit[1] if hit is not None and hit[0] == signature else layout(linear)
    return made(x)


def project_few_rows(linear: nn.Module, x: Tensor) -> Tensor:
    """`project` for a wide output matrix (an LM head, out = V >> in): for 2-8 rows the product
    W (V, in) @ x^T (in, N), written back as a contiguous (N, V), is the faster one."""
    if x.dim() != 2 or not 1 < x.shape[0] <= 8 or torch.is_grad_enabled() or not plain(linear):
        return project(linear, x)
    out_t = torch.mm(linear.weight, x.t()).t()  # (N, V), strides (1, N)
    if linear.bias is None:
        return out_t.contiguous()
    return torch.add(out_t, linear.bias, out=out_t.new_empty(out_t.shape))  # contiguous (N, V)


__all__ = ["InferenceLayout", "fixed_layouts", "layout", "plain", "project", "project_few_rows"]
