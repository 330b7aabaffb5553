"""The loss of one batch, per architecture, with the output layer fused into the loss.

    decoder (causal / prefix LM):   features(input_ids, prefix_lengths) -> LM head + CE
    encoder (masked LM):            features(input_ids) -> MLM transform at picked positions -> CE
    encoder-decoder (seq2seq, T5):  encode(src) -> decoder features(tgt) -> LM head + CE

Only the rows that take a loss go through the output projection, in chunks
(`losses.linear_cross_entropy`), so the (B, T, V) logits are never formed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.heads import LMHead, MLMHead
from attnlab.training.losses import IGNORE, cross_entropy, linear_cross_entropy


def _head_loss(stack: nn.Module, hidden: Tensor, labels: Tensor, label_smoothing: float) -> Tensor:
    head = stack.head
    keep = labels != IGNORE
    if isinstance(head, LMHead):
        rows = hidden[keep] if not bool(keep.all()) else hidden.reshape(-1, hidden.shape[-1])
        return linear_cross_entropy(rows, head.proj.weight, labels[keep], head.proj.bias, label_smoothing=label_smoothing)
    if isinstance(head, MLMHead):
        rows = head.norm(head.act(head.dense(hidden[keep])))  # (N_picked, D)
        return linear_cross_entropy(rows, head.decoder.weight, labels[keep], head.decoder.bias,
                                    label_smoothing=label_smoothing)
    return cross_entropy(stack.apply_head(hidden, None), labels, label_smoothing=label_smoothing)


def batch_loss(model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> Tensor:
    """Mean token cross-entropy of `batch` (an objective's output) under `model`.

    Raises:
        ValueError: a batch whose keys do not fit the model's architecture.
    """
    arch = model.config.arch
    if arch == "encoder_decoder":
        if "src_ids" not in batch:
            raise ValueError("an encoder-decoder needs a batch with src_ids/tgt_ids/labels (seq2seq, span_corruption)")
        memory = model.encode(batch["src_ids"], batch.get("src_mask"))
        hidden = model.decoder.features(batch["tgt_ids"], batch.get("tgt_mask"), memory=memory,
                                        memory_mask=batch.get("src_mask"))
        return _head_loss(model.decoder, hidden, batch["labels"], label_smoothing)
    if "input_ids" not in batch:
        raise ValueError(f"a {arch} needs a batch with input_ids and labels")
    if arch == "decoder":
        hidden = model.features(batch["input_ids"], batch.get("attention_mask"),
                                prefix_lengths=batch.get("prefix_lengths"))
    else:
        hidden = model.features(batch["input_ids"], batch.get("attention_mask"),
                                token_type_ids=batch.get("token_type_ids"))
    return _head_loss(model, hidden, batch["labels"], label_smoothing)


def count_tokens(batch: dict[str, Tensor]) -> int:
    """Input tokens a batch feeds the model (both sides for an encoder-decoder), for tokens/s."""
    if "src_ids" in batch:
        return int(batch["src_ids"].numel() + batch["tgt_ids"].numel())
    return int(batch["input_ids"].numel())


def to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
