"""Hook points: named places in a model's forward where an activation can be read or replaced.

A `HookPoint` is an identity module placed at one such place (the residual stream between two
sublayers, one attention's queries, its pattern, a feed-forward's hidden layer ...). Its forward
hooks see the activation and may return a replacement, which the model then uses:

    point = model.get_submodule("layers.1.hook_resid_mid")
    handle = point.register_forward_hook(lambda mod, args, out: out * 0)   # zero it
    ...
    handle.remove()

`attnlab.inspect.hooks` installs such hooks by name and always removes them (`hooks`,
`run_with_cache`). A model calls its points through `tap`, which skips the module call when a
point has no hook: with no hook registered, a forward or a decoding step costs what it did
before the points existed. The names are the points' module paths, listed by `hook_points(model)`
(every attnlab model also has it as a method); the scheme is in docs/how-to/inspect.md.
"""

from __future__ import annotations

from torch import Tensor, nn


class HookPoint(nn.Module):
    """The identity, at a named place of a forward, for hooks to read or replace what passes."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    @property
    def hooked(self) -> bool:
        """Whether a forward (pre-)hook is registered on this point."""
        return bool(self._forward_hooks or self._forward_pre_hooks)


def tap(point: HookPoint, x: Tensor) -> Tensor:
    """x through `point` when it is hooked (its hooks may replace it), else x itself, without a module call."""
    return point(x) if point._forward_hooks or point._forward_pre_hooks else x


def tap_row(point: HookPoint, x: Tensor) -> Tensor:
    """`tap` for a decoding step's (N, ...) activations, one new position per row: the point sees
    them as a forward's (N, 1, ...), so that one hook serves a whole forward and a decoding step."""
    return point(x[:, None])[:, 0] if point._forward_hooks or point._forward_pre_hooks else x


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of `model` by module path, in the order of definition."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}


class HasHookPoints:
    """Gives a model the method `hook_points()` (see `attnlab.nn.hook_points.hook_points`)."""

    def hook_points(self) -> dict[str, HookPoint]:
        """Every hook point of this model by name (its module path), in the order of definition."""
        return hook_points(self)  # type: ignore[arg-type]
