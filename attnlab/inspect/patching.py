"""Activation patching: which activations carry the difference between a clean and a corrupted input.

Run the model on a corrupted input (a name swapped, a fact changed) and copy one piece of the
clean run's activations into it: one layer's residual stream at one position, one head's output,
one head's pattern. When the piece restores the clean answer, the information the answer needs
passes there (Meng et al. 2022, "causal tracing"; Wang et al. 2022; Heimersheim & Nanda 2024 on
how to read the scores). Every piece is a slice of a hook point (`attnlab.inspect.hooks`), so the
sweep works on every family and kernel that has the points.

    metric = logit_diff(correct=mary, wrong=john)                    # at the last position
    result = activation_patching(model, clean_ids, corrupted_ids, metric, "layers.*.hook_resid_pre")
    result.values          # (L, T): the metric of each patched run
    result.normalised()    # (patched - corrupted) / (clean - corrupted): 1 = all of the effect restored

Directions: "denoise" (default) runs the corrupted input and copies from the clean run: what is
sufficient to restore the answer; "noise" runs the clean input and copies from the corrupted run:
what is necessary for it. The normalised score is the same formula in both: under noising, 1 is
"no harm" and 0 "as bad as the corrupted input".

Pieces (`by`): "position" slices a point along its positions (dim 1 of (B, T, ...) points, dim 2
of the per-head (B, H, T, ...) points; a point met once per decoding step, the additive
attention's alignment, joins its steps, one position each); "head" slices dim 1 of a per-head
point; under grouped-query attention hook_k and hook_v have G < H heads and the axis is
"kv_head": kv head g is read by the query heads g*H/G ... (g+1)*H/G - 1, which the column labels
name; "all" replaces the whole point.

Notation: B batch, T positions, H query heads, G key/value heads, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import torch
from torch import Tensor, nn

from attnlab.inspect.hooks import _HEAD_POINTS, _TOKEN_POINTS, hooks, run_with_cache, select_points

__all__ = ["BY", "DIRECTIONS", "Metric", "PatchResult", "activation_patching", "logit_diff", "normalised_score",
           "target_logprob", "target_prob"]

Inputs = Union[Tensor, Sequence[Tensor]]
Metric = Callable[[Tensor], Union[Tensor, float]]
BY = ("position", "head", "all")
DIRECTIONS = ("denoise", "noise")


# ---- metrics: the model's output -> one number (the mean over the batch) ----

def _rows(token: int | Sequence[int] | Tensor, batch: int, vocab: int, name: str, device: torch.device) -> Tensor:
    """`token` as (B,) ids on `device`: one id for every row, or one per row."""
    ids = torch.as_tensor(token).reshape(-1)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be token ids (int), got {ids.dtype}")
    if ids.numel() == 1:
        ids = ids.expand(batch)
    if ids.numel() != batch:
        raise ValueError(f"{name} must be one token id or one per batch row ({batch}), got {ids.numel()}")
    if bool((ids < 0).any() or (ids >= vocab).any()):
        raise ValueError(f"{name} holds ids outside the vocabulary 0..{vocab - 1}: {ids.tolist()}")
    return ids.long().to(device)


def _logits_at(output: Any, position: int) -> Tensor:
    if not isinstance(output, Tensor) or output.dim() != 3:
        shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(f"the metric expects the model's logits (B, T, V), got {shape}")
    if not -output.shape[1] <= position < output.shape[1]:
        raise ValueError(f"position {position} is outside the {output.shape[1]} output positions")
    return output[:, position].double()  # (B, V); float64 so that small differences of metrics survive


def logit_diff(correct: int | Sequence[int] | Tensor, wrong: int | Sequence[int] | Tensor, *,
               position: int = -1) -> Callable[[Tensor], Tensor]:
    """The metric logit[correct] - logit[wrong] at `position`, averaged over the batch.

    Args:
        correct: a token id, or one per batch row.
        wrong: the competing token id(s), likewise.
        position: the output position read (default the last: the next-token prediction).

    Returns:
        metric(logits (B, T, V)) -> a 0-d tensor.
    """
    def metric(logits: Tensor) -> Tensor:
        z = _logits_at(logits, position)
        rows = torch.arange(z.shape[0], device=z.device)
        good = _rows(correct, z.shape[0], z.shape[1], "correct", z.device)
        bad = _rows(wrong, z.shape[0], z.shape[1], "wrong", z.device)
        return (z[rows, good] - z[rows, bad]).mean()

    return metric


def target_logprob(target: int | Sequence[int] | Tensor, *, position: int = -1) -> Callable[[Tensor], Tensor]:
    """The metric log p(target) at `position` (log-softmax of the logits), averaged over the batch."""
    def metric(logits: Tensor) -> Tensor:
        z = _logits_at(logits, position).log_softmax(-1)
        return z[torch.arange(z.shape[0], device=z.device), _rows(target, z.shape[0], z.shape[1], "target", z.device)].mean()

    return metric


def target_prob(target: int | Sequence[int] | Tensor, *, position: int = -1) -> Callable[[Tensor], Tensor]:
    """The metric p(target) at `position`, averaged over the batch."""
    def metric(logits: Tensor) -> Tensor:
        p = _logits_at(logits, position).softmax(-1)
        return p[torch.arange(p.shape[0], device=p.device), _rows(target, p.shape[0], p.shape[1], "target", p.device)].mean()

    return metric


def normalised_score(patched: Tensor | float, clean: float, corrupted: float) -> Tensor:
    """(patched - corrupted) / (clean - corrupted): 0 = the corrupted run's metric, 1 = the clean
    run's; NaN where clean == corrupted (nothing to restore)."""
    patched = torch.as_tensor(patched, dtype=torch.float64)
    gap = clean - corrupted
    if gap == 0:
        return torch.full_like(patched, float("nan"))
    return (patched - corrupted) / gap


