"""The model families, by the `arch` a config writes: what differs between a decoder, an encoder,
an encoder-decoder, a recurrent encoder-decoder and a Vision Transformer, each in its own file
(a `Family`: its build, batch loss, pipeline-stage inputs, decoding start, Hugging Face model
types, attention alignments). Code above the models asks `family(config)` instead of comparing
arch strings.

    family("decoder").decoding                 # 'prompt'
    family(model.config).batch_loss(model, batch)

Adding a family is one file that makes a `Family` and one `register` call (a line in `FAMILIES`
for a built-in one); `register` also adds its traits to the table `ModelConfig` validates
against (attnlab.config.families).
"""

from __future__ import annotations

from typing import Any

from attnlab.config.families import FAMILY_TRAITS
from attnlab.models.families.base import Family, head_loss
from attnlab.models.families.decoder import DECODER
from attnlab.models.families.encoder import ENCODER
from attnlab.models.families.encoder_decoder import ENCODER_DECODER
from attnlab.models.families.rnn_encoder_decoder import RNN_ENCODER_DECODER
from attnlab.models.families.vision import VISION

FAMILIES: dict[str, Family] = {f.name: f for f in (DECODER, ENCODER, ENCODER_DECODER, RNN_ENCODER_DECODER, VISION)}


def register(new: Family) -> Family:
    """Add a family (its `arch` to the configs too, unless it names its own `config_type`).

    Raises:
        ValueError: a family of that name is already registered.
    """
    if new.name in FAMILIES:
        raise ValueError(f"family {new.name!r} is already registered")
    FAMILIES[new.name] = new
    if new.config_type is None:
        FAMILY_TRAITS[new.name] = new.traits
    return new


def unregister(name: str) -> None:
    """Remove a family added by `register` (and its traits)."""
    FAMILIES.pop(name, None)
    FAMILY_TRAITS.pop(name, None)


def family(config_or_arch: Any) -> Family:
    """The family of a config (its `arch`, or its type for a config without one: a ViT's
    `VisionConfig`), or of an arch name.

    Raises:
        ValueError: no registered family fits; the message lists the known ones.
    """
    name = config_or_arch if isinstance(config_or_arch, str) else getattr(config_or_arch, "arch", None)
    if isinstance(name, str) and name in FAMILIES:
        return FAMILIES[name]
    for f in FAMILIES.values():
        if f.config_type is not None and isinstance(config_or_arch, f.config_type):
            return f
    what = repr(name) if name is not None else f"a {type(config_or_arch).__name__}"
    raise ValueError(f"arch {what} names no model family; known: {', '.join(FAMILIES)}")


__all__ = ["FAMILIES", "Family", "family", "head_loss", "register", "unregister"]
