"""The loss of one batch, per architecture, with the output layer fused into the loss.

    decoder (causal / prefix LM):   features(input_ids, prefix_lengths) -> LM head + CE
    encoder (masked LM):            features(input_ids) -> MLM transform at picked positions -> CE
                                    (+ CE of the NSP head on the pooled [CLS] when the batch has nsp_labels)
    encoder-decoder (seq2seq, T5):  encode(src) -> decoder features(tgt) -> LM head + CE
    recurrent encoder-decoder:      encode(src) -> features(tgt, memory) -> model.out + CE

Only the rows that take a loss go through the output projection, in chunks
(`losses.linear_cross_entropy`), so the (B, T, V) logits are never formed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.heads import MLMHead, VocabularyHead
from attnlab.nn.losses import IGNORE, cross_entropy, linear_cross_entropy
from attnlab.training.setup.precision import autocast  # noqa: F401 (the forward-pass context; images, pretrain, recurrence and finetune import it from here)
from attnlab.training.tasks.span_boundary import sbo_eval_sums, sbo_loss


def _head_loss(stack: nn.Module, hidden: Tensor, labels: Tensor, label_smoothing: float) -> Tensor:
    head = stack.head
    keep = labels != IGNORE
    if isinstance(head, VocabularyHead):  # the head's transform on the picked rows, its output fused with the loss
        rows = hidden[keep] if not bool(keep.all()) else hidden.reshape(-1, hidden.shape[-1])
        return linear_cross_entropy(head.transform(rows), head.output_weight, labels[keep], head.output_bias,
                                    label_smoothing=label_smoothing)
    return cross_entropy(stack.apply_head(hidden, None), labels, label_smoothing=label_smoothing)


def batch_loss(model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> Tensor:
    """Mean token cross-entropy of `batch` (an objective's output) under `model`.

    Raises:
        ValueError: a batch whose keys do not fit the model's architecture.
    """
    arch = model.config.arch
    if arch in ("encoder_decoder", "rnn_encoder_decoder"):
        if "src_ids" not in batch:
            raise ValueError("an encoder-decoder needs a batch with src_ids/tgt_ids/labels (seq2seq, span_corruption)")
        memory = model.encode(batch["src_ids"], batch.get("src_mask"))
        if arch == "rnn_encoder_decoder":  # attnlab.models.rnn: hidden states, then the `out` projection
            hidden = model.features(batch["tgt_ids"], memory, batch.get("src_mask"), batch.get("tgt_mask"))
            keep = batch["labels"] != IGNORE
            return linear_cross_entropy(hidden[keep], model.out.weight, batch["labels"][keep], model.out.bias,
                                        label_smoothing=label_smoothing)
        hidden = model.decoder.features(batch["tgt_ids"], batch.get("tgt_mask"), memory=memory,
                                        memory_mask=batch.get("src_mask"))
        return _head_loss(model.decoder, hidden, batch["labels"], label_smoothing)
    if "input_ids" not in batch:
        raise ValueError(f"a {arch} needs a batch with input_ids and labels")
    if arch == "decoder":
        hidden = model.features(batch["input_ids"], batch.get("attention_mask"),
                                prefix_lengths=batch.get("prefix_lengths"), document_ids=batch.get("document_ids"))
    else:
        hidden = model.features(batch["input_ids"], batch.get("attention_mask"),
                                token_type_ids=batch.get("token_type_ids"))
    loss = _head_loss(model, hidden, batch["labels"], label_smoothing)
    if "nsp_labels" in batch:  # BERT pretraining: loss = MLM + NSP (Devlin et al. 2019, appendix A.2)
        nsp = nsp_logits(model, hidden, batch.get("attention_mask")).float()  # (B, 2)
        loss = loss + F.cross_entropy(nsp, batch["nsp_labels"])
    if "span_left" in batch:  # SpanBERT pretraining: loss = MLM + SBO (Joshi et al. 2020, 3.2)
        loss = loss + sbo_loss(model, hidden, batch, label_smoothing=label_smoothing)
    return loss


def nsp_logits(model: nn.Module, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Next-sentence logits (B, 2) from the last hidden states (B, T, D) of an encoder built
    with `nsp_head=True`: the NSP head on the pooled [CLS] (BERT's pooler when configured).

    Raises:
        ValueError: the model has no NSP head.
    """
    head = getattr(model, "nsp_head", None)
    if head is None:
        raise ValueError("a batch with nsp_labels needs an encoder built with nsp_head=True "
                         "(data.nsp=true sets it for masked_lm runs)")
    return head(model.pool(hidden, attention_mask))


@torch.no_grad()
def eval_sums(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, float]:
    """Sums over one batch for evaluation: `loss_sum` (token cross-entropy summed over label
    positions) and `tokens`; a masked-LM encoder adds `correct` (argmax = label at the picked
    positions); a batch with `nsp_labels` adds `nsp_loss_sum`, `nsp_correct` and `nsp_count`."""
    labels = batch["labels"]
    keep = labels != IGNORE
    n = int(keep.sum())
    if model.config.arch != "encoder" or not isinstance(model.head, MLMHead):
        return {"loss_sum": float(batch_loss(model, batch)) * n, "tokens": n}
    hidden = model.features(batch["input_ids"], batch.get("attention_mask"), token_type_ids=batch.get("token_type_ids"))
    logits = model.head(hidden[keep]).float()  # (N_picked, V)
    target = labels[keep]
    out = {"loss_sum": float(F.cross_entropy(logits, target, reduction="sum")), "tokens": n,
           "correct": int((logits.argmax(-1) == target).sum())}
    if "nsp_labels" in batch:
        nsp = nsp_logits(model, hidden, batch.get("attention_mask")).float()  # (B, 2)
        out.update(nsp_loss_sum=float(F.cross_entropy(nsp, batch["nsp_labels"], reduction="sum")),
                   nsp_correct=int((nsp.argmax(-1) == batch["nsp_labels"]).sum()), nsp_count=len(nsp))
    if "span_left" in batch:
        out.update(sbo_eval_sums(model, hidden, batch))
    return out


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
