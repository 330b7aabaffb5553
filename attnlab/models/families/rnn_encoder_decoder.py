"""The recurrent encoder-decoder (Sutskever et al. 2014; Bahdanau et al. 2015; Luong et al.
2015; attnlab.models.rnn): RNN/LSTM/GRU or convolutional encoder over `src_ids`, a recurrent
decoder over `tgt_ids` with attention over the encoder states. It trains on the encoder-decoder
objectives and batches; it has no Transformer layers (no pipeline stages, no cost model).

    loss:  encode(src) -> features(tgt, memory) -> the `out` projection on the labelled rows + CE
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.config.families import FAMILY_TRAITS
from attnlab.models.families.base import Batch, Family, require
from attnlab.models.families.encoder_decoder import SOURCE_BATCH
from attnlab.models.rnn import RNNEncoderDecoder
from attnlab.nn.losses import IGNORE, linear_cross_entropy


def build(cfg: ModelConfig) -> nn.Module:
    """torch's default RNN/Linear initialisation, embeddings N(0, 1/d_model)."""
    r = cfg.rnn
    model = RNNEncoderDecoder(cfg.vocab_size, cfg.d_model, r.hidden_size, cell=r.cell, attention=r.attention,
                              num_layers=r.num_layers, bidirectional=r.bidirectional,
                              src_vocab_size=None if cfg.share_embeddings else cfg.resolved_src_vocab_size,
                              conv_window=r.conv_window, attention_hidden=r.attention_hidden,
                              dropout=cfg.dropout, tie_embeddings=cfg.tie_embeddings)
    if not any(p.is_meta for p in model.parameters()):
        with torch.no_grad():
            for emb in {id(e): e for e in (model.src_embed, model.tgt_embed)}.values():
                nn.init.normal_(emb.weight, std=cfg.d_model**-0.5)
    return model


def batch_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
    require(batch, "src_ids", SOURCE_BATCH)
    memory = model.encode(batch["src_ids"], batch.get("src_mask"))
    hidden = model.features(batch["tgt_ids"], memory, batch.get("src_mask"), batch.get("tgt_mask"))
    keep = batch["labels"] != IGNORE
    return linear_cross_entropy(hidden[keep], model.out.weight, batch["labels"][keep], model.out.bias,
                                label_smoothing=label_smoothing)


RNN_ENCODER_DECODER = Family(
    name="rnn_encoder_decoder", traits=FAMILY_TRAITS["rnn_encoder_decoder"],
    description="a recurrent encoder-decoder", build=build, batch_loss=batch_loss, first_input="src_ids",
    decoding="source", is_alignment=lambda name: True,  # its one attention aligns target with source
)
