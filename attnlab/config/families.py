"""What a model family's config may ask for, as plain data: one `FamilyTraits` per `arch`.

`ModelConfig` validates against this table (which heads an arch takes, whether it may keep a
segment memory, ...) without importing a model. The families themselves (their loss, pipeline
inputs, decoding, Hugging Face mappings: `attnlab.models.families`) hold these traits and add
what needs torch; registering a family there adds its line here.

    traits("decoder").memory        # True: Transformer-XL's segment memory is for decoders
    traits("encoder").heads[0]      # 'none': the head an encoder gets when none is named
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FamilyTraits:
    """The config-level facts of one family.

    kind: what messages call its models (`a {kind} model`): `decoder-only`, `encoder`, ...
    heads: the `ModelConfig.head` values it takes; the first is its default.
    pooling: its default `classifier_pooling` (`first`: [CLS]; `last`: a causal stack's last token).
    bidirectional: one stack attending both ways (an encoder): bidirectional-only attention
        kernels, BERT's pooler, the layers of a ViT.
    has_source: reads a source sequence beside its target (`src_ids`): an encoder-decoder.
    recurrent: its layers are recurrent (`ModelConfig.rnn`), not Transformer layers: no experts,
        no attention kernel, no position table.
    memory: may keep Transformer-XL's segment memory (`memory_len`).
    """

    kind: str
    heads: tuple[str, ...]
    pooling: str = "first"
    bidirectional: bool = False
    has_source: bool = False
    recurrent: bool = False
    memory: bool = False


_PER_TOKEN_AND_POOLED = ("classification", "token_classification", "regression", "none")

# arch -> traits; `attnlab.models.families.register` adds a line for a new family
FAMILY_TRAITS: dict[str, FamilyTraits] = {
    "decoder": FamilyTraits("decoder-only", heads=("lm", *_PER_TOKEN_AND_POOLED), pooling="last", memory=True),
    "encoder": FamilyTraits("encoder", heads=("none", "mlm", *_PER_TOKEN_AND_POOLED[:-1]), bidirectional=True),
    "encoder_decoder": FamilyTraits("encoder-decoder", heads=("lm", "none"), has_source=True),
    "rnn_encoder_decoder": FamilyTraits("recurrent encoder-decoder", heads=("lm",), has_source=True, recurrent=True),
}


def traits(arch: Any) -> FamilyTraits | None:
    """The traits of `arch`, or None for a value that names no family (the config check says why)."""
    return FAMILY_TRAITS.get(arch) if isinstance(arch, str) else None


__all__ = ["FAMILY_TRAITS", "FamilyTraits", "traits"]
