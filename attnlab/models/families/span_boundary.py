"""SpanBERT's span-boundary objective (SBO; Joshi et al. 2020, https://arxiv.org/abs/1907.10529,
3.2) as a loss term beside masked LM: loss = MLM + SBO, each the mean cross-entropy over its
targets.

A `span_masked_lm` batch made with `span_boundary=True` carries `span_left` and `span_right`
(B, T): for each masked token, the positions s - 1 and e + 1 just outside its span s..e (-1
where it has no target: not masked, or a span touching the row's edge or padding). The model's
SBO head (`model.sbo_head`, a `SpanBoundaryHead`, built for ModelConfig.sbo_head) maps the
encodings there and the token's place in the span to logits over the vocabulary, through the MLM
head's output matrix. Only the N targets go through it, and the output matrix is fused with the
loss (`losses.linear_cross_entropy`), so no (N, V) logits are formed in training.

    hidden = model.features(batch["input_ids"])
    loss = mlm_loss + sbo_loss(model, hidden, batch)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.losses import linear_cross_entropy

KEYS = ("span_left", "span_right")


def sbo_head_of(model: nn.Module) -> nn.Module:
    """The model's SBO head.

    Raises:
        ValueError: a model without one (the message says how to get it).
    """
    head = getattr(model, "sbo_head", None)
    if head is None:
        raise ValueError("a batch with span_left/span_right needs an encoder built with sbo_head=True "
                         "(data.span_boundary=true sets it for span_masked_lm runs)")
    return head


def _targets(batch: dict[str, Tensor]) -> Tensor:
    """The SBO targets (N,): the original ids at the positions with a span boundary, row-major."""
    return batch["labels"][batch["span_left"] >= 0]


def sbo_logits(model: nn.Module, hidden: Tensor, batch: dict[str, Tensor]) -> Tensor:
    """(N, V) logits of the batch's N SBO targets, in the order of `hidden[span_left >= 0]`."""
    return sbo_head_of(model)(hidden, batch["span_left"], batch["span_right"])


def sbo_loss(model: nn.Module, hidden: Tensor, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of the SBO targets (0 for a batch without any: nothing to predict).

    Args:
        model: an encoder with `sbo_head`.
        hidden: (B, T, D) its last hidden states on `batch["input_ids"]`.
        batch: with `labels`, `span_left`, `span_right`.
        label_smoothing: as the MLM term's.
    """
    head = sbo_head_of(model)
    target = _targets(batch)
    if not target.numel():
        return hidden.sum() * 0.0  # keeps the graph (and the head's gradients: none) for a batch with no target
    y = head.transform(hidden, batch["span_left"], batch["span_right"])
    return linear_cross_entropy(y, head.output_weight, target, head.output_bias, label_smoothing=label_smoothing)


@torch.no_grad()
def sbo_eval_sums(model: nn.Module, hidden: Tensor, batch: dict[str, Tensor]) -> dict[str, float]:
    """`sbo_loss_sum`, `sbo_correct` (argmax = target) and `sbo_count` over the batch's targets."""
    target = _targets(batch)
    if not target.numel():
        return {"sbo_loss_sum": 0.0, "sbo_correct": 0, "sbo_count": 0}
    logits = sbo_logits(model, hidden, batch).float()
    return {"sbo_loss_sum": float(F.cross_entropy(logits, target, reduction="sum")),
            "sbo_correct": int((logits.argmax(-1) == target).sum()), "sbo_count": int(target.numel())}


__all__ = ["KEYS", "sbo_eval_sums", "sbo_head_of", "sbo_logits", "sbo_loss"]
