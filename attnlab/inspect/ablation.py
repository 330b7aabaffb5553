"""Ablation: knock out one piece of an activation at a time and see how much a metric moves.

    result = ablate(model, ids, logit_diff(mary, john), "layers.*.self_attn.hook_z", by="head",
                    method="mean", reference=other_ids)
    result.values - result.baseline          # (L, H): each head's effect on the metric

Methods (each replaces the piece only; the pieces are those of `attnlab.inspect.patching`:
a position, a head, or the whole point):

    zero       0; simple, but it can push a layer far from anything it saw in training
    mean       the mean over a reference batch (default the inputs themselves), per position:
               what the piece carries on average, with the input-specific part taken out
    resample   the same piece from another input of the reference batch (row b takes reference
               row r_b, drawn with `generator`): the piece as it is on some other input
               (Chan et al. 2022, "causal scrubbing", resampling ablation)

Zero-ablating a head's `hook_z` equals zero-ablating its `hook_result` (the out-projection of a
zero is zero, and the result excludes the bias); the tests check it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from attnlab.inspect.hooks import select_points
from attnlab.inspect.patching import Inputs, Metric, as_inputs, recorded, score, sweep

__all__ = ["METHODS", "AblationResult", "ablate"]

METHODS = ("zero", "mean", "resample")


@dataclass
class AblationResult:
    """The metric with each piece ablated.

    Attributes:
        values: (rows, columns) float64.
        rows, columns, axis: as `attnlab.inspect.patching.PatchResult`.
        baseline: the metric without ablation.
        method: "zero", "mean" or "resample".
    """

    values: Tensor
    rows: list[str]
    columns: list[str]
    axis: str
    baseline: float
    method: str

    def effect(self) -> Tensor:
        """values - baseline: how far ablating each piece moves the metric."""
        return self.values - self.baseline


def _check_reference(inputs: tuple[Tensor, ...], reference: tuple[Tensor, ...]) -> None:
    if len(reference) != len(inputs):
        raise ValueError(f"reference has {len(reference)} input tensors, the inputs {len(inputs)}")
    for i, (x, r) in enumerate(zip(inputs, reference)):
        if x.shape[1:] != r.shape[1:]:
            raise ValueError(f"reference input {i} is {tuple(r.shape)}; it must have the inputs' positions "
                             f"{tuple(x.shape[1:])} (any batch size): mean and resample ablation work per position")


def ablate(model: nn.Module, inputs: Inputs, metric: Metric, points: str | Sequence[str], *, by: str = "head",
           method: str = "zero", reference: Inputs | None = None, generator: torch.Generator | None = None,
           **kwargs: Any) -> AblationResult:
    """Ablate each piece of each point in turn and measure `metric`.

    Args:
        model: as `attnlab.inspect.patching.activation_patching`.
        metric: as there.
        points: as there.
        by: as there.
        inputs: the model's inputs (ids, or (src_ids, tgt_ids)).
        method: "zero", "mean" or "resample".
        reference: the batch whose activations "mean" averages (default `inputs`) and "resample"
            draws from (required); same positions as `inputs`, any batch size.
        generator: draws the reference row of each input row for "resample" (default seed 0).
        **kwargs: passed to every forward.

    Returns:
        an `AblationResult`.

    Raises:
        ValueError: an unknown method, no reference for "resample", a reference of other positions,
            or as `activation_patching`.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    inputs = as_inputs(inputs, "inputs")
    if method == "resample" and reference is None:
        raise ValueError("method='resample' needs reference=: another batch of inputs with the same positions")
    ref = as_inputs(reference, "reference") if reference is not None else inputs
    _check_reference(inputs, ref)
    names = list(select_points(model, points))
    with torch.no_grad():
        output, calls = recorded(model, inputs, names, kwargs)
        source = _source(model, method, inputs, ref, names, generator, kwargs)
        values, columns, axis = sweep(model, inputs, metric, names, by, calls, source, kwargs)
    return AblationResult(values, names, columns, axis, score(metric, output), method)


def _source(model: nn.Module, method: str, inputs: tuple[Tensor, ...], ref: tuple[Tensor, ...], names: list[str],
            generator: torch.Generator | None, kwargs: dict) -> Callable[[str], Callable[[int, Tensor], Tensor]]:
    """name -> (call k, activation) -> the activation that the ablated piece is taken from."""
    if method == "zero":
        return lambda name: lambda k, a: torch.zeros_like(a)
    _, ref_calls = recorded(model, ref, names, kwargs)
    if method == "mean":
        means = {n: [c.mean(0, keepdim=True) for c in cs] for n, cs in ref_calls.items()}  # per position
        return lambda name: lambda k, a: means[name][k].expand_as(a)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    rows = torch.randint(ref[0].shape[0], (inputs[0].shape[0],), generator=generator)  # the reference row of each row
    return lambda name: lambda k, a: ref_calls[name][k][rows.to(a.device)]
