"""`build_model(config)`: the one place a ModelConfig turns into modules (its family's `build`,
attnlab.models.families; the parts they compose: attnlab.models.parts)."""

from __future__ import annotations

from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.families import family
from attnlab.models.parts import HEADS  # noqa: F401 (the head registry, beside the builder that uses it)


def build_model(config: ModelConfig) -> nn.Module:
    """An Encoder, Decoder, EncoderDecoder or RNNEncoderDecoder as `config.arch` says, freshly initialised.

    Build on the meta device to count parameters without allocating them:
    `with torch.device("meta"): build_model(cfg)`.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(config).__name__}")
    model = family(config).build(config)
    model.config = config
    return model
