"""How a decoding loop asks a model for the next-token logits, with or without a KV cache.

Notation: N rows, P prompt length (decoder-only) or 1 (the start token of an encoder-decoder),
L = tokens so far, V vocabulary, D d_model.

    runner = make_runner(model, use_cache=True, max_len=P + max_new_tokens)
    logits = runner.start(prompt, mask)       # (N, V): next-token logits after the prompt
    logits = runner.step(ids[:, :L], mask)    # (N, V): after ids[:, L - 1] was appended
    runner.expand(index)                      # repeat rows (beams, samples)
    runner.reorder(index)                     # beam search: permute rows within items

The cached runner (`CachedRunner`) feeds only the new token through the stack's `step` and
keeps keys/values in a `KVCache`; the full runner (`FullRunner`) re-runs the whole sequence
every step (the reference path). Both send only the last position through the LM head: at
inference nothing else is needed. A recurrent
encoder-decoder (`RecurrentRunner`) keeps its decoder's hidden state instead of keys/values:
O(1) memory per row, however long the output.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.heads import LMHead
from attnlab.models.rnn import RNNDecoderState, RNNEncoderDecoder
from attnlab.models.transformer import Decoder, EncoderDecoder
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.masks import padding_mask


def is_seq2seq(model: nn.Module) -> bool:
    """True for models that encode a source and decode a target (Transformer or recurrent)."""
    return isinstance(model, (EncoderDecoder, RNNEncoderDecoder))


def lm_decoder(model: nn.Module) -> nn.Module:
    """The module that produces next-token logits (it has `vocab_size`), or a TypeError."""
    if isinstance(model, RNNEncoderDecoder):
        return model
    decoder = model.decoder if isinstance(model, EncoderDecoder) else model
    if not isinstance(decoder, Decoder) or not isinstance(decoder.head, LMHead):
        raise TypeError("generate needs a decoder with an LM head (arch='decoder' or 'encoder_decoder', "
                        f"head='lm'), got {type(model).__name__}")
    return decoder


class Runner:
    """The protocol of a decoding loop's model: next-token logits (N, V) after a prompt, then
    after each appended token; rows repeated (`expand`) or permuted within items (`reorder`)."""

    def start(self, prompt: Tensor, mask: Tensor | None) -> Tensor:
        """Run the prompt (N, P) with its padding mask (or None); logits after it (N, V)."""
        raise NotImplementedError

    def step(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        """ids (N, L) so far (the last one new), mask (N, L) or None -> logits (N, V)."""
        raise NotImplementedError

    def expand(self, index: Tensor) -> None:
        """Repeat rows (beams, samples) -> rows `index` (N',)."""
        raise NotImplementedError

    def reorder(self, index: Tensor) -> None:
        """Beam reorder within items (the row count stays): rows `index` (N,)."""
        raise NotImplementedError


class FullRunner(Runner):
    """The reference: the full forward over the whole sequence at every step (use_cache=False)."""

    def __init__(self, model: nn.Module, src: Tensor | None = None, src_mask: Tensor | None = None):
        self.decoder = lm_decoder(model)
        self.memory = model.encode(src, src_mask) if isinstance(model, EncoderDecoder) else None  # (N, S, D)
        self.src_mask = src_mask

    def _logits(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        if self.memory is None:
            hidden = self.decoder.features(ids, mask)  # (N, L, D)
        else:
            hidden = self.decoder.features(ids, None, memory=self.memory, memory_mask=self.src_mask)
        return self.decoder.head(hidden[:, -1])  # (N, V): only the last position

    start = step = _logits

    def expand(self, index: Tensor) -> None:
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, index)

    def reorder(self, index: Tensor) -> None:
        """Nothing to move: every step re-reads the whole sequence (and beams share their source)."""


class CachedRunner(Runner):
    """A Transformer decoder (or encoder-decoder: pass the source and its mask) with a KV cache.

    `start` runs the prompt through `features`, filling the cache; each `step` feeds only the
    new token through `TransformerStack.step` (the same modules, the decoding fast path) and
    the head's `step`. The source is encoded once; its cross-attention keys/values are
    projected at `start` and kept.
    """

    def __init__(self, model: nn.Module, max_len: int, src: Tensor | None = None, src_mask: Tensor | None = None):
        self.decoder = lm_decoder(model)
        self.cache = KVCache(max_len)
        self.memory = model.encode(src, src_mask) if isinstance(model, EncoderDecoder) else None  # (N, S, D)
        self.src_mask = src_mask
        self.cross = padding_mask(src_mask) if src_mask is not None else None  # (N, 1, 1, S)

    def start(self, prompt: Tensor, mask: Tensor | None) -> Tensor:
        if self.memory is None:
            hidden = self.decoder.features(prompt, mask, cache=self.cache)  # (N, P, D)
        else:  # the target side has no padding
            hidden = self.decoder.features(prompt, None, memory=self.memory, memory_mask=self.src_mask,
                                           cache=self.cache)
        return self.decoder.head.step(hidden[:, -1])

    def step(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        hidden = self.decoder.step(ids[:, -1], self.cache, attention_mask=mask, memory=self.memory,
                                   memory_mask=self.cross)  # (N, D)
        return self.decoder.head.step(hidden)

    def expand(self, index: Tensor) -> None:
        """Repeat rows: the cache (cross keys/values too), the memory and the source mask follow."""
        self.cache.reorder(index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, index)
                self.cross = padding_mask(self.src_mask)

    def reorder(self, index: Tensor) -> None:
        """Only the self-attention keys/values (and positions) move, gathered into spare buffers;
        the cross keys/values and the memory are the same for every beam of an item, so they stay."""
        self.cache.reorder_self(index)


class RecurrentRunner(Runner):
    """Next-token logits of an RNNEncoderDecoder. The source is encoded once into the memory
    (N, S, Hm); the incremental state is the decoder's `RNNDecoderState` (hidden (and cell)
    state, last top-layer output), so each step feeds only the new token and attends over the
    fixed memory. use_cache=False re-runs the decoder over the whole target (the reference)."""

    def __init__(self, model: RNNEncoderDecoder, use_cache: bool, src: Tensor, src_mask: Tensor | None):
        self.model = model
        self.memory = model.encode(src, src_mask)  # (N, S, Hm)
        self.src_mask = src_mask
        self.state = RNNDecoderState() if use_cache else None

    def _logits(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        hidden = self.model.features(ids, self.memory, self.src_mask, cache=self.state)  # (N, T, D)
        return self.model.out(hidden[:, -1])  # (N, V)

    def start(self, prompt: Tensor, mask: Tensor | None) -> Tensor:
        return self._logits(prompt)

    def step(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        return self._logits(ids if self.state is None else ids[:, -1:])

    def expand(self, index: Tensor) -> None:
        """Repeat rows (beams, samples): the memory, its mask and the state follow."""
        self.memory = self.memory.index_select(0, index)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, index)
        self.reorder(index)

    def reorder(self, index: Tensor) -> None:
        """Beam reorder within each item: only the recurrent state moves (the memory is the
        same for every beam of an item)."""
        if self.state is not None:
            self.state.reorder(index)


def make_runner(model: nn.Module, *, use_cache: bool, max_len: int, src: Tensor | None = None,
                src_mask: Tensor | None = None) -> Runner:
    """The Runner for `model` (encoder-decoders, Transformer or recurrent: pass the source and
    its mask): cached, or the full-forward reference with use_cache=False."""
    if isinstance(model, RNNEncoderDecoder):
        return RecurrentRunner(model, use_cache, src, src_mask)
    if use_cache:
        return CachedRunner(model, max_len, src, src_mask)
    return FullRunner(model, src, src_mask)


@torch.no_grad()
def sequence_log_probs(model: nn.Module, ids: Tensor, start: int, *, mask: Tensor | None = None,
                       src: Tensor | None = None, src_mask: Tensor | None = None) -> Tensor:
    """Log-probabilities (N, L - start) of tokens ids[:, start:] under one full forward pass
    (the reference that beam scores are checked against)."""
    if is_seq2seq(model):
        logits = model(src, ids, src_mask)
    else:
        logits = model(ids, mask)
    logp = logits[:, start - 1:-1].float().log_softmax(-1)  # (N, L - start, V)
    return logp.gather(-1, ids[:, start:, None])[..., 0]
