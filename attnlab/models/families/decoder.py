"""The decoder-only Transformer (GPT; Radford et al. 2018): one causal stack over `input_ids`,
trained on next-token prediction (a prefix LM with `prefix_lengths`, packed documents with
`document_ids`), generating by continuing a prompt.

    batch: input_ids (B, T), labels (B, T) [, attention_mask, prefix_lengths (B,), document_ids]
    loss:  features(input_ids) -> LM head on the labelled rows, fused with the cross-entropy
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.config.families import FAMILY_TRAITS
from attnlab.models.families.base import Batch, Family, head_loss, require
from attnlab.models.parts import (embeddings, final_norm_of, head_of, init_transformer, position_module,
                                  record_token_ids, token_ids_of, transformer_layers)
from attnlab.models.transformer import Decoder


def build(cfg: ModelConfig) -> nn.Module:
    token = nn.Embedding(cfg.vocab_size, cfg.token_dim)
    ids = token_ids_of(cfg)
    embed = embeddings(cfg, token)  # built first: the order parameters draw their initial values in
    model = Decoder(embed, transformer_layers(cfg, cfg.num_layers, cross=False, causal=True, token_ids=ids),
                    final_norm=final_norm_of(cfg), position_bias=position_module(cfg, "bias", causal=True),
                    head=head_of(cfg, token), classifier_pooling=cfg.classifier_pooling)
    record_token_ids(model, ids)
    return init_transformer(model, cfg)


def features(model: nn.Module, batch: Batch) -> tuple[nn.Module, Tensor]:
    require(batch, "input_ids", "a decoder needs a batch with input_ids and labels")
    return model, model.features(batch["input_ids"], batch.get("attention_mask"),
                                 prefix_lengths=batch.get("prefix_lengths"), document_ids=batch.get("document_ids"))


def batch_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
    stack, hidden = features(model, batch)
    return head_loss(stack, hidden, batch["labels"], label_smoothing)


DECODER = Family(
    name="decoder", traits=FAMILY_TRAITS["decoder"], description="a decoder-only model",
    build=build, batch_loss=batch_loss, features=features,
    stage_inputs={"attention_mask": "input", "prefix_lengths": None, "document_ids": "input"},
    stacks=lambda cfg: (("", cfg.num_layers),),
    decoding="prompt", hf_model_types=("gpt2", "llama", "mistral", "qwen2"),
)
