"""Which precision a run computes in: `resolve_precision`, the one place `precision: auto` is
decided, and `autocast` / `uses_grad_scaler`, the one place a precision turns into autocast and
loss scaling.

    auto  ->  bf16 where the device runs bf16 matmuls natively, else fp32
    bf16  ->  bf16 (a warning where the device only emulates it)
    fp16  ->  fp16 with a gradient scaler (a warning where the device only emulates it)
    fp32  ->  fp32

bf16 pays only where the hardware has bf16 arithmetic: a CUDA GPU of compute capability 8.0 or
later (Ampere on; ROCm GPUs), a CPU with AVX512_BF16 or AMX-BF16 (x86), or FEAT_BF16 / SVE-BF16
(ARM). Elsewhere PyTorch emulates bf16 by converting to fp32 and back: on an AVX2-only CPU a bf16
matmul runs at under 1 GFLOP/s against 179 GFLOP/s in fp32, and a bf16 training run about 10x
slower than fp32 (fine-tuning about 14x). Autocast keeps the weights and the optimizer in fp32
either way (`autocast` below).

fp16 is for GPUs without bf16 (Volta, Turing: V100, T4): their tensor cores run fp16 natively.
Its range is narrow (largest 65,504, smallest normal 6.1e-5), so the loss is multiplied by a
scale before backward and the gradients divided by it before the optimizer step, the scale
halved when the gradients overflow (that step is skipped) and doubled after 2,000 clean steps
(`torch.amp.GradScaler`; Micikevicius et al. 2018, https://arxiv.org/abs/1710.03740). `auto`
never picks fp16: a model trained in fp32 or bf16 can overflow fp16 activations, so it is asked
for by name. Most CPUs emulate fp16 (no AVX512_FP16 / AMX-FP16): a matmul runs about 35x slower
than fp32 (2 vs 73 GFLOP/s on an AVX512_BF16 EPYC core); it runs there with a warning, for tests.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")

# the dtype autocast runs a resolved precision's matmuls in; fp32 (absent) runs without autocast
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# torch.cpu.get_capabilities() keys of bf16 arithmetic: x86 AVX512_BF16 and AMX-BF16; ARM FEAT_BF16, SVE-BF16
_CPU_BF16_FEATURES = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")
# ... and of fp16 arithmetic (x86 Sapphire Rapids on, Granite Rapids)
_CPU_FP16_FEATURES = ("avx512_fp16", "amx_fp16")


def _cpu_features() -> dict:
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # recent torch (2.13 has it)
    return capabilities() if capabilities is not None else {}


@lru_cache(maxsize=None)
def _cpu_native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (probed once per process: it cannot change)."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # recent torch (2.13 has it)
    if capabilities is not None:
        features = capabilities()
        return any(bool(features.get(name, False)) for name in _CPU_BF16_FEATURES)
    try:  # older torch: oneDNN's check (on x86 it also accepts AVX512 without BF16: close, not exact)
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 matmuls natively (fast), not emulated through fp32.

    The one capability probe behind `resolve_precision`; tests replace it to act as a machine
    with or without bf16.
    """
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False
        # (torch.cuda.is_bf16_supported() also says yes where bf16 is only emulated, pre-Ampere)
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        return _cpu_native_bf16()
    return False


def native_fp16(device: torch.device) -> bool:
    """Whether `device` runs fp16 matmuls natively: a CUDA GPU with tensor cores (compute
    capability 7.0 on) or a ROCm GPU, a CPU with AVX512_FP16 or AMX-FP16. (Pascal's 6.x GPUs are
    left out: most run fp16 at a fraction of their fp32 rate.)"""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 7
    if device.type == "cpu":
        features = _cpu_features()
        return any(bool(features.get(name, False)) for name in _CPU_FP16_FEATURES)
    return False


def resolve_precision(requested: str, device: torch.device, *, warn: bool = True) -> str:
    """The precision a run on `device` computes in: "bf16", "fp16" or "fp32".

    Args:
        requested: "auto" (bf16 where `native_bf16(device)`, else fp32), "bf16", "fp16" or "fp32".
        device: where the model runs.
        warn: warn when bf16 or fp16 is forced on a device that only emulates it (once per run:
            the callers that resolve per step pass False).

    Returns:
        "bf16", "fp16" or "fp32".

    Raises:
        ValueError: `requested` is not one of PRECISIONS.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if requested == "bf16" and warn and not native_bf16(device):
        slower = "about 10x slower than in fp32" if device.type == "cpu" else "slower than in fp32"
        warnings.warn(f"precision bf16 on a {device.type} without native bf16: PyTorch emulates it, and the run "
                      f"is {slower}; set precision to auto (the default, which picks fp32 here) or fp32", stacklevel=2)
    if requested == "fp16" and warn and not native_fp16(device):
        slower = "its matmuls about 35x slower than in fp32" if device.type == "cpu" else "slower than in fp32"
        warnings.warn(f"precision fp16 on a {device.type} without native fp16: PyTorch emulates it, "
                      f"{slower}; fp16 is for GPUs without bf16 (V100, T4): set precision to auto or fp32 here",
                      stacklevel=2)
    return requested


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """The forward-pass context of a precision: bf16 or fp16 autocast on `device`, or nothing for
    fp32; "auto" as `resolve_precision` decides it (a run resolves once and passes the result
    here). Weights, gradients and the optimizer stay fp32 under either."""
    dtype = AUTOCAST_DTYPES.get(resolve_precision(precision, device, warn=False))
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def uses_grad_scaler(precision: str) -> bool:
    """Whether a run in this resolved precision scales its loss (fp16: gradients below 6e-8
    would flush to zero, above 65,504 overflow)."""
    return precision == "fp16"
