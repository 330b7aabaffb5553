"""What every family converter shares: tensor-renaming rules, a strict tie-aware loader,
and the check that a config can be expressed in the other library.

A converter is a list of `Rule`s. Each rule names some Hugging Face tensors and some attnlab
tensors and says how one side becomes the other (a rename, a transpose, a split of GPT-2's
fused q/k/v, a reshape of a (1, V) bias). Nothing else: anything that changes the computation
is a config field of attnlab's core, set by the converter's config mapping.

    hf state dict --state_from_hf(rules)--> attnlab state dict --load_state(model)--> model
    model.state_dict() --state_to_hf(rules)--> hf state dict

Tied tensors (a decoder's output matrix shared with its embedding, BART's shared vocabulary)
are named once by the rules; `load_state` fills every alias of a tensor from any one of its
names, and refuses two names of one tensor that disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

Convert = Callable[[list[Tensor]], list[Tensor]]


def _same(ts: list[Tensor]) -> list[Tensor]:
    return list(ts)


@dataclass(frozen=True)
class Rule:
    """`hf` tensors <-> `ours` tensors.

    Attributes:
        hf: Hugging Face names.
        ours: attnlab names.
        to_ours: hf tensors (in order) -> attnlab tensors (in order).
        to_hf: the inverse.
        fallback: Hugging Face names read instead when `hf` is absent (a tensor that older
            checkpoints store once under another name), never written.
    """

    hf: tuple[str, ...]
    ours: tuple[str, ...]
    to_ours: Convert = _same
    to_hf: Convert = _same
    fallback: tuple[str, ...] = ()


def rename(hf: str, ours: str) -> Rule:
    """The same tensor under two names."""
    return Rule((hf,), (ours,))


def transposed(hf: str, ours: str) -> Rule:
    """GPT-2's Conv1D stores (in, out); nn.Linear stores (out, in)."""
    flip: Convert = lambda ts: [ts[0].t().contiguous()]
    return Rule((hf,), (ours,), flip, flip)


def reshaped(hf: str, ours: str, hf_shape: Callable[[Tensor], tuple[int, ...]]) -> Rule:
    """One tensor, two shapes (BART's final_logits_bias is (1, V); attnlab's bias is (V,))."""
    return Rule((hf,), (ours,), lambda ts: [ts[0].reshape(-1)], lambda ts: [ts[0].reshape(hf_shape(ts[0]))])


def fused_qkv(hf: str, ours: tuple[str, str, str], *, conv1d: bool) -> Rule:
    """One fused (D, 3D) Conv1D weight, or (3D,) bias, <-> three q, k, v tensors."""

    def split(ts: list[Tensor]) -> list[Tensor]:
        t = ts[0].t() if conv1d and ts[0].dim() == 2 else ts[0]
        return [c.contiguous() for c in t.chunk(3, dim=0)]

    def join(ts: list[Tensor]) -> list[Tensor]:
        t = torch.cat(ts, dim=0)
        return [t.t().contiguous() if conv1d and t.dim() == 2 else t]

    return Rule((hf,), ours, split, join)


@dataclass
class Derived:
    """A Hugging Face tensor that carries no information of its own: a tied copy, a fixed
    table or a bookkeeping buffer. When present in a checkpoint it is checked (if `check`
    is given) and dropped; `make` produces it for a Hugging Face checkpoint that needs it."""

    name: str
    check: Callable[[Tensor, Mapping[str, Tensor]], str | None] | None = None
    make: Callable[[Mapping[str, Tensor]], Tensor] | None = None


def copy_of(name: str, source: str) -> Derived:
    """`name` is a tied copy of `source` (both Hugging Face names)."""

    def check(t: Tensor, hf: Mapping[str, Tensor]) -> str | None:
        if source in hf and (t.shape != hf[source].shape or not torch.equal(t, hf[source])):
            return f"{name} should be tied to {source} (the config says the tensors are tied) but differs"
        return None

    return Derived(name, check)


@dataclass
class Conversion:
    """A family converter's output for one config: rules and derived tensors."""

    rules: list[Rule]
    derived: list[Derived] = field(default_factory=list)


# ---- hf -> attnlab ------------------------------------------------------------------------------