# ---- results ----

@dataclass
class PatchResult:
    """A sweep's metric per patched piece.

    Attributes:
        values: (rows, columns) float64, the metric of each patched run.
        rows: the hook points (or attention modules) swept, one per row.
        columns: a label per column: a position, "h{i}", "kv{g} (q a-b)", or "all".
        axis: what the columns run over: "position", "head", "kv_head" or "all".
        clean, corrupted: the metric of the unpatched clean and corrupted runs.
        direction: "denoise" (clean copied into the corrupted run) or "noise" (the reverse);
            path patching says "path".
    """

    values: Tensor
    rows: list[str]
    columns: list[str]
    axis: str
    clean: float
    corrupted: float
    direction: str
    notes: dict[str, Any] = field(default_factory=dict)

    def normalised(self) -> Tensor:
        """`normalised_score` of every cell: 1 = the clean metric, 0 = the corrupted one."""
        return normalised_score(self.values, self.clean, self.corrupted)


# ---- the machinery shared with ablation and path patching ----

def as_inputs(x: Inputs, name: str) -> tuple[Tensor, ...]:
    """A model's positional inputs as a tuple: one tensor, or (src_ids, tgt_ids)."""
    if isinstance(x, Tensor):
        return (x,)
    if isinstance(x, (tuple, list)) and x and all(isinstance(t, Tensor) for t in x):
        return tuple(x)
    raise ValueError(f"{name} must be a tensor of token ids or a tuple of the model's input tensors "
                     f"(src_ids, tgt_ids), got {type(x).__name__}")


def check_same_shapes(a: tuple[Tensor, ...], b: tuple[Tensor, ...], names: tuple[str, str], why: str) -> None:
    """Raise a ValueError naming both when the two input tuples differ in count or any shape."""
    if len(a) != len(b):
        raise ValueError(f"{names[0]} has {len(a)} input tensors and {names[1]} {len(b)}; give the same inputs")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            raise ValueError(f"{names[0]} and {names[1]} inputs must have equal shapes ({why}): {names[0]} input {i} "
                             f"is {tuple(x.shape)}, {names[1]} input {i} is {tuple(y.shape)}")


def position_dim(name: str) -> int:
    """The dim a point's positions run along (the one `ActivationCache` joins repeated calls on)."""
    last = name.rsplit(".", 1)[-1]
    return 2 if last in _HEAD_POINTS else 0 if last in _TOKEN_POINTS else 1


Select = Callable[[int], Union[tuple, None]]  # call index -> the index into that call's activation, or None


def components(model: nn.Module, name: str, calls: list[Tensor], by: str) -> tuple[str, list[tuple[str, Select]]]:
    """The pieces of point `name` (met in `calls`) that a sweep replaces one at a time: (axis, [(label, select)])."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, got {by!r}")
    last = name.rsplit(".", 1)[-1]
    if by == "all":
        return "all", [("all", lambda k: (...,))]
    if last in _TOKEN_POINTS:
        raise ValueError(f"{name} runs over the flattened tokens of a call; sweep it with by='all'")
    if by == "head":
        if last not in _HEAD_POINTS:
            raise ValueError(f"{name} has no head axis; by='head' takes per-head points "
                             f"({', '.join(_HEAD_POINTS)}), or use by='position'")
        n = calls[0].shape[1]
        axis, labels = "head", [f"h{h}" for h in range(n)]
        parent = name.rsplit(".", 1)[0]
        num_heads = getattr(_module(model, parent), "num_heads", n)
        if last in ("hook_k", "hook_v") and n != num_heads:  # grouped-query: G kv heads, H/G query heads each
            per = num_heads // n
            axis = "kv_head"
            labels = [f"kv{g} (q {g * per}-{(g + 1) * per - 1})" for g in range(n)]
        return axis, [(labels[h], lambda k, h=h: (slice(None), h)) for h in range(n)]
    dim = position_dim(name)
    pieces, offset = [], 0
    for k, call in enumerate(calls):
        for p in range(call.shape[dim]):
            pieces.append((str(offset + p), lambda j, k=k, p=p, dim=dim: (slice(None),) * dim + (p,) if j == k else None))
        offset += call.shape[dim]
    return "position", pieces


def _module(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def replacing(select: Select, source: Callable[[int, Tensor], Tensor]) -> Callable[[Tensor, str], Tensor | None]:
    """A hook fn that, at the k-th call of its point, sets the piece `select(k)` of the activation to
    the same piece of `source(k, activation)` (the rest, and calls where select is None, stay)."""
    count = [0]

    def fn(activation: Tensor, name: str) -> Tensor | None:
        k = count[0]
        count[0] += 1
        index = select(k)
        if index is None:
            return None
        new = source(k, activation)
        if new.shape != activation.shape:
            raise ValueError(f"{name}: the replacement is {tuple(new.shape)}, the activation {tuple(activation.shape)} "
                             "(the two runs differ in shape at this point)")
        out = activation.clone()
        out[index] = new.to(activation)[index]
        return out

    return fn


def score(metric: Metric, output: Any) -> float:
    value = metric(output)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"the metric must return one number (average over the batch), got shape {tuple(value.shape)}")
        value = value.item()
    return float(value)


def recorded(model: nn.Module, inputs: tuple[Tensor, ...], names: list[str], kwargs: dict) -> tuple[Any, dict[str, list[Tensor]]]:
    """One forward's output and the calls of each named point (a ValueError for a point it never met)."""
    output, cache = run_with_cache(model, *inputs, names=names, **kwargs)
    missing = [n for n in names if n not in cache]
    if missing:
        raise ValueError(f"{', '.join(missing[:4])} did not run in this forward (nothing to patch there)")
    return output, {n: cache.calls(n) for n in names}


