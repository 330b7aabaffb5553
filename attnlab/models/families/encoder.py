"""The encoder-only Transformer (BERT; Devlin et al. 2019): one stack attending both ways over
`input_ids` (with segments `token_type_ids`), pretrained by masked LM, with BERT's next-sentence
term (`nsp_labels`) and SpanBERT's span-boundary term (`span_left`/`span_right`) when the batch
carries them.

    batch: input_ids (B, T), labels (B, T) [, attention_mask, token_type_ids, nsp_labels (B,), span_left/right]
    loss:  MLM head on the picked rows (fused with the cross-entropy)
           + CE of the NSP head on the pooled [CLS]        (Devlin et al. 2019, appendix A.2)
           + SBO                                             (Joshi et al. 2020, 3.2; span_boundary.py)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.config.families import FAMILY_TRAITS
from attnlab.models.families.base import Batch, Family, head_loss, require
from attnlab.models.families.span_boundary import sbo_eval_sums, sbo_loss
from attnlab.models.heads import MLMHead, NSPHead, Pooler, span_boundary_head
from attnlab.models.parts import (embeddings, final_norm_of, head_of, init_transformer, position_module,
                                  record_token_ids, token_ids_of, transformer_layers)
from attnlab.models.transformer import Encoder
from attnlab.nn.losses import IGNORE


def build(cfg: ModelConfig) -> nn.Module:
    token = nn.Embedding(cfg.vocab_size, cfg.token_dim)
    ids = token_ids_of(cfg)
    embed = embeddings(cfg, token)
    model = Encoder(embed, transformer_layers(cfg, cfg.num_layers, cross=False, token_ids=ids),
                    final_norm=final_norm_of(cfg), position_bias=position_module(cfg, "bias"),
                    head=head_of(cfg, token), classifier_pooling=cfg.classifier_pooling,
                    pooler=Pooler(cfg.d_model) if cfg.pooler else None,
                    nsp_head=NSPHead(cfg.d_model) if cfg.nsp_head else None)
    if cfg.sbo_head:  # SpanBERT's span-boundary head, sharing the MLM head's output matrix
        model.sbo_head = span_boundary_head(cfg, model.head)
    record_token_ids(model, ids)
    return init_transformer(model, cfg)


def features(model: nn.Module, batch: Batch) -> tuple[nn.Module, Tensor]:
    require(batch, "input_ids", "a encoder needs a batch with input_ids and labels")
    return model, model.features(batch["input_ids"], batch.get("attention_mask"),
                                 token_type_ids=batch.get("token_type_ids"))


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


def batch_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
    stack, hidden = features(model, batch)
    loss = head_loss(stack, hidden, batch["labels"], label_smoothing)
    if "nsp_labels" in batch:  # BERT pretraining: loss = MLM + NSP
        nsp = nsp_logits(model, hidden, batch.get("attention_mask")).float()  # (B, 2)
        loss = loss + F.cross_entropy(nsp, batch["nsp_labels"])
    if "span_left" in batch:  # SpanBERT pretraining: loss = MLM + SBO
        loss = loss + sbo_loss(model, hidden, batch, label_smoothing=label_smoothing)
    return loss


@torch.no_grad()
def eval_sums(model: nn.Module, batch: Batch) -> dict[str, float]:
    """`loss_sum` and `tokens`; with an MLM head also `correct` (argmax = label at the picked
    positions), and `nsp_loss_sum`, `nsp_correct`, `nsp_count` for a batch with `nsp_labels`
    (the SBO's sums for one with `span_left`)."""
    labels = batch["labels"]
    keep = labels != IGNORE
    n = int(keep.sum())
    if not isinstance(model.head, MLMHead):
        return {"loss_sum": float(batch_loss(model, batch)) * n, "tokens": n}
    _, hidden = features(model, batch)
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


ENCODER = Family(
    name="encoder", traits=FAMILY_TRAITS["encoder"], description="an encoder",
    build=build, batch_loss=batch_loss, features=features, eval_sums=eval_sums,
    stage_inputs={"attention_mask": "input", "token_type_ids": "input"}, padding_mask="attention_mask",
    stacks=lambda cfg: (("", cfg.num_layers),),
    hf_model_types=("bert",),
)
