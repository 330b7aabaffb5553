"""The model-side switches of a run's `train` section, applied by the Trainer before training:

    compile: true                    compile_layers: torch.compile of each transformer layer, in
                                     place (nn.Module.compile), so the state dict keeps its names
                                     (no `_orig_mod.`); CompileClock times the compiling
    activation_checkpointing: true   checkpoint_activations: each layer stack keeps its layers'
                                     inputs only and recomputes them in backward

Why layers and not the whole model: training calls `features` (and the fused loss), not the
model's `forward`, which is all that torch.compile of a module compiles; the layers are where
the time goes, and the layers of a stack are one class, so they share one compiled graph.
"""

from __future__ import annotations

import os
import shutil
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from attnlab.config.validate import ConfigError
from attnlab.models.transformer import TransformerStack
from attnlab.nn.layers import TransformerLayer


def has_cxx_compiler() -> bool:
    """Whether Inductor finds a C++ compiler for CPU code ($CXX, g++, clang++ or c++)."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    return any(shutil.which(name) for name in [*names, "g++", "clang++", "c++"])


def compile_layers(model: nn.Module) -> int:
    """Compile each transformer layer of `model` in place; returns how many.

    Raises:
        ConfigError: naming `train.compile`, for a model without transformer layers (an RNN).
    """
    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    if not layers:
        raise ConfigError("train.compile", f"true compiles transformer layers; a {type(model).__name__} has none")
    for layer in layers:
        layer.compile()
    return len(layers)


def checkpoint_activations(model: nn.Module) -> None:
    """Let every transformer stack of `model` recompute its layers in backward
    (attnlab.models.transformer.TransformerStack.activation_checkpointing).

    Raises:
        ConfigError: naming `train.activation_checkpointing`, for a model without a layer stack.
    """
    stacks = [m for m in model.modules() if isinstance(m, TransformerStack)]
    if not stacks:
        raise ConfigError("train.activation_checkpointing", f"true needs a transformer encoder or decoder; a "
                          f"{type(model).__name__} has no layer stack that checkpoints")
    for stack in stacks:
        stack.activation_checkpointing = True


class CompileClock:
    """The time torch.compile takes, step by step: `lap(step_seconds)` is the compiling since the
    previous lap, by Dynamo's own timers of its frame compiles (forward graphs, Inductor's code
    generation included) and of the backward graphs (compiled at their first backward); in a
    torch without these timers (they are internal to torch._dynamo), the whole first step."""

    def __init__(self):
        self.last, self.laps, self.total = self.seconds(), 0, 0.0

    @staticmethod
    def seconds() -> float | None:
        """Seconds spent compiling in this process so far, or None (no timers)."""
        try:
            from torch._dynamo.utils import compilation_time_metrics as timers
        except ImportError:
            return None
        return float(sum(sum(timers.get(name, ())) for name in ("_compile.compile_inner", "backward._backward_impl")))

    def lap(self, step_seconds: float) -> float:
        """Seconds compiled since the previous lap (`step_seconds`: the step just taken)."""
        now = self.seconds()
        if now is None or self.last is None:
            newly = step_seconds if self.laps == 0 else 0.0
        else:
            newly, self.last = now - self.last, now
        self.laps, self.total = self.laps + 1, self.total + newly
        return newly


def eager(compiled: int) -> AbstractContextManager:
    """The context evaluation and decoding run in: eagerly where `compiled` layers were compiled
    (train.compile), since a compiled layer would compile again for eval mode and for every length
    of a decoding cache (torch < 2.6, which has no compiler stances, compiles them)."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if compiled and stance is not None else nullcontext()
