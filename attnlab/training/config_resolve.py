"""What the data section implies for the model, applied once and said out loud.

A pretraining objective decides some model fields (`Objective.model_fields`): the stack it trains
(`model.arch`), its head, and with `data.nsp` BERT's segment embeddings, pooler and next-sentence
classifier, with `data.span_boundary` SpanBERT's span-boundary head. When a run config is read
(`TrainConfig.from_dict`) they are applied to the model section before it is validated:

    set by you (in the file or an override)     kept; a different value is refused, naming both fields
    left to a preset, a model folder or the     replaced, and reported: `model.arch: encoder
      defaults                                  (data.objective='masked_lm' implies it)`

A kernel that cannot run the stack the objective implies (Linformer is bidirectional only) is
refused here too, naming data.objective rather than an arch the user never wrote.

    resolved = TrainConfig.resolve(load_config_file("bert.yaml"), [("data.nsp", True)])
    resolved.config        # the TrainConfig the run trains
    resolved.implied       # (Implied("model.arch", "encoder", "data.objective='masked_lm'"), ...)

The pieces are here (attnlab.training.config imports them); `TrainConfig.resolve` puts them together.

`attnlab train` prints each implied setting once before it starts, and `--print-config` prints
them too (on stderr, beside the config on stdout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Collection, NamedTuple

from attnlab.config.families import traits
from attnlab.config.validate import ConfigError
from attnlab.training.data.objectives import NSP_FIELDS, OBJECTIVES

__all__ = ["Implied", "Resolved", "apply_objective", "objective_fields"]


@dataclass(frozen=True)
class Implied:
    """One model field the data section set: `field` (dotted), its `value`, and `cause`, the
    data setting that implies it (`data.objective='masked_lm'`)."""

    field: str
    value: Any
    cause: str

    def __str__(self) -> str:
        value = self.value if isinstance(self.value, str) else json.dumps(self.value)
        return f"{self.field}: {value} ({self.cause} implies it)"


class Resolved(NamedTuple):
    """A run config as the run will use it, and the model fields its data section implied."""

    config: Any  # TrainConfig
    implied: tuple[Implied, ...]


def objective_fields(objective: str, nsp: bool, arch: str, span_boundary: bool = False) -> dict[str, Any]:
    """The model fields a pretraining objective decides (`Objective.model_fields`): the stack
    (arch) and its head, and with NSP BERT's segment embeddings, pooler and next-sentence
    classifier. A recurrent encoder-decoder stays one (it trains on the encoder-decoder objectives).

    Raises:
        ConfigError: arch `rnn_encoder_decoder` with an objective that does not train an encoder-decoder.
    """
    spec = OBJECTIVES[objective]
    if recurrent(arch):
        if not traits(spec.arch).has_source:
            fits = " or ".join(repr(name) for name, o in OBJECTIVES.items() if traits(o.arch).has_source)
            raise ConfigError("model.arch", f"{arch!r} needs data.objective {fits}, got {objective!r}")
        return {"head": spec.head}
    return spec.model_fields(nsp, span_boundary)


def recurrent(arch: Any) -> bool:
    """Whether `arch` names a recurrent family (it keeps its arch under the encoder-decoder objectives)."""
    own = traits(arch)
    return own is not None and own.recurrent


def _show(value: Any) -> str:
    """A value as a config file writes it: 'encoder', true, 2."""
    return repr(value) if isinstance(value, str) else json.dumps(value)


def _cause(name: str, objective: str) -> str:
    """The data setting behind an implied model field."""
    if name in NSP_FIELDS:
        return "data.nsp=true"
    if name == "sbo_head":
        return "data.span_boundary=true"
    return f"data.objective={objective!r}"


def apply_objective(model: dict[str, Any], user_set: Collection[str], objective: str, nsp: bool,
                    span_boundary: bool) -> tuple[dict[str, Any], list[Implied]]:
    """The model section (plain data, a preset already merged in) with what the data implies.

    Args:
        model: the model section's fields.
        user_set: the fields the user gave (in the file or an override), not a preset's or a
            model folder's: a different value there is a conflict, not something to replace.
        objective, nsp, span_boundary: the data section's.

    Returns:
        (the model section with the implied fields, each field whose value that changed).

    Raises:
        ConfigError: a user-set field the data contradicts, naming it and the data field; an
            attention kernel that cannot run the stack the objective trains.
    """
    arch = model.get("arch", "decoder")
    fields = objective_fields(objective, nsp, arch, span_boundary)
    implied = []
    for name, value in fields.items():
        if model.get(name) == value:
            continue
        cause = _cause(name, objective)
        if name in user_set:
            raise ConfigError(f"model.{name}", f"{_show(model[name])} conflicts with {cause}, which needs "
                              f"model.{name}={_show(value)}; leave model.{name} out (the data sets it) or change "
                              f"{cause.split('=')[0]}")
        implied.append(Implied(f"model.{name}", value, cause))
    model = {**model, **fields}
    _check_kernel_runs_the_stack(model, user_set, objective)
    return model, implied


def _check_kernel_runs_the_stack(model: dict[str, Any], user_set: Collection[str], objective: str) -> None:
    """A bidirectional-only kernel (Linformer's projection along the sequence) cannot train the
    decoder or encoder-decoder an objective implies: named here by the objective, where the model's
    own check would name an arch the user never wrote."""
    attention = model.get("attention")
    kernel_name = attention.get("kernel") if isinstance(attention, dict) else None
    own = traits(model.get("arch"))
    if "arch" in user_set or not isinstance(kernel_name, str) or own is None or own.bidirectional:
        return  # an arch written by the user: the model's check names it
    from attnlab.nn.kernels import KERNELS  # the model's registry, read only here

    kernel = KERNELS.get(kernel_name)
    if kernel is not None and not kernel.supports.causal:
        encoders = " or ".join(repr(name) for name, o in OBJECTIVES.items() if traits(o.arch).bidirectional)
        kind = traits(model["arch"]).kind
        stack = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} model"
        raise ConfigError("model.attention.kernel", f"{kernel_name!r} is bidirectional only, and data.objective="
                          f"{objective!r} trains {stack}: use data.objective {encoders}, or another kernel")