def state_from_hf(hf: Mapping[str, Tensor], mapping: Conversion, *, source: str = "the checkpoint",
                  expected: Mapping[str, torch.Size] | None = None) -> dict[str, Tensor]:
    """Rename a Hugging Face state dict to attnlab names.

    Args:
        expected: attnlab name -> shape; a converted tensor of another shape is an error
            that names both the Hugging Face and the attnlab tensor.

    Raises:
        ValueError: a tensor the config needs is missing, a tensor is left over (unexpected),
            has the wrong shape, or a derived tensor fails its check; the message names the
            tensors and `source`.
    """
    used: set[str] = set()
    missing: list[str] = []
    out: dict[str, Tensor] = {}
    for rule in mapping.rules:
        names = rule.hf
        absent = [n for n in names if n not in hf]
        if absent and rule.fallback and all(n in hf for n in rule.fallback):
            names, absent = rule.fallback, []
        if absent:
            missing += absent
            continue
        try:
            tensors = rule.to_ours([hf[n] for n in names])
        except RuntimeError as err:  # e.g. a fused q/k/v that does not split in three
            raise ValueError(f"cannot convert {', '.join(rule.hf)} in {source}: {err}") from err
        for name, t in zip(rule.ours, tensors):
            want = expected.get(name) if expected is not None else None
            if want is not None and tuple(t.shape) != tuple(want):
                raise ValueError(f"shape mismatch for {', '.join(rule.hf)} in {source} (attnlab {name}): "
                                 f"expected {tuple(want)} from the config, got {tuple(t.shape)}")
        out.update(zip(rule.ours, tensors))
        used.update(names)
    if missing:
        raise ValueError(f"missing weight(s) in {source}: {', '.join(missing[:8])}"
                         + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    for d in mapping.derived:
        if d.name in hf:
            used.add(d.name)
            problem = d.check(hf[d.name], hf) if d.check is not None else None
            if problem:
                raise ValueError(f"{source}: {problem}")
    unexpected = sorted(set(hf) - used)
    if unexpected:
        raise ValueError(f"unexpected weight(s) in {source} (not part of this architecture/config): "
                         f"{', '.join(unexpected[:8])}" + (f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else ""))
    return out


# ---- attnlab -> hf ------------------------------------------------------------------------------


def state_to_hf(model: nn.Module, mapping: Conversion) -> dict[str, Tensor]:
    """attnlab model -> Hugging Face state dict (each tied tensor once, under its canonical name).

    Raises:
        ValueError: an attnlab tensor has no Hugging Face counterpart (the config uses a
            feature the family cannot express).
    """
    ours = model.state_dict()
    aliases = alias_groups(model)
    used: set[str] = set()
    out: dict[str, Tensor] = {}
    for rule in mapping.rules:
        absent = [n for n in rule.ours if n not in ours]
        if absent:
            raise ValueError(f"the attnlab model has no tensor {absent[0]!r} that the conversion needs")
        out.update(zip(rule.hf, rule.to_hf([ours[n].detach() for n in rule.ours])))
        for n in rule.ours:
            used.update(aliases.get(n, (n,)))
    for d in mapping.derived:
        if d.make is not None:
            out[d.name] = d.make(out)
    left = sorted(set(ours) - used)
    if left:
        raise ValueError(f"attnlab tensor(s) with no Hugging Face counterpart: {', '.join(left[:8])}")
    return {k: v.contiguous() for k, v in out.items()}


# ---- strict, tie-aware loading ------------------------------------------------------------------


def alias_groups(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """state-dict name -> every name of the same parameter (a tied tensor has several)."""
    by_param: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(p), []).append(name)
    groups: dict[str, tuple[str, ...]] = {}
    for names in by_param.values():
        for n in names:
            groups[n] = tuple(names)
    return groups


def load_state(model: nn.Module, state: Mapping[str, Tensor], *, source: str = "the weights") -> nn.Module:
    """Copy `state` into `model`, strictly: every tensor present once (ties: any one name),
    no extra names, matching shapes. The model is changed only if everything checks.

    Raises:
        ValueError: naming the missing, unexpected or mis-shaped tensor and `source`.
    """
    expected = model.state_dict(keep_vars=True)
    groups = alias_groups(model)
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"unexpected tensor(s) in {source}: {', '.join(unexpected[:8])}")
    plan: dict[str, Tensor] = {}
    missing = []
    for name, target in expected.items():
        names = groups.get(name, (name,))
        given = [n for n in names if n in state]
        if not given:
            missing.append(name)
            continue
        value = state[given[0]]
        for other in given[1:]:
            if state[other].shape != value.shape or not torch.equal(state[other], value):
                raise ValueError(f"{source}: {given[0]} and {other} are one tied tensor in this model but differ")
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"shape mismatch for {given[0]} in {source}: expected {tuple(target.shape)}, "
                             f"got {tuple(value.shape)}")
        plan[name] = value
    if missing:
        raise ValueError(f"missing tensor(s) in {source}: {', '.join(missing[:8])}"
                         + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    with torch.no_grad():
        for name, value in plan.items():
            expected[name].copy_(value)
    return model


# ---- config checks ------------------------------------------------------------------------------


def require(family: str, values: Mapping[str, Any], wanted: Mapping[str, Any | tuple]) -> None:
    """Raise ValueError listing every field whose value the family cannot express.

    Args:
        family: e.g. "GPT-2", for the message.
        values: field -> actual value (dotted names for sub-configs).
        wanted: field -> the value needed, or a tuple of allowed values.
    """
    bad = []
    for name, want in wanted.items():
        have = values[name]
        ok = have in want if isinstance(want, tuple) else have == want
        if not ok:
            bad.append(f"{name}={have!r} (needs {' or '.join(map(repr, want)) if isinstance(want, tuple) else repr(want)})")
    if bad:
        raise ValueError(f"this config cannot be expressed as a {family} model: {'; '.join(bad)}")


def flat_config(cfg: Any) -> dict[str, Any]:
    """A ModelConfig as one flat dict with dotted names for its sub-configs."""
    out: dict[str, Any] = {}
    for key, value in cfg.to_dict().items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def hf_get(hf: Mapping[str, Any], key: str, default: Any) -> Any:
    """hf[key], or the Hugging Face default when a config.json leaves it out."""
    value = hf.get(key, default)
    return default if value is None and default is not None else value


def pick_label_count(hf: Mapping[str, Any]) -> int:
    """num_labels of a Hugging Face config dict (stored as id2label)."""
    if "id2label" in hf and hf["id2label"]:
        return len(hf["id2label"])
    return int(hf.get("num_labels", 2))
