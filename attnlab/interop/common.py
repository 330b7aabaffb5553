"""What every family converter shares: tensor-renaming rules and the check that a config can be expressed in the other library.

A converter is a list of `Rule`s. Each rule names some Hugging Face tensors and some attnlab
tensors and says how one side becomes the other (a rename, a transpose, a join of separate
q/k/v into attnlab's fused projection, a reshape of a (1, V) bias). Nothing else: anything that changes the computation
is a config field of attnlab's core, set by the converter's config mapping.

    hf state dict --state_from_hf(rules)--> attnlab state dict --io.load_state(model)--> model
    model.state_dict() --state_to_hf(rules)--> hf state dict

Tied tensors (a decoder's output matrix shared with its embedding, BART's shared vocabulary)
are named once by the rules; `attnlab.io.weights.load_state` fills every alias of a tensor
from any one of its names, and refuses two names of one tensor that disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.io.weights import alias_groups

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


def joined(hf: tuple[str, ...], ours: str, sizes: tuple[int, ...]) -> Rule:
    """Several Hugging Face tensors <-> one attnlab tensor that holds them one after the other
    along dim 0 (sizes: their lengths there): separate q, k, v projections <-> a fused `qkv_proj`,
    T5's wi_0, wi_1 <-> a gated feed-forward's `w13`."""
    return Rule(hf, (ours,), lambda ts: [torch.cat(ts, dim=0)],
                lambda ts: [c.contiguous() for c in ts[0].split(list(sizes), dim=0)])


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


def matcher(model_type: str, scheme: str | None = None) -> Callable[[Any], bool]:
    """A converter's `matches(cfg)`, how `to_hf` picks the converter of an attnlab config: whether
    the config's family converts to `model_type` (attnlab.models.families: `hf_model_types`) and,
    where two converters share a family, whether its positions are `scheme` (BART learned, Marian
    sinusoidal, T5 t5_bias)."""
    from attnlab.models.families import family

    def matches(cfg: Any) -> bool:
        return model_type in family(cfg).hf_model_types and (scheme is None or cfg.position.scheme == scheme)

    return matches


def lm_head(cfg: Any, embeddings: str, rules: list, derived: list) -> None:
    """A decoder's LM head into a conversion: tied to the token `embeddings` (Hugging Face's
    `lm_head.weight` derived from them) or its own weight, `head.proj.weight`; nothing for a model
    without an LM head."""
    if cfg.head != "lm":
        return
    if cfg.tie_embeddings:
        derived.append(copy_of("lm_head.weight", embeddings))
    else:
        rules.append(rename("lm_head.weight", "head.proj.weight"))
