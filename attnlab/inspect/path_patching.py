"""Path patching: the effect of one head through chosen receivers only (Wang et al. 2022,
"Interpretability in the Wild", section 3.1 and appendix B).

Activation patching a head's output measures everything downstream of it. Path patching keeps
only the paths that reach the receivers, in three forwards per sender head h:

    1. run the clean and the corrupted input, keep every head's output (hook_z)
    2. run the clean input with h's output taken from the corrupted run and every other head's
       output frozen at its clean value (feed-forward blocks are recomputed, so paths through them
       count, as in the paper; freeze_ffn=True freezes them too); record the receivers' activations
    3. run the clean input with only the receivers replaced by what step 2 recorded: the metric

Receivers are hook points, optionally restricted to some heads: a later head's query input
(`{"layers.3.self_attn.hook_q": [1]}`), its keys or values, or the final stream (`"hook_final"`,
or the last layer's `hook_resid_post`): with every head but h frozen, the change there is h's own
output, so the score is h's direct effect (in a pre-norm model, whose stream is a sum; under
post-norm each layer renormalises the stream, and the paths are no longer a sum). The score is `normalised_score`: 1 = the clean metric
(no effect through the receivers), 0 = as bad as the corrupted input.

    result = path_patching(model, clean, corrupted, logit_diff(mary, john), {"layers.3.self_attn.hook_q": None})
    result.values      # (attention modules, heads): the metric with each sender's path patched
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.inspect.hooks import hooks, select_points
from attnlab.nn.hook_points import hook_points
from attnlab.inspect.patching import (Inputs, Metric, PatchResult, as_inputs, check_same_shapes, recorded,
                                      replacing, score)

__all__ = ["path_patching"]



def _receivers(model: nn.Module, receivers: Any) -> dict[str, list[int] | None]:
    """{point name: heads (dim 1) or None for all of it}."""
    if isinstance(receivers, str):
        receivers = [receivers]
    if isinstance(receivers, Mapping):
        items = list(receivers.items())
    elif isinstance(receivers, Sequence) and receivers:
        items = [(r, None) for r in receivers]
    else:
        raise ValueError(f"receivers must name hook points (a name, a list, or {{name: heads}}), got {receivers!r}")
    out: dict[str, list[int] | None] = {}
    for pattern, heads in items:
        for name in select_points(model, pattern):
            out[name] = None if heads is None else [int(h) for h in heads]
    return out


def path_patching(model: nn.Module, clean: Inputs, corrupted: Inputs, metric: Metric, receivers: Any, *,
                  senders: Sequence[tuple[str, int]] | None = None, freeze_ffn: bool = False,
                  **kwargs: Any) -> PatchResult:
    """Each sender head's effect on `metric` through `receivers` only (module docstring).

    Args:
        model: an attnlab Transformer (its attentions' `hook_z` points are the heads' outputs).
        clean, corrupted: the model's inputs, of equal shapes.
        metric: the model's output -> a number.
        receivers: a point name or pattern, a list of them, or {name: head indices or None}.
        senders: (attention module name, head) pairs, e.g. ("layers.1.self_attn", 2); default every
            head of every attention. Cells of heads not sent are NaN.
        freeze_ffn: also freeze every feed-forward output (`hook_ffn_out`) at its clean value, so
            that only the direct paths through the residual stream count.
        **kwargs: passed to every forward.

    Returns:
        a `PatchResult` with rows = attention modules, columns = heads, direction "path".

    Raises:
        ValueError: unequal shapes, a model without per-head outputs, an unknown sender or receiver.
    """
    clean_in, corrupted_in = as_inputs(clean, "clean"), as_inputs(corrupted, "corrupted")
    check_same_shapes(clean_in, corrupted_in, ("clean", "corrupted"), "path patching copies activations position by position")
    try:
        z_names = list(select_points(model, "*hook_z"))
    except ValueError:
        raise ValueError(f"path patching needs per-head outputs (hook_z points); {type(model).__name__} has none") from None
    targets = _receivers(model, receivers)
    ffn_names = [n for n in hook_points(model) if n.endswith("hook_ffn_out")] if freeze_ffn else []  # none: attention-only
    modules = [n.rsplit(".", 1)[0] for n in z_names]
    with torch.no_grad():
        clean_out, clean_calls = recorded(model, clean_in, z_names + ffn_names, kwargs)
        corrupted_out, corrupted_calls = recorded(model, corrupted_in, z_names, kwargs)
        num_heads = max(c[0].shape[1] for c in (clean_calls[n] for n in z_names))
        chosen = _senders(senders, modules, {m: clean_calls[z][0].shape[1] for m, z in zip(modules, z_names)})
        values = torch.full((len(modules), num_heads), float("nan"), dtype=torch.float64)
        for row, head in chosen:
            values[row, head] = _one_sender(model, clean_in, metric, z_names[row], head, targets, clean_calls,
                                            corrupted_calls, ffn_names, kwargs)
    return PatchResult(values, modules, [f"h{h}" for h in range(num_heads)], "head", score(metric, clean_out),
                       score(metric, corrupted_out), "path", {"receivers": {n: h for n, h in targets.items()},
                                                              "freeze_ffn": freeze_ffn})


def _senders(senders: Sequence[tuple[str, int]] | None, modules: list[str], heads: dict[str, int]) -> list[tuple[int, int]]:
    if senders is None:
        return [(row, h) for row, m in enumerate(modules) for h in range(heads[m])]
    chosen = []
    for item in senders:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"senders are (attention module, head) pairs such as ('layers.1.self_attn', 2), got {item!r}")
        module, head = item
        if module not in heads:
            raise ValueError(f"sender {module!r} is not an attention with hook_z; the model's: {', '.join(modules)}")
        if not 0 <= int(head) < heads[module]:
            raise ValueError(f"sender head {head} of {module}: it has heads 0..{heads[module] - 1}")
        chosen.append((modules.index(module), int(head)))
    return chosen


def _one_sender(model: nn.Module, clean_in: tuple[Tensor, ...], metric: Metric, sender: str, head: int,
                targets: dict[str, list[int] | None], clean_calls: dict[str, list[Tensor]],
                corrupted_calls: dict[str, list[Tensor]], ffn_names: list[str], kwargs: dict) -> float:
    """Steps 2 and 3 of the module docstring for one sender head: the metric."""
    def frozen(name: str):
        def source(k: int, a: Tensor) -> Tensor:
            z = clean_calls[name][k].clone()
            if name == sender:
                z[:, head] = corrupted_calls[name][k][:, head]
            return z
        return replacing(lambda k: (...,), source)

    seen: dict[str, list[Tensor]] = {n: [] for n in targets}
    fns = [(n, frozen(n)) for n in clean_calls if n.endswith("hook_z")]
    fns += [(n, replacing(lambda k: (...,), lambda k, a, n=n: clean_calls[n][k])) for n in ffn_names]
    fns += [(n, lambda a, name: seen[name].append(a.clone())) for n in targets]  # after the freezing, on the same point
    with hooks(model, fns):
        model(*clean_in, **kwargs)
    patch = []
    for name, heads in targets.items():
        index = (...,) if heads is None else (slice(None), heads)
        patch.append((name, replacing(lambda k, index=index: index, lambda k, a, name=name: seen[name][k])))
    with hooks(model, patch):
        return score(metric, model(*clean_in, **kwargs))
