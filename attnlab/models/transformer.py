"""Encoder, Decoder and EncoderDecoder: compositions of embeddings, layers and a head.

    Encoder:         ids -> Embeddings -> [TransformerLayer] x N -> (Norm) -> head   (BERT)
    Decoder:         same, with a causal mask and, inside an EncoderDecoder,
                     cross-attention to the encoder output                          (GPT)
    EncoderDecoder:  Encoder(src) -> memory; Decoder(tgt, memory) -> logits          (Vaswani, T5)

Forward contracts: an encoder returns hidden states (B, T, D) or its head's logits; a decoder
returns logits (B, T, V) (or (B, num_labels) with a classification head); an encoder-decoder
returns target logits (B, Tt, V). Padding masks are (B, T) with 1 on real tokens; position ids
count real tokens only, so outputs at real positions do not depend on padding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.embeddings import Embeddings
from attnlab.models.heads import ClassificationHead, pool
from attnlab.nn.layers import TransformerLayer
from attnlab.nn.masks import causal_mask, padding_mask, positions_from_mask, prefix_lm_mask


def _check_ids(name: str, ids: Tensor, vocab_size: int, attention_mask: Tensor | None, mask_name: str) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32, torch.int64):
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (B, T), got {shape}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name} is empty (T = 0)")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab_size}): "
                         f"min {int(ids.min())}, max {int(ids.max())}")
    if attention_mask is not None and attention_mask.shape != ids.shape:
        raise ValueError(f"{mask_name} must have the shape of {name} {tuple(ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")


class TransformerStack(nn.Module):
    """Embeddings, layers and a final norm; `features` runs them. Subclasses add the head."""

    causal = False

    def __init__(self, embed: Embeddings, layers: list[TransformerLayer], *, final_norm: nn.Module | None = None,
                 position_bias: nn.Module | None = None, head: nn.Module | None = None,
                 classifier_pooling: str = "first"):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.position_bias = position_bias  # ALiBi / T5 bias, computed once, shared by all layers
        self.head = head
        self.classifier_pooling = classifier_pooling

    @property
    def vocab_size(self) -> int:
        return self.embed.token.num_embeddings

    def self_mask(self, T: int, attention_mask: Tensor | None, prefix_lengths: Tensor | None) -> Tensor | None:
        """The bool (B or 1, 1, T, T) mask of the self-attention layers."""
        structure = None
        if prefix_lengths is not None:
            if not self.causal:
                raise ValueError("prefix_lengths applies to decoders; an encoder already sees every position")
            structure = prefix_lm_mask(T, prefix_lengths)
        elif self.causal:
            device = attention_mask.device if attention_mask is not None else None
            structure = causal_mask(T, device=device)[None, None]
        if attention_mask is None:
            return structure
        keys = padding_mask(attention_mask)
        return keys if structure is None else structure & keys

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                 position_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                 prefix_lengths: Tensor | None = None, memory: Tensor | None = None,
                 memory_mask: Tensor | None = None) -> Tensor:
        """Last hidden states (B, T, D)."""
        _check_ids("input_ids", input_ids, self.vocab_size, attention_mask, "attention_mask")
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = (positions_from_mask(attention_mask) if attention_mask is not None
                            else torch.arange(T, device=input_ids.device)[None])
        mask = self.self_mask(T, attention_mask, prefix_lengths)
        bias = self.position_bias(position_ids, position_ids) if self.position_bias is not None else None
        if memory_mask is not None and (memory is None or memory_mask.shape != memory.shape[:2]):
            raise ValueError(f"memory_mask must be (B, S) matching memory {tuple(memory.shape[:2]) if memory is not None else None}, "
                             f"got {tuple(memory_mask.shape)}")
        cross_mask = padding_mask(memory_mask) if memory_mask is not None else None
        h = self.embed(input_ids, position_ids, token_type_ids)
        for layer in self.layers:
            h = layer(h, mask, bias=bias, positions=position_ids, memory=memory, memory_mask=cross_mask)
        return self.final_norm(h) if self.final_norm is not None else h

    def apply_head(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        if self.head is None:
            return hidden
        if isinstance(self.head, ClassificationHead):
            return self.head(self.pool(hidden, attention_mask))
        return self.head(hidden)

    def pool(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, T, D) -> (B, D) as `classifier_pooling` says."""
        return pool(hidden, attention_mask, self.classifier_pooling)


class Encoder(TransformerStack):
    """Bidirectional stack (BERT). `forward(input_ids, attention_mask)` returns hidden states
    (B, T, D), or the head's logits: MLM (B, T, V), classification (B, num_labels)."""

    def __init__(self, *args, pooler: nn.Module | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pooler = pooler

    def pool(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        pooled = super().pool(hidden, attention_mask)
        return self.pooler(pooled) if self.pooler is not None else pooled

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                position_ids: Tensor | None = None, token_type_ids: Tensor | None = None) -> Tensor:
        hidden = self.features(input_ids, attention_mask, position_ids=position_ids, token_type_ids=token_type_ids)
        return self.apply_head(hidden, attention_mask)


class Decoder(TransformerStack):
    """Causal stack (GPT; the target side of an encoder-decoder).

    `forward(input_ids, attention_mask)` returns next-token logits (B, T, V). Inside an
    encoder-decoder, pass `memory` (B, S, D) and `memory_mask` (B, S). `prefix_lengths` (B,)
    makes the first positions bidirectional (prefix LM).
    """

    causal = True

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                position_ids: Tensor | None = None, prefix_lengths: Tensor | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None) -> Tensor:
        hidden = self.features(input_ids, attention_mask, position_ids=position_ids, prefix_lengths=prefix_lengths,
                               memory=memory, memory_mask=memory_mask)
        return self.apply_head(hidden, attention_mask)


class EncoderDecoder(nn.Module):
    """The original Transformer: `forward(src_ids, tgt_ids, src_mask, tgt_mask)` -> (B, Tt, V)."""

    def __init__(self, encoder: Encoder, decoder: Decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, D)."""
        return self.encoder.features(src_ids, src_mask)

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None = None,
               tgt_mask: Tensor | None = None) -> Tensor:
        """Target ids (B, T) attending to memory -> logits (B, T, V)."""
        return self.decoder(tgt_ids, tgt_mask, memory=memory, memory_mask=src_mask)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        return self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask, tgt_mask)