def sweep(model: nn.Module, inputs: tuple[Tensor, ...], metric: Metric, names: list[str], by: str,
          calls: dict[str, list[Tensor]], source: Callable[[str], Callable[[int, Tensor], Tensor]],
          kwargs: dict) -> tuple[Tensor, list[str], str]:
    """Run `inputs` once per piece of each point, the piece replaced from `source(name)`; the metric grid."""
    grid, columns, first_axis = [], None, None
    for name in names:
        axis, pieces = components(model, name, calls[name], by)
        labels = [label for label, _ in pieces]
        if columns is not None and len(labels) != len(columns):
            raise ValueError(f"the points swept have different numbers of {axis}s ({names[0]}: {len(columns)}, "
                             f"{name}: {len(labels)}); sweep each side or kind of point on its own")
        columns, first_axis = (labels, axis) if columns is None else (columns, first_axis)
        row = []
        for _, select in pieces:
            with hooks(model, {name: replacing(select, source(name))}):
                row.append(score(metric, model(*inputs, **kwargs)))
        grid.append(row)
    return torch.tensor(grid, dtype=torch.float64), columns or [], first_axis or by


def activation_patching(model: nn.Module, clean: Inputs, corrupted: Inputs, metric: Metric,
                        points: str | Sequence[str], *, by: str = "position", direction: str = "denoise",
                        **kwargs: Any) -> PatchResult:
    """Patch each piece of each point from one run into the other and measure `metric`.

    Args:
        model: any attnlab model (its hook points name the places).
        clean: the model's inputs (ids, or (src_ids, tgt_ids)).
        corrupted: the other inputs, of the same shapes.
        metric: the model's output -> a number (`logit_diff`, `target_logprob`, `target_prob`, yours).
        points: hook point names or shell patterns, e.g. "layers.*.hook_resid_pre",
            "decoder.layers.*.cross_attn.hook_z", "hook_memory"; one row each, in model order.
        by: "position", "head" or "all" (module docstring).
        direction: "denoise" (run corrupted, copy from clean) or "noise" (run clean, copy from corrupted).
        **kwargs: passed to every forward (e.g. attention_mask).

    Returns:
        a `PatchResult`.

    Raises:
        ValueError: unequal input shapes, an unknown `by`/`direction`, a point that matches nothing or
            has no such axis, points with different numbers of columns.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    clean_in, corrupted_in = as_inputs(clean, "clean"), as_inputs(corrupted, "corrupted")
    check_same_shapes(clean_in, corrupted_in, ("clean", "corrupted"), "patching copies activations piece by piece")
    names = list(select_points(model, points))
    with torch.no_grad():
        clean_out, clean_calls = recorded(model, clean_in, names, kwargs)
        corrupted_out, corrupted_calls = recorded(model, corrupted_in, names, kwargs)
        clean_score, corrupted_score = score(metric, clean_out), score(metric, corrupted_out)
        base, base_calls, src_calls = ((corrupted_in, corrupted_calls, clean_calls) if direction == "denoise"
                                       else (clean_in, clean_calls, corrupted_calls))
        for name in names:
            if len(src_calls[name]) != len(base_calls[name]):
                raise ValueError(f"{name} was met {len(clean_calls[name])} times on the clean input and "
                                 f"{len(corrupted_calls[name])} on the corrupted one")
        values, columns, axis = sweep(model, base, metric, names, by, base_calls,
                                      lambda name: lambda k, a: src_calls[name][k], kwargs)
    return PatchResult(values, names, columns, axis, clean_score, corrupted_score, direction)
