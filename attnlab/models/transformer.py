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
from attnlab.nn.kv_cache import KVCache, Step
from attnlab.nn.masks import causal_mask, padding_mask, positions_from_mask, prefix_lm_mask
from attnlab.nn.norms import apply_norm


def _check_ids(name: str, ids: Tensor, vocab_size: int) -> tuple[int, int]:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32, torch.int64):
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (B, T), got {shape}")
    if ids.numel() == 0:
        raise ValueError(f"{name} is empty: shape {tuple(ids.shape)}")
    lo, hi = (int(v) for v in torch.aminmax(ids))  # one host sync per call
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab_size}): min {lo}, max {hi}")
    return ids.shape[0], ids.shape[1]


def _share_rotary(layers: list[TransformerLayer]) -> None:
    """Let layers with equal rotary embeddings share one module (it holds no state-dict tensor),
    so that a decoding step computes the rotation of its position once, not once per layer."""
    rotary = [layer.self_attn.rotary for layer in layers if getattr(layer.self_attn, "rotary", None) is not None]
    if not rotary or any(r.inv_freq.is_meta for r in rotary):
        return
    first = rotary[0]
    for layer in layers:
        r = layer.self_attn.rotary
        if r is not None and r is not first and type(r) is type(first) and r.rotary_dim == first.rotary_dim \
                and torch.equal(r.inv_freq, first.inv_freq):
            layer.self_attn.rotary = first


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
        # kernels with a sparse pattern apply causality themselves: a decoder then needs no dense (T, T) mask
        self.kernel_is_causal = self.causal and any(layer.self_attn.kernel.supports.pattern for layer in self.layers)
        _share_rotary(self.layers)

    @property
    def vocab_size(self) -> int:
        return self.embed.token.num_embeddings

    def self_mask(self, T: int, attention_mask: Tensor | None, prefix_lengths: Tensor | None,
                  past: int = 0) -> Tensor | None:
        """The bool (B or 1, 1, T, past + T) mask of the self-attention layers for T new
        queries after `past` cached positions."""
        device = attention_mask.device if attention_mask is not None else None
        structure = None
        if prefix_lengths is not None:
            if not self.causal:
                raise ValueError("prefix_lengths applies to decoders; an encoder already sees every position")
            structure = prefix_lm_mask(past + T, prefix_lengths)[:, :, past:]
        elif self.causal and not (self.kernel_is_causal and past == 0):
            structure = causal_mask(T, past + T, device=device)[None, None]
        if attention_mask is None:
            return structure
        keys = padding_mask(attention_mask)
        return keys if structure is None else structure & keys

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                 position_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                 prefix_lengths: Tensor | None = None, memory: Tensor | None = None,
                 memory_mask: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Last hidden states (B, T, D).

        With a `cache` (decoders), `input_ids` are the new tokens only, `attention_mask` covers
        the cached and the new ones (B, past + T), and the cache is extended in place.
        """
        past = cache.length if cache is not None else 0
        B, T = _check_ids("input_ids", input_ids, self.vocab_size)
        if attention_mask is not None and tuple(attention_mask.shape) != (B, past + T):
            raise ValueError(f"attention_mask must have shape (B, past + T) = {(B, past + T)}, "
                             f"got {tuple(attention_mask.shape)}")
        if cache is not None and past + T > cache.max_len:
            raise ValueError(f"the KV cache holds {cache.max_len} positions; {past + T} requested "
                             "(create the cache with a larger max_len)")
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, past:]
            else:
                position_ids = torch.arange(past, past + T, device=input_ids.device)[None]
        key_positions = cache.track_positions(position_ids.expand(B, T)) if cache is not None else position_ids
        mask = self.self_mask(T, attention_mask, prefix_lengths, past)
        bias = self.position_bias(position_ids, key_positions) if self.position_bias is not None else None
        if memory_mask is not None and (memory is None or memory_mask.shape != memory.shape[:2]):
            raise ValueError(f"memory_mask must be (B, S) matching memory {tuple(memory.shape[:2]) if memory is not None else None}, "
                             f"got {tuple(memory_mask.shape)}")
        cross_mask = padding_mask(memory_mask) if memory_mask is not None else None
        h = self.embed(input_ids, position_ids, token_type_ids)
        for i, layer in enumerate(self.layers):
            h = layer(h, mask, bias=bias, positions=position_ids, key_positions=key_positions, memory=memory,
                      memory_mask=cross_mask, cache=cache.layer(i) if cache is not None else None)
        return self.final_norm(h) if self.final_norm is not None else h

    def step(self, tokens: Tensor, cache: KVCache, *, attention_mask: Tensor | None = None,
             memory: Tensor | None = None, memory_mask: Tensor | None = None) -> Tensor:
        """The decoding fast path of `features`: one new token per row after the tokens the
        cache holds -> its last hidden state (N, D).

        The same modules as `features`, without what one new token does not need: no id, shape
        or capacity checks but one, the positions continued from the cache, the mask and the
        position bias built once for all layers, activations (N, D) and weights in their
        inference layout (`attnlab.nn.linear`).

        Args:
            tokens: (N,) the new tokens.
            cache: the KVCache that `features(..., cache=cache)` filled with the prompt.
            attention_mask: (N, L) True on real tokens so far (cached + new), or None when
                none is padding.
            memory: (N, S, D) the encoder output, inside an encoder-decoder (its keys/values
                were cached by the prompt's `features`).
            memory_mask: (N, 1, 1, S) bool source mask of the cross-attention (`padding_mask`
                of the source's (N, S) mask, built once per generation), or None.

        Raises:
            ValueError: the cache is full or empty.
        """
        positions, key_positions = cache.advance()  # (N, 1), (N, L)
        x = self.embed.step(tokens, positions)  # (N, D)
        mask = padding_mask(attention_mask) if attention_mask is not None else None  # (N, 1, 1, L)
        bias = None
        if self.position_bias is not None:  # one float mask: the bias, -inf on padded keys
            bias = self.position_bias(positions, key_positions).to(x.dtype)  # (N, H, 1, L)
            bias, mask = (bias if mask is None else torch.where(mask, bias, float("-inf"))), None
        step = Step(key_positions.shape[1], positions, key_positions, mask, bias, memory, memory_mask)
        for layer, kv in zip(self.layers, cache.layers):
            x = layer.step(x, kv, step)
        return apply_norm(self.final_norm, x) if self.final_norm is not None else x

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

    def __init__(self, *args, pooler: nn.Module | None = None, nsp_head: nn.Module | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pooler = pooler
        self.nsp_head = nsp_head  # next-sentence logits on self.pool(hidden) (BERT pretraining), or None

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
    makes the first positions bidirectional (prefix LM). With a `KVCache`, pass only the new
    tokens (and a mask over cached + new ones): the result holds their logits only.
    """

    causal = True

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                position_ids: Tensor | None = None, prefix_lengths: Tensor | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        hidden = self.features(input_ids, attention_mask, position_ids=position_ids, prefix_lengths=prefix_lengths,
                               memory=memory, memory_mask=memory_mask, cache=cache)
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
               tgt_mask: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Target ids (B, T) attending to memory -> logits (B, T, V); with a cache, the new
        target tokens only (the source keys/values are projected once and kept)."""
        return self.decoder(tgt_ids, tgt_mask, memory=memory, memory_mask=src_mask, cache=cache)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        return self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask, tgt_mask)
