"""Attention over image patches: the Vision Transformer (ViT; Dosovitskiy et al. 2021,
https://arxiv.org/abs/2010.11929) on attnlab's own encoder layers.

An image is broken into units the way text is broken into tokens: non-overlapping P x P patches,
each flattened and projected to a vector, read in raster order after a learned [CLS] vector.

    image (B, C, H, W) -- patchify --> (B, N, C P P)          N = (H / P) (W / P) patches
        -- Linear (C P P -> D) --> (B, N, D)                  = Conv2d(C, D, kernel=P, stride=P)
        -- [CLS; patches] + positions --> (B, 1 + N, D)       ViT eq. 1
        -- TransformerLayer x L (attnlab.models.build) --> (Norm) --> h (B, 1 + N, D)
        -- h[:, 0] ([CLS]; or the mean over the patches) --> ClassificationHead --> (B, num_labels)

The layers, final norm, position modules and head are the ones `attnlab.models.build` makes for a
text encoder from the same `ModelConfig` (`VisionConfig.encoder`): every kernel, score, norm
placement, activation and position scheme of the text models works here. Positions are 1-D (the
patch's raster index, [CLS] at 0), as in ViT, whose 2-D-aware variants did no better (its
appendix D.4). Notation: B batch, C channels, H = W image side, P patch side, N patches, T = 1 + N
tokens, D model width.

    cfg = VisionConfig(image_size=8, patch_size=2, channels=1)          # the default encoder: 10 classes
    model = VisionEncoder(cfg)
    logits = model(images)                                              # (B, 10)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.config.families import traits
from attnlab.config.load import from_dict, merge, to_dict
from attnlab.config.validate import ConfigError, check_types, choice, positive
from attnlab.config.model import MoEConfig
from attnlab.models.parts import HEADS, final_norm_of, init_weights, position_module, transformer_layers
from attnlab.nn.hook_points import HasHookPoints, HookPoint, tap

__all__ = ["VisionConfig", "VisionEncoder", "default_encoder", "patchify"]

POOLINGS = ("first", "mean")  # [CLS], or the mean over the patch tokens (ViT's "GAP" variant)

# ModelConfig fields about tokens that an image model has no place for: refused when set, so a
# config never promises a module that is not there (vocab_size, pad_token_id and the token
# embedding's scale are simply unused).
_TOKEN_ONLY = {"type_vocab_size": 0, "pooler": False, "nsp_head": False, "sbo_head": False, "embedding_scale": False}


def default_encoder(num_labels: int = 10) -> ModelConfig:
    """A small pre-LN ViT encoder (4 x 64, 4 heads, GELU, learned positions) for tiny images.

    `vocab_size` is 1 and unused: the model has no token table."""
    return ModelConfig(arch="encoder", vocab_size=1, pad_token_id=None, d_model=64, num_layers=4, num_heads=4,
                       d_ff=128, activation="gelu", norm_placement="pre", dropout=0.1,
                       position={"scheme": "learned"}, head="classification", num_labels=num_labels)


@dataclass
class VisionConfig:
    """A ViT: the image geometry plus the ModelConfig of its encoder layers.

    image_size: side of the (square) input images, in pixels.
    patch_size: side P of a patch; must divide image_size.
    channels: C, e.g. 1 for greyscale, 3 for RGB.
    encoder: the layers, width, heads, norm, positions and head, as for a text encoder
        (`arch` 'encoder'; `head` 'classification' (num_labels logits) or 'none' (hidden states);
        `classifier_pooling` 'first' ([CLS]) or 'mean' (over the patches)). A mapping, in a file
        or to the constructor, is merged into `default_encoder()`'s fields. Derived on
        construction: `position.max_len` = num_patches + 1, the fixed sequence length (a learned
        table is never larger than the positions it can see).
    """

    image_size: int = 8
    patch_size: int = 2
    channels: int = 1
    encoder: ModelConfig = field(default_factory=default_encoder)

    def __post_init__(self) -> None:
        if isinstance(self.encoder, dict):  # a mapping given to the constructor: merged as from_dict merges it
            self.encoder = self.expand_dict({"encoder": self.encoder})["encoder"]
        check_types(self)
        for name in ("image_size", "patch_size", "channels"):
            positive(name, getattr(self, name), integer=True)
        if self.image_size % self.patch_size:
            raise ConfigError("patch_size", f"{self.patch_size} does not divide image_size={self.image_size}: "
                              "patches must tile the image (pick a divisor, or resize the images)")
        self._check_encoder()
        if self.encoder.position.max_len != self.seq_len:  # derived: see the docstring
            position = dataclasses.replace(self.encoder.position, max_len=self.seq_len)
            self.encoder = dataclasses.replace(self.encoder, position=position)

    def _check_encoder(self) -> None:
        enc = self.encoder
        if not traits(enc.arch).bidirectional:
            raise ConfigError("encoder.arch", f"a ViT is a bidirectional encoder: expected 'encoder', got {enc.arch!r}")
        choice("encoder.head", enc.head, ("classification", "none"))
        choice("encoder.classifier_pooling", enc.classifier_pooling, POOLINGS)
        if enc.position.combine != "add":
            raise ConfigError("encoder.position.combine", f"{enc.position.combine!r} narrows a token table; "
                              "patch vectors are added to their positions: use 'add'")
        for name, unused in _TOKEN_ONLY.items():
            if getattr(enc, name) != unused:
                raise ConfigError(f"encoder.{name}", f"{getattr(enc, name)!r} concerns text tokens; an image "
                                  f"model has none: leave it {unused!r}")
        from attnlab.nn.kernels import kernel_class

        att = enc.attention
        if kernel_class(att.kernel).needs_token_ids(att.kernel_options):
            raise ConfigError("encoder.attention.kernel", f"{att.kernel!r} with these kernel_options picks tokens "
                              "by id; patches have no ids (use global_positions instead of global_token_id)")

    # ---- derived values -------------------------------------------------------------------
    @property
    def grid(self) -> int:
        """Patches per side, image_size / patch_size."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid

    @property
    def seq_len(self) -> int:
        """Tokens the encoder sees: [CLS] + the patches."""
        return 1 + self.num_patches

    @property
    def patch_dim(self) -> int:
        """Numbers in one flattened patch, C P P."""
        return self.channels * self.patch_size * self.patch_size

    @property
    def d_model(self) -> int:  # what the Trainer's schedule reads from `model.config`
        return self.encoder.d_model

    @property
    def moe(self) -> MoEConfig:  # what the Trainer's load-balance loss reads from `model.config`
        return self.encoder.moe

    # ---- plain data ------------------------------------------------------------------------
    @classmethod
    def expand_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An `encoder` mapping is merged into `default_encoder()`'s fields, so
        `{"encoder": {"num_layers": 2}}` means the default ViT encoder with two layers (a full
        mapping, as `to_dict` writes, replaces every field)."""
        if not isinstance(data.get("encoder"), dict):
            return data
        return {**data, "encoder": merge(default_encoder().to_dict(), data["encoder"])}

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VisionConfig":
        """Raises ConfigError naming the dotted field (`encoder.num_heads`, `patch_size`)."""
        return from_dict(cls, data)

    def to_json(self) -> str:
        from attnlab.io.files import json_text

        return json_text(self.to_dict(), indent=2, sort_keys=True)


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C P P): non-overlapping P x P patches in raster order (left to
    right, then top to bottom), each flattened channel-major as Conv2d's weight is laid out, so a
    Linear over the patches is a Conv2d with kernel = stride = P.

    Example: a 1 x 4 x 4 image with P = 2 gives 4 patches; patch 1 holds pixels (0, 2), (0, 3),
    (1, 2), (1, 3).

    Raises:
        ValueError: not a 4-D tensor, or H or W not divisible by P.
    """
    if images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    B, C, H, W = images.shape
    P = patch_size
    if H % P or W % P:
        raise ValueError(f"images of {H} x {W} pixels do not split into {P} x {P} patches")
    x = images.reshape(B, C, H // P, P, W // P, P)  # (B, C, gh, P, gw, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, P, P)
    return x.reshape(B, (H // P) * (W // P), C * P * P)


class VisionEncoder(HasHookPoints, nn.Module):
    """A ViT classifier (see the module docstring): `forward(images)` -> (B, num_labels) logits,
    or the hidden states (B, 1 + N, D) with encoder.head 'none'; `features(images)` -> hidden.

    Parameters: `patch_embed` (the patches' Linear), `cls_token` ((D,), zeros at start as in
    ViT), the position module of the scheme (`positions`, or `position_bias` for ALiBi/T5,
    or inside each attention for rotary/relative), `layers`, `final_norm`, `head`. Linear weights
    start as N(0, encoder.init_std), as `build_model` initialises them.
    """

    def __init__(self, config: VisionConfig):
        super().__init__()
        if not isinstance(config, VisionConfig):
            raise TypeError(f"VisionEncoder expects a VisionConfig, got {type(config).__name__}")
        cfg = config.encoder
        self.config = config
        self.patch_embed = nn.Linear(config.patch_dim, cfg.d_model)
        self.cls_token = nn.Parameter(torch.zeros(cfg.d_model))  # 1-D: no weight decay, as for other vectors
        self.positions = position_module(cfg, "embeddings")  # learned / sinusoidal / binary, or None
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(transformer_layers(cfg, cfg.num_layers, cross=False))
        self.final_norm = final_norm_of(cfg)
        self.position_bias = position_module(cfg, "bias")  # ALiBi / T5 bias, shared by all layers, or None
        self.head = HEADS[cfg.head](cfg, None)  # ClassificationHead, or None
        self.hook_embed, self.hook_final = HookPoint(), HookPoint()  # (B, 1 + N, D), as a text encoder's
        if not any(p.is_meta for p in self.parameters()):
            with torch.no_grad():
                init_weights(self, cfg.init_std)

    def _check(self, images: Tensor) -> None:
        c = self.config
        want = (c.channels, c.image_size, c.image_size)
        if not isinstance(images, Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != want \
                or not images.is_floating_point():
            got = (f"{images.dtype} of shape {tuple(images.shape)}" if isinstance(images, Tensor)
                   else type(images).__name__)
            raise ValueError(f"images must be a float tensor (B, {', '.join(map(str, want))}) "
                             f"(channels, image_size, image_size), got {got}")

    def embed(self, images: Tensor) -> Tensor:
        """The encoder's input (B, 1 + N, D): [CLS] then the patch vectors, plus absolute positions."""
        x = self.patch_embed(patchify(images, self.config.patch_size).to(self.patch_embed.weight.dtype))  # (B, N, D)
        h = torch.cat([self.cls_token.expand(x.shape[0], 1, -1).to(x.dtype), x], 1)  # (B, T, D)
        if self.positions is not None:
            h = h + self.positions(self._position_ids(h)).to(h.dtype)
        return self.dropout(h)

    def _position_ids(self, h: Tensor) -> Tensor:
        return torch.arange(h.shape[1], device=h.device)[None]  # (1, T): [CLS] 0, patch i at 1 + i

    def features(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> last hidden states (B, 1 + N, D); no padding, so no mask."""
        self._check(images)
        h = tap(self.hook_embed, self.embed(images))
        ids = self._position_ids(h)
        bias = self.position_bias(ids, ids) if self.position_bias is not None else None
        for layer in self.layers:
            h = layer(h, None, bias=bias, positions=ids, key_positions=ids)
        return tap(self.hook_final, self.final_norm(h) if self.final_norm is not None else h)

    def pool(self, hidden: Tensor) -> Tensor:
        """(B, 1 + N, D) -> (B, D): the [CLS] vector, or the mean over the patches."""
        return hidden[:, 0] if self.config.encoder.classifier_pooling == "first" else hidden[:, 1:].mean(1)

    def forward(self, images: Tensor) -> Tensor:
        hidden = self.features(images)
        return hidden if self.head is None else self.head(self.pool(hidden))
