"""Capture attention weights from chosen layers and heads of any attnlab model.

Mechanism (no flags inside `forward`, no side-effect attributes on the modules): for each
chosen `MultiHeadAttention`, a forward pre-hook (registered `with_kwargs=True`) sets
`need_weights=True` on that call only, and a forward hook reads `output[1]` (the
(B, H, Tq, Tk) weights) and hands the caller back what it asked for. Modules not chosen are
untouched and keep the fused kernel. The recurrent attentions of `attnlab.nn.rnn` always
return their weights ((B, 1, Tq, S), one query per decoder step); their hook only reads them.
The context manager removes every hook on exit, even after an error.

    with capture_attention(model, names=["decoder.layers.1.cross_attn"], heads=[0, 2]) as rec:
        model(src, tgt)
    w = rec["decoder.layers.1.cross_attn"]        # (B, 2, Tt, S)
"""

from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn

from attnlab.nn.attention import MultiHeadAttention


def _attention_types() -> tuple[type, ...]:
    from attnlab.nn.rnn import RecurrentAttention

    return (MultiHeadAttention, RecurrentAttention)


def attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every attention module of `model` by qualified name, in forward order of definition.

    Example names: `layers.0.self_attn` (decoder-only), `encoder.layers.1.self_attn`,
    `decoder.layers.0.cross_attn` (encoder-decoder), `attention` (recurrent models).
    """
    types = _attention_types()
    return {name: m for name, m in model.named_modules() if isinstance(m, types)}


def select_modules(model: nn.Module, names: Iterable[str] | str | None = None) -> dict[str, nn.Module]:
    """The attention modules whose names match any of `names` (exact or shell patterns such as
    `*.cross_attn` or `encoder.layers.0.*`); None selects all.

    Raises:
        ValueError: the model has no attention module, or a pattern matches none.
    """
    found = attention_modules(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention module to capture")
    if names is None:
        return found
    if isinstance(names, str):
        names = [names]
    chosen: dict[str, nn.Module] = {}
    for pattern in names:
        hits = [n for n in found if n == pattern or fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(f"names: {pattern!r} matches no attention module; available: {', '.join(found)}")
        chosen.update((n, found[n]) for n in hits)
    return {n: found[n] for n in found if n in chosen}  # keep model order


class AttentionRecord:
    """Weights captured per module name: one (B, H', Tq, Tk) tensor per forward call.

    `record[name]` joins the calls along the query axis when they have the same number of
    keys (a recurrent decoder's steps); `record.calls(name)` gives them one by one.
    """

    def __init__(self, heads: Sequence[int] | None):
        self.heads = None if heads is None else list(heads)
        self._calls: dict[str, list[Tensor]] = {}

    def _add(self, name: str, weights: Tensor) -> None:
        if self.heads is not None:
            if max(self.heads) >= weights.shape[1]:
                raise ValueError(f"heads={self.heads} but {name} has {weights.shape[1]} heads")
            weights = weights[:, self.heads]
        self._calls.setdefault(name, []).append(weights.detach())

    def names(self) -> list[str]:
        return list(self._calls)

    def calls(self, name: str) -> list[Tensor]:
        if name not in self._calls:
            raise KeyError(f"nothing captured for {name!r}; captured: {', '.join(self._calls) or 'none'}")
        return self._calls[name]

    def __getitem__(self, name: str) -> Tensor:
        calls = self.calls(name)
        if len(calls) == 1:
            return calls[0]
        if len({c.shape[-1] for c in calls}) != 1:
            raise ValueError(f"{name} was called {len(calls)} times with different key lengths; "
                             "use record.calls(name)")
        return torch.cat(calls, dim=-2)

    def __contains__(self, name: str) -> bool:
        return name in self._calls

    def as_dict(self) -> dict[str, Tensor]:
        return {n: self[n] for n in self._calls}

    def clear(self) -> None:
        self._calls.clear()


@contextmanager
def capture_attention(model: nn.Module, names: Iterable[str] | str | None = None,
                      heads: Sequence[int] | None = None) -> Iterator[AttentionRecord]:
    """Record the attention weights of the chosen modules during the forward calls inside the block.

    Args:
        model: any attnlab model (Transformer or recurrent).
        names: module names or shell patterns (see `select_modules`); None = every attention.
        heads: keep only these head indices (None = all).

    Yields:
        An `AttentionRecord`, filled as the model runs.

    Raises:
        ValueError: a pattern matches no module, or `heads` is empty / negative.
    """
    if heads is not None and (len(heads) == 0 or min(heads) < 0):
        raise ValueError(f"heads must be a non-empty list of head indices >= 0, got {heads!r}")
    chosen = select_modules(model, names)
    record = AttentionRecord(heads)
    handles = []
    for name, module in chosen.items():
        if isinstance(module, MultiHeadAttention):
            asked: list[bool] = []  # what each pending call asked for, so the caller gets exactly that

            def pre(mod, args, kwargs, asked=asked):
                asked.append(bool(kwargs.get("need_weights", False)))
                return args, {**kwargs, "need_weights": True}

            def post(mod, args, output, name=name, asked=asked):
                out, weights = output
                record._add(name, weights)
                return (out, weights) if asked.pop() else (out, None)

            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        else:
            def post(mod, args, output, name=name):
                record._add(name, output[1])
                return None
        handles.append(module.register_forward_hook(post))
    try:
        yield record
    finally:
        for h in handles:
            h.remove()


def attention_maps(model: nn.Module, *inputs: Tensor, names: Iterable[str] | str | None = None,
                   heads: Sequence[int] | None = None, **kwargs) -> dict[str, Tensor]:
    """Run `model(*inputs, **kwargs)` once without gradients and return {name: weights}.

    Weights are (B, H', Tq, Tk); for a recurrent decoder Tq is the target length.
    """
    with torch.no_grad(), capture_attention(model, names, heads) as record:
        model(*inputs, **kwargs)
    return record.as_dict()


def stack_layers(maps: dict[str, Tensor], batch_index: int = 0) -> tuple[list[str], Tensor]:
    """Same-shaped maps of one example as (names, (L, H, Tq, Tk)) for `attnlab.inspect.plots.plot_head_grid`.

    Raises:
        ValueError: the maps differ in shape (e.g. self- and cross-attention of different lengths).
    """
    names = list(maps)
    shapes = {tuple(maps[n].shape[1:]) for n in names}
    if len(shapes) != 1:
        raise ValueError(f"maps have different shapes {sorted(shapes)}; pass a subset with one shape")
    return names, torch.stack([maps[n][batch_index] for n in names])
