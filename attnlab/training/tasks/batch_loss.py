"""The loss of one batch under a model of any family, with the output layer fused into the loss
(each family's `batch_loss`, attnlab.models.families: the decoder's LM loss, the encoder's
masked LM + NSP + SBO, the encoder-decoders' seq2seq loss), and the evaluation sums.

Only the rows that take a loss go through the output projection, in chunks
(`losses.linear_cross_entropy`), so the (B, T, V) logits are never formed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.families import family
from attnlab.nn.losses import IGNORE
from attnlab.training.setup.precision import autocast  # noqa: F401 (the forward-pass context; images, pretrain, recurrence and finetune import it from here)


def batch_loss(model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> Tensor:
    """Mean token cross-entropy of `batch` (an objective's output) under `model`: its family's loss.

    Raises:
        ValueError: a batch whose keys do not fit the model's family.
    """
    return family(model.config).batch_loss(model, batch, label_smoothing=label_smoothing)


@torch.no_grad()
def eval_sums(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, float]:
    """Sums over one batch for evaluation: `loss_sum` (token cross-entropy summed over label
    positions) and `tokens`; a masked-LM encoder adds `correct` (argmax = label at the picked
    positions); a batch with `nsp_labels` adds `nsp_loss_sum`, `nsp_correct` and `nsp_count`."""
    own = family(model.config).eval_sums
    if own is not None:
        return own(model, batch)
    n = int((batch["labels"] != IGNORE).sum())
    return {"loss_sum": float(batch_loss(model, batch)) * n, "tokens": n}


def count_tokens(batch: dict[str, Tensor]) -> int:
    """Input tokens a batch feeds the model (both sides for an encoder-decoder), for tokens/s; a
    batch without token ids (images) counts its examples."""
    if "src_ids" in batch:
        return int(batch["src_ids"].numel() + batch["tgt_ids"].numel())
    if "input_ids" in batch:
        return int(batch["input_ids"].numel())
    return int(batch["labels"].shape[0]) if "labels" in batch else 0


def to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
