"""The encoder-decoder Transformer (Vaswani et al. 2017; T5, BART, Marian): an encoder over the
source `src_ids`, a causal decoder over the target `tgt_ids` attending to the encoder's output
(the memory), trained on seq2seq or span corruption, generating a target from a start token.

    batch: src_ids (B, S), tgt_ids (B, Tt), labels (B, Tt) [, src_mask, tgt_mask]
    loss:  encode(src) -> decoder features(tgt, memory) -> LM head on the labelled rows + CE

A pipeline cuts the encoder's layers and then the decoder's as one stack.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.config.families import FAMILY_TRAITS
from attnlab.models.families.base import Batch, Family, head_loss, require
from attnlab.models.parts import (embeddings, final_norm_of, head_of, init_transformer, position_module,
                                  record_token_ids, token_ids_of, transformer_layers)
from attnlab.models.transformer import Decoder, Encoder, EncoderDecoder

SOURCE_BATCH = "an encoder-decoder needs a batch with src_ids/tgt_ids/labels (seq2seq, span_corruption)"


def build(cfg: ModelConfig) -> nn.Module:
    token = nn.Embedding(cfg.vocab_size, cfg.token_dim)
    src_token = token if cfg.share_embeddings else nn.Embedding(cfg.resolved_src_vocab_size, cfg.token_dim)
    ids, dec_ids = token_ids_of(cfg), token_ids_of(cfg)
    embed = embeddings(cfg, src_token)
    encoder = Encoder(embed, transformer_layers(cfg, cfg.num_layers, cross=False, token_ids=ids),
                      final_norm=final_norm_of(cfg), position_bias=position_module(cfg, "bias"))
    embed = embeddings(cfg, token)
    layers = transformer_layers(cfg, cfg.resolved_decoder_layers, cross=True, causal=True, token_ids=dec_ids)
    decoder = Decoder(embed, layers,
                      final_norm=final_norm_of(cfg), position_bias=position_module(cfg, "bias", causal=True),
                      head=head_of(cfg, token))
    model = EncoderDecoder(encoder, decoder)
    record_token_ids(model.encoder, ids)
    record_token_ids(model.decoder, dec_ids)
    return init_transformer(model, cfg)


def features(model: nn.Module, batch: Batch) -> tuple[nn.Module, Tensor]:
    require(batch, "src_ids", SOURCE_BATCH)
    memory = model.encode(batch["src_ids"], batch.get("src_mask"))
    return model.decoder, model.decoder.features(batch["tgt_ids"], batch.get("tgt_mask"), memory=memory,
                                                 memory_mask=batch.get("src_mask"))


def batch_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
    stack, hidden = features(model, batch)
    return head_loss(stack, hidden, batch["labels"], label_smoothing)


ENCODER_DECODER = Family(
    name="encoder_decoder", traits=FAMILY_TRAITS["encoder_decoder"], description="an encoder-decoder",
    build=build, batch_loss=batch_loss, features=features, first_input="src_ids",
    stage_inputs={"src_mask": "input", "tgt_ids": "target", "tgt_mask": "target"}, padding_mask="src_mask",
    unstaged=frozenset({"prefix_lengths"}),  # encoder_decoder_lm's cuts, which an encoder-decoder does not read
    stacks=lambda cfg: (("encoder.", cfg.num_layers), ("decoder.", cfg.resolved_decoder_layers)),
    decoding="source", hf_model_types=("t5", "marian", "bart"),
    is_alignment=lambda name: name.endswith("cross_attn"),
)
