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

from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.models.embeddings import Embeddings
from attnlab.models.heads import ClassificationHead, pool
from attnlab.nn.hook_points import HasHookPoints, HookPoint, tap, tap_row
from attnlab.nn.layers import TransformerLayer
from attnlab.nn.kv_cache import KVCache, SegmentMemory, Step
from attnlab.nn.masks import (causal_mask, combine, document_mask, padding_mask, positions_from_documents,
                              positions_from_mask, prefix_lm_mask)
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


class LayerInputs(NamedTuple):
    """What every layer of a stack takes besides the hidden states, built once per forward
    (`TransformerStack.layer_inputs`)."""

    positions: Tensor  # (B or 1, T) the queries' position ids
    key_positions: Tensor  # (B or 1, K) the keys' (K = T, or more with a cache or segment memory)
    mask: Tensor | None  # bool self-attention mask, broadcastable to (B, H, T, K); None: all keys
    bias: Tensor | None  # the position bias added to the scores (ALiBi, T5), or None
    memory_mask: Tensor | None  # (B, 1, 1, S) bool cross-attention mask over the memory, or None


class TransformerStack(HasHookPoints, nn.Module):
    """Embeddings, layers and a final norm; `features` runs them. Subclasses add the head.

    Hook points (`hook_points()`): `hook_embed` (B, T, D) what the embeddings give the first layer,
    the layers' (`layers.{i}.hook_*`, `attnlab.nn.layers.TransformerLayer`), `hook_final` (B, T, D)
    the last hidden states (after the final norm, before the head).
    """

    causal = False
    # True: in a pass that records gradients, keep each layer's input only and recompute the layer
    # in backward (memory of one layer's activations, not N, for about one more forward); set by
    # the trainer (train.activation_checkpointing)
    activation_checkpointing = False

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
        self.hook_embed, self.hook_final = HookPoint(), HookPoint()
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
                 memory_mask: Tensor | None = None, cache: KVCache | None = None,
                 mems: SegmentMemory | None = None, document_ids: Tensor | None = None) -> Tensor:
        """Last hidden states (B, T, D).

        With a `cache` (decoders), `input_ids` are the new tokens only, `attention_mask` covers
        the cached and the new ones (B, past + T), and the cache is extended in place.
        With `mems` (decoders; Transformer-XL), the segment attends over the memory's M earlier
        positions too and the memory advances in place (`attnlab.nn.kv_cache.SegmentMemory`);
        with a cache as well (its first call only), the memory's keys/values are cached first.
        With `document_ids` (B, T) (decoders; rows packed with several documents, data.pack
        'document_masked'), a token attends within its own document only and positions restart at
        0 at each document's start (`attnlab.nn.masks.document_mask`, `positions_from_documents`).
        """
        past = cache.length if cache is not None else 0
        B, T = _check_ids("input_ids", input_ids, self.vocab_size)
        if document_ids is not None:
            self._check_documents(document_ids, B, T, incremental=cache is not None or mems is not None
                                  or prefix_lengths is not None)
        held = self._check_mems(mems, B, past, attention_mask, prefix_lengths) if mems is not None else 0
        if attention_mask is not None and tuple(attention_mask.shape) != (B, past + T):
            raise ValueError(f"attention_mask must have shape (B, past + T) = {(B, past + T)}, "
                             f"got {tuple(attention_mask.shape)}")
        if cache is not None and past + held + T > cache.max_len:
            raise ValueError(f"the KV cache holds {cache.max_len} positions; {past + held + T} requested "
                             "(create the cache with a larger max_len)")
        if memory_mask is not None and (memory is None or memory_mask.shape != memory.shape[:2]):
            raise ValueError(f"memory_mask must be (B, S) matching memory {tuple(memory.shape[:2]) if memory is not None else None}, "
                             f"got {tuple(memory_mask.shape)}")
        x = self.layer_inputs(B, T, attention_mask, position_ids=position_ids, prefix_lengths=prefix_lengths,
                              document_ids=document_ids, memory_mask=memory_mask, past=past, mems=mems if held else None,
                              cache=cache, device=input_ids.device)
        recompute = self.activation_checkpointing and torch.is_grad_enabled() and cache is None  # (a cache fills once)
        h = tap(self.hook_embed, self.embed(input_ids, x.positions, token_type_ids))
        for i, layer in enumerate(self.layers):
            mem = mems.exchange(i, h) if mems is not None else None  # layer i's memory; h joins the next one
            if recompute:  # the same call, its dropout masks drawn again from the saved RNG state in backward
                h = checkpoint(layer, h, x.mask, bias=x.bias, positions=x.positions, key_positions=x.key_positions,
                               memory=memory, memory_mask=x.memory_mask, mem=mem, use_reentrant=False)
                continue
            h = layer(h, x.mask, bias=x.bias, positions=x.positions, key_positions=x.key_positions, memory=memory,
                      memory_mask=x.memory_mask, cache=cache.layer(i) if cache is not None else None, mem=mem)
        if mems is not None:
            mems.commit()
        return tap(self.hook_final, self.final_norm(h) if self.final_norm is not None else h)

    def layer_inputs(self, B: int, T: int, attention_mask: Tensor | None = None, *, position_ids: Tensor | None = None,
                     prefix_lengths: Tensor | None = None, document_ids: Tensor | None = None,
                     memory_mask: Tensor | None = None, past: int = 0, mems: SegmentMemory | None = None,
                     cache: KVCache | None = None, device: torch.device | None = None) -> LayerInputs:
        """The positions, masks and position bias every layer takes, for B rows of T new positions after
        `past` cached ones (and a segment memory's, `mems`); `features` runs the layers on them, and
        so do a pipeline's stages (attnlab.parallel.pipeline), which hold a few of the layers.
        Arguments as `features`' (checked there); with a `cache`, it records the new key positions."""
        held = mems.length if mems is not None else 0
        if position_ids is None:
            if document_ids is not None:
                position_ids = positions_from_documents(document_ids)
            elif attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, past:]
            else:
                position_ids = torch.arange(past + held, past + held + T, device=device)[None]
        key_positions = mems.key_positions(position_ids) if held else position_ids  # (B or 1, held + T)
        if cache is not None:
            key_positions = cache.track_positions(key_positions.expand(B, -1))
        mask = self.self_mask(T, attention_mask, prefix_lengths, past + held)
        if document_ids is not None:  # block-diagonal: each document causal on its own
            mask = combine(document_mask(document_ids), mask)
        bias = self.position_bias(position_ids, key_positions) if self.position_bias is not None else None
        cross_mask = padding_mask(memory_mask) if memory_mask is not None else None
        return LayerInputs(position_ids, key_positions, mask, bias, cross_mask)

    def _check_documents(self, document_ids: Tensor, B: int, T: int, incremental: bool) -> None:
        """Refuse document ids where a per-row block-diagonal mask cannot apply."""
        if not isinstance(document_ids, Tensor) or tuple(document_ids.shape) != (B, T):
            shape = tuple(document_ids.shape) if isinstance(document_ids, Tensor) else type(document_ids).__name__
            raise ValueError(f"document_ids must have shape (B, T) = {(B, T)}, got {shape}")
        if not self.causal or incremental:
            raise ValueError("document_ids mark the documents packed in whole rows of a decoder (training, "
                             "scoring); they do not apply to an encoder, a KV cache, a segment memory or "
                             "prefix_lengths")
        sparse = sorted({layer.self_attn.kernel.name for layer in self.layers
                         if layer.self_attn.kernel.supports.pattern})
        if sparse:
            raise ValueError(f"document_ids need an attention kernel that takes a dense mask; "
                             f"attention.kernel {', '.join(sparse)} applies its own sparse pattern")

    def _check_mems(self, mems: SegmentMemory, B: int, past: int, attention_mask: Tensor | None,
                    prefix_lengths: Tensor | None) -> int:
        """Refuse a segment memory where it has no meaning; return the positions it holds."""
        if not isinstance(mems, SegmentMemory):
            raise TypeError(f"mems must be a SegmentMemory (attnlab.nn.kv_cache), got {type(mems).__name__}; "
                            "Decoder.segment takes a list of per-layer states")
        if not self.causal:
            raise ValueError("a segment memory is for decoders: an encoder reads its whole input at once")
        if self.embed.positions is not None:
            raise ValueError("a segment memory needs a decoder with relative positions (position.scheme rotary, "
                             "alibi, t5_bias, relative or none); this stack adds absolute ones to its embeddings, "
                             "which would number every segment from 0 again")
        if attention_mask is not None or prefix_lengths is not None:
            raise ValueError("a segment memory reads consecutive pieces of unpadded streams: attention_mask and "
                             "prefix_lengths do not apply")
        if past:
            raise ValueError("a segment memory with a KV cache goes into the cache's first call only")
        mems.check(B, len(self.layers), self.embed.token.embedding_dim)
        return mems.length

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
        m = self._modules
        x = tap_row(m["hook_embed"], self.embed.step(tokens, positions))  # (N, D)
        mask = padding_mask(attention_mask) if attention_mask is not None else None  # (N, 1, 1, L)
        bias = None
        if self.position_bias is not None:  # one float mask: the bias, -inf on padded keys
            bias = self.position_bias(positions, key_positions).to(x.dtype)  # (N, H, 1, L)
            bias, mask = (bias if mask is None else torch.where(mask, bias, float("-inf"))), None
        step = Step(key_positions.shape[1], positions, key_positions, mask, bias, memory, memory_mask)
        for layer, kv in zip(self.layers, cache.layers):
            x = layer.step(x, kv, step)
        return tap_row(m["hook_final"], apply_norm(self.final_norm, x) if self.final_norm is not None else x)

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
    tokens (and a mask over cached + new ones): the result holds their logits only. With a
    `SegmentMemory` (`mems`, or `segment`), a segment also attends over the previous segments'
    layer inputs (Transformer-XL; `memory_len`). `document_ids` (B, T) keep the documents packed
    in a row apart: no attention across them, positions from 0 in each (data.pack 'document_masked').
    """

    causal = True

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                position_ids: Tensor | None = None, prefix_lengths: Tensor | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None,
                cache: KVCache | None = None, mems: SegmentMemory | None = None,
                document_ids: Tensor | None = None) -> Tensor:
        hidden = self.features(input_ids, attention_mask, position_ids=position_ids, prefix_lengths=prefix_lengths,
                               memory=memory, memory_mask=memory_mask, cache=cache, mems=mems,
                               document_ids=document_ids)
        return self.apply_head(hidden, attention_mask)

    def segment(self, input_ids: Tensor, mems: list[Tensor] | None = None, *, mem_len: int | None = None,
                position_ids: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        """One segment of Transformer-XL's recurrence (Dai et al. 2019): the logits (B, T, V) of
        `input_ids` attending over the memory `mems` of the previous segments, and the new memory.

            mems = None
            for segment in segments:              # consecutive (B, T) pieces of B streams
                logits, mems = decoder.segment(segment, mems)

        Args:
            mems: per layer (B, M, D), that layer's inputs at the M positions before the segment
                (the second result of the previous call); None for the first segment.
            mem_len: positions kept per layer; default the config's `memory_len`.
            position_ids: (B or 1, T) the segment's positions (default: right after the memory's);
                only their differences matter to the relative schemes memory allows.

        Returns:
            (logits, new memory: per layer the last mem_len rows of [mems; its input], detached).

        Raises:
            ValueError: no mem_len (the config's memory_len is 0), absolute positions, or mems
                that do not fit this stack.
        """
        config = getattr(self, "config", None)  # set by build_model
        mem_len = mem_len if mem_len is not None else getattr(config, "memory_len", 0)
        if not mem_len:
            raise ValueError("segment memory is off (memory_len=0): build the model with memory_len > 0 or pass "
                             "mem_len")
        memory = SegmentMemory(mem_len, mems)
        logits = self(input_ids, position_ids=position_ids, mems=memory)
        return logits, memory.states


class EncoderDecoder(HasHookPoints, nn.Module):
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
