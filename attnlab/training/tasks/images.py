"""Image classification as a task of the one training loop (attnlab.training.tasks.protocol).

    task = ImageClassificationTask(x_train, y_train, batch_size=64, valid=(x_test, y_test), seed=0)
    Trainer(config, task=task, model=VisionEncoder(VisionConfig())).fit()

The task's batches and loss serve any model that maps images (B, C, H, W) to logits (B, K):
the ViT of attnlab.models.vision, or a convolutional or MLP baseline in a loop of its own (as
examples/vit_digits does). The Trainer itself takes an attnlab model: it reads the model's
config (d_model for the schedule, the config saved with each checkpoint). The loss of a batch is the mean cross-entropy
over its images, so its weight (attnlab.training.tasks.protocol) is the number of images.

Data order: epoch e visits the training images in the e-th permutation drawn from a generator
seeded with `seed`; a batch that crosses an epoch's end continues in the next one. The position
(epochs begun, index in the current one) is the task's checkpoint state; the random shifts of
`max_shift` come from the trainer's data generator, which the Trainer saves too, so a resumed run
takes the same batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.images import random_shift
from attnlab.training.tasks.batch_loss import autocast
from attnlab.training.tasks.protocol import StepLoss, Task

__all__ = ["ImageClassificationTask", "evaluate_images"]


def _check_pair(name: str, images: Tensor, labels: Tensor) -> None:
    if images.dim() != 4 or not images.is_floating_point():
        raise ValueError(f"{name}: images must be a float tensor (N, C, H, W), got {images.dtype} "
                         f"of shape {tuple(images.shape)}")
    if labels.dim() != 1 or labels.is_floating_point() or len(labels) != len(images):
        raise ValueError(f"{name}: labels must be an integer tensor (N,) with N = {len(images)} images, got "
                         f"{labels.dtype} of shape {tuple(labels.shape)}")
    if len(labels) == 0:
        raise ValueError(f"{name}: no images")


@torch.no_grad()
def evaluate_images(model: nn.Module, images: Tensor, labels: Tensor, *, batch_size: int = 512,
                    device: torch.device | None = None, precision: str = "fp32") -> dict[str, float]:
    """Mean cross-entropy (`val_loss`) and `accuracy` of `model` on all the images, in eval mode
    (dropout off; the caller's mode is restored)."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    loss_sum, right = 0.0, 0
    try:
        for start in range(0, len(images), batch_size):
            x = images[start:start + batch_size].to(device)
            y = labels[start:start + batch_size].to(device)
            with autocast(precision, device):
                logits = model(x)
            loss_sum += float(F.cross_entropy(logits.float(), y, reduction="sum"))
            right += int((logits.argmax(-1) == y).sum())
    finally:
        model.train(was_training)
    return {"val_loss": loss_sum / len(images), "accuracy": right / len(images)}


class ImageClassificationTask(Task):
    """Labelled images and a cross-entropy loss on the model's logits.

    Args:
        images: training images (N, C, H, W), float.
        labels: their classes (N,), integers.
        batch_size: images per micro-batch.
        valid: (images, labels) evaluated by `evaluate` (loss and accuracy), or None (no validation).
        seed: seeds the epoch order.
        max_shift: augment each training image by a random translation of up to this many pixels
            (attnlab.data.images.random_shift); 0 = none.

    Raises:
        ValueError: mismatched or empty images and labels, or batch_size / max_shift out of range.
    """

    def __init__(self, images: Tensor, labels: Tensor, *, batch_size: int = 64,
                 valid: tuple[Tensor, Tensor] | None = None, seed: int = 0, max_shift: int = 0):
        _check_pair("train", images, labels)
        if valid is not None:
            _check_pair("valid", *valid)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_shift < 0:
            raise ValueError(f"max_shift must be >= 0, got {max_shift}")
        self.images, self.labels, self.valid = images, labels, valid
        self.batch_size, self.seed, self.max_shift = batch_size, seed, max_shift
        self.load_state_dict({})

    # ---------------------------------------------------------------- data
    def _next_epoch(self) -> None:
        self._order = torch.randperm(len(self.labels), generator=self._generator)
        self._epochs, self._pos = self._epochs + 1, 0

    def next_indices(self) -> Tensor:
        """The next `batch_size` indices in the seeded epoch order."""
        parts, need = [], self.batch_size
        while need:
            if self._pos >= len(self._order):
                self._next_epoch()
            take = self._order[self._pos:self._pos + need]
            self._pos += len(take)
            need -= len(take)
            parts.append(take)
        return torch.cat(parts)

    def train_batch(self, generator: torch.Generator) -> dict[str, Tensor]:
        """{"images": (B, C, H, W), "labels": (B,)}; `generator` draws the random shifts."""
        index = self.next_indices()
        return {"images": random_shift(self.images[index], self.max_shift, generator), "labels": self.labels[index]}

    def state_dict(self) -> dict[str, int]:
        return {"epochs": self._epochs, "pos": self._pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Go back to the position `state` names ({} = the start): replay the permutations drawn."""
        self._generator = torch.Generator().manual_seed(self.seed)
        self._order, self._epochs, self._pos = torch.empty(0, dtype=torch.long), 0, 0
        for _ in range(int(state.get("epochs", 0))):
            self._next_epoch()
        self._pos = int(state.get("pos", 0))

    # ---------------------------------------------------------------- loss
    def weight(self, batch: dict[str, Tensor]) -> int:
        return len(batch["labels"])

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> StepLoss:
        logits = model(batch["images"])  # (B, K)
        return StepLoss(F.cross_entropy(logits.float(), batch["labels"], label_smoothing=label_smoothing), {})

    def evaluate(self, model: nn.Module, device: torch.device, precision: str) -> dict[str, float]:
        """`val_loss` and `accuracy` on the whole validation set; {} without one."""
        if self.valid is None:
            return {}
        return evaluate_images(model, *self.valid, device=device, precision=precision)
