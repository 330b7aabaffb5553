"""The Vision Transformer (ViT; Dosovitskiy et al. 2021; attnlab.models.vision): an encoder over
image patches, classifying the image. Its config (`VisionConfig`) has no `arch`; the family is
found by the config's type.

    batch: images (B, C, H, W), labels (B,)
    loss:  cross-entropy of the (B, num_labels) logits
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config.families import FamilyTraits
from attnlab.models.families.base import Batch, Family, require
from attnlab.models.vision import VisionConfig, VisionEncoder


def batch_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
    require(batch, "images", "a Vision Transformer needs a batch with images (B, C, H, W) and labels (B,)")
    return F.cross_entropy(model(batch["images"]).float(), batch["labels"], label_smoothing=label_smoothing)


VISION = Family(
    name="vision", traits=FamilyTraits("Vision Transformer", heads=("classification", "none"), bidirectional=True),
    description="a Vision Transformer", build=VisionEncoder, batch_loss=batch_loss, first_input="images",
    config_type=VisionConfig,
)
