"""Read and replace any activation of any attnlab model by the name of its hook point.

Every model has hook points (`attnlab.nn.hook_points`): the residual stream before, between and
after each layer's sublayers, each attention's per-head queries, keys, values, pattern and
outputs, the feed-forward's hidden layer, a mixture of experts' router, the recurrent models'
alignment. `model.hook_points()` lists them by name; docs/how-to/inspect.md has the scheme.

    logits, cache = run_with_cache(model, ids)              # every point but the per-head results
    cache["layers.1.self_attn.hook_pattern"]                # (B, H, T, T)
    cache.stack("hook_resid_post")                          # (L, B, T, D), layer by layer

    def no_head_2(z, name):                                 # a hook gets the activation and its name
        z = z.clone(); z[:, 2] = 0; return z                # and returns a replacement (or None)
    with hooks(model, {"layers.0.self_attn.hook_z": no_head_2}):
        ablated = model(ids)

Names are exact or shell patterns (`layers.*.hook_resid_mid`). `hooks` removes what it installed on
leaving the block, after an error too. A point met more than once in a call (a decoding step per
token, the additive attention's step per target position) is recorded each time.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Callable, Union

import torch
from torch import Tensor, nn

from attnlab.nn.hook_points import HookPoint, hook_points

HookFn = Callable[[Tensor, str], Union[Tensor, None]]

# points whose activations are (B, heads, T, ...): their positions run along dim 2, not 1
_HEAD_POINTS = ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z", "hook_result")
# points over the flattened tokens of a call (a mixture of experts' router)
_TOKEN_POINTS = ("hook_router_logits", "hook_experts")


def select_points(model: nn.Module, names: Iterable[str] | str | None = None, *,
                  default_skip: tuple[str, ...] = ()) -> dict[str, HookPoint]:
    """The hook points of `model` matching any of `names` (exact names or shell patterns), in model
    order; None: every point except those whose last part is in `default_skip`.

    Raises:
        ValueError: the model has no hook point, or a name matches none (the message lists some).
    """
    found = hook_points(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no hook point")
    if names is None:
        return {n: p for n, p in found.items() if n.rsplit(".", 1)[-1] not in default_skip}
    chosen: set[str] = set()
    for pattern in [names] if isinstance(names, str) else names:
        chosen.update(_match(found, pattern, model))
    return {n: p for n, p in found.items() if n in chosen}


def _match(found: dict[str, HookPoint], pattern: str, model: nn.Module) -> list[str]:
    """The names in `found` that `pattern` names (exactly, or as a shell pattern)."""
    if pattern in found:
        return [pattern]
    hits = [n for n in found if fnmatch.fnmatchcase(n, pattern)]
    if not hits:
        sample = ", ".join(list(found)[:12])
        raise ValueError(f"{pattern!r} names no hook point of {type(model).__name__} ({len(found)} points, "
                         f"first: {sample}, ...; model.hook_points() lists them)")
    return hits


def _pairs(fns: Mapping[str, HookFn] | Iterable[tuple[str, HookFn]]) -> list[tuple[str, HookFn]]:
    pairs = list(fns.items()) if isinstance(fns, Mapping) else list(fns)
    for name, fn in pairs:
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(f"hooks take {{name or pattern: fn(activation, name)}}, got {name!r}: {fn!r}")
    return pairs


@contextmanager
def hooks(model: nn.Module, fns: Mapping[str, HookFn] | Iterable[tuple[str, HookFn]]) -> Iterator[nn.Module]:
    """Run `fn(activation, name)` at each named point inside the block; a fn that returns a tensor
    replaces the activation (the model goes on with it), None keeps it.

    Args:
        fns: {name or shell pattern: fn}, or (name, fn) pairs (several fns may share a point; they
            run in the order given, each on the previous one's result).

    Yields:
        the model.

    Raises:
        ValueError: a name matches no hook point. TypeError: an entry is not (str, callable).
    """
    installed = []
    found = hook_points(model)
    try:
        for pattern, fn in _pairs(fns):
            for name in _match(found, pattern, model):
                point = found[name]

                def run(module, args, output, fn=fn, name=name):
                    return fn(output, name)

                installed.append(point.register_forward_hook(run))
        yield model
    finally:
        for handle in installed:
            handle.remove()


class ActivationCache(Mapping):
    """Activations by hook-point name, as `run_with_cache` recorded them.

    `cache[name]` is the activation (the calls joined along the positions when a point was met
    more than once); `cache.calls(name)` gives them one by one; `cache.stack(suffix)` the same
    point of every layer, (L, ...).
    """

    def __init__(self) -> None:
        self._calls: dict[str, list[Tensor]] = {}

    def _add(self, name: str, value: Tensor) -> None:
        self._calls.setdefault(name, []).append(value)

    def calls(self, name: str) -> list[Tensor]:
        if name not in self._calls:
            raise KeyError(f"{name!r} was not recorded; recorded: {len(self._calls)} points "
                           f"({', '.join(list(self._calls)[:8])}, ...)")
        return self._calls[name]

    def __getitem__(self, name: str) -> Tensor:
        calls = self.calls(name)
        if len(calls) == 1:
            return calls[0]
        last = name.rsplit(".", 1)[-1]
        dim = 2 if last in _HEAD_POINTS else 0 if last in _TOKEN_POINTS else 1
        try:
            return torch.cat(calls, dim=dim)
        except RuntimeError:
            raise ValueError(f"{name} was met {len(calls)} times with shapes that do not join "
                             f"({[tuple(c.shape) for c in calls]}); use cache.calls(name)") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._calls)

    def __len__(self) -> int:
        return len(self._calls)

    def stack(self, suffix: str, prefix: str = "") -> Tensor:
        """The point `{prefix}layers.{i}.{suffix}` of every layer i recorded, stacked: (L, ...).

        Example: `cache.stack("hook_resid_post")`; in an encoder-decoder,
        `cache.stack("cross_attn.hook_pattern", prefix="decoder.")`.
        """
        found = {}
        for name in self._calls:
            head, sep, tail = name.partition("layers.")
            index, dot, rest = tail.partition(".")
            if sep and head == prefix and dot and rest == suffix and index.isdigit():
                found[int(index)] = self[name]
        if not found:
            raise KeyError(f"no recorded point {prefix}layers.<i>.{suffix}")
        return torch.stack([found[i] for i in sorted(found)])

    def to(self, device: Any) -> "ActivationCache":
        moved = ActivationCache()
        moved._calls = {n: [c.to(device) for c in cs] for n, cs in self._calls.items()}
        return moved


def run_with_cache(model: nn.Module, *inputs: Any, names: Iterable[str] | str | None = None,
                   detach: bool = True, **kwargs: Any) -> tuple[Any, ActivationCache]:
    """Run `model(*inputs, **kwargs)` once and record the activations at the named points.

    Args:
        names: exact names or shell patterns; None = every point except the per-head results
            (`*.hook_result`, (B, H, T, D) per attention: name them to have them).
        detach: record detached tensors (default); False keeps them in the autograd graph.

    Returns:
        (the model's output, an `ActivationCache`). Gradients are recorded as the caller's mode says
        (wrap the call in `torch.no_grad()` to save memory).
    """
    cache = ActivationCache()
    points = select_points(model, names, default_skip=("hook_result",))

    def record(activation: Tensor, name: str) -> None:
        cache._add(name, activation.detach() if detach else activation)

    with hooks(model, [(name, record) for name in points]):
        output = model(*inputs, **kwargs)
    return output, cache
