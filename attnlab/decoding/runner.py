"""How a decoding loop asks a model for the next-token logits, with or without a KV cache.

Notation: N rows, P prompt length (decoder-only) or 1 (the start token of an encoder-decoder),
L = tokens so far, V vocabulary, D d_model.

    runner = make_runner(model, use_cache=True, max_len=P + max_new_tokens)
    logits = runner.start(prompt, mask)       # (N, V): next-token logits after the prompt
    logits = runner.step(ids[:, :L], mask)    # (N, V): after ids[:, L - 1] was appended
    runner.reorder(index)                     # beam search: keep rows `index`

The cached runner feeds only the new token and keeps keys/values in a `KVCache`; the full
runner re-runs the whole sequence every step (the reference path). Both send only the last
position through the LM head: at inference nothing else is needed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.heads import LMHead
from attnlab.models.transformer import Decoder, EncoderDecoder
from attnlab.nn.kv_cache import KVCache


def lm_decoder(model: nn.Module) -> Decoder:
    """The decoder stack that produces next-token logits, or a TypeError."""
    decoder = model.decoder if isinstance(model, EncoderDecoder) else model
    if not isinstance(decoder, Decoder) or not isinstance(decoder.head, LMHead):
        raise TypeError("generate needs a decoder with an LM head (arch='decoder' or 'encoder_decoder', "
                        f"head='lm'), got {type(model).__name__}")
    return decoder


class Runner:
    """Next-token logits of a decoder-only model (GPT)."""

    def __init__(self, model: nn.Module, use_cache: bool, max_len: int):
        self.decoder = lm_decoder(model)
        self.cache = KVCache(max_len) if use_cache else None

    def _logits(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        hidden = self.decoder.features(ids, mask, cache=self.cache)  # (N, T, D)
        return self.decoder.head(hidden[:, -1])  # (N, V): only the last position

    def start(self, prompt: Tensor, mask: Tensor | None) -> Tensor:
        """Run the prompt (N, P) with its padding mask (or None); logits after it (N, V)."""
        return self._logits(prompt, mask)

    def step(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        """ids (N, L) so far (the last one new), mask (N, L) or None -> logits (N, V)."""
        if self.cache is None:
            return self._logits(ids, mask)
        return self._logits(ids[:, -1:], mask)

    def expand(self, index: Tensor) -> None:
        """Repeat or reorder cached rows (N,) -> rows `index`."""
        if self.cache is not None:
            self.cache.reorder(index)

    reorder = expand


class EncoderDecoderRunner(Runner):
    """Next-token logits of an encoder-decoder: the source is encoded once; `start` takes the
    target start tokens (N, 1) and the decoder attends to the memory at every step."""

    def __init__(self, model: EncoderDecoder, use_cache: bool, max_len: int, src: Tensor, src_mask: Tensor | None):
        super().__init__(model, use_cache, max_len)
        self.memory = model.encode(src, src_mask)  # (N, S, D)
        self.src_mask = src_mask

    def _logits(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        hidden = self.decoder.features(ids, None, memory=self.memory, memory_mask=self.src_mask, cache=self.cache)
        return self.decoder.head(hidden[:, -1])

    def expand(self, index: Tensor) -> None:
        """Repeat rows (beams, samples): the memory and the cache's cross keys follow."""
        super().expand(index)
        self.memory = self.memory.index_select(0, index)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, index)

    def reorder(self, index: Tensor) -> None:
        """Beam reorder within each item: only the self-attention keys/values move; the cross
        keys/values (and the memory) are the same for every beam of an item, so they stay."""
        if self.cache is None:
            return
        for layer in self.cache.layers:
            layer.k, layer.v = layer.k.index_select(0, index), layer.v.index_select(0, index)
        if self.cache.positions is not None:
            self.cache.positions = self.cache.positions.index_select(0, index)


def make_runner(model: nn.Module, *, use_cache: bool, max_len: int, src: Tensor | None = None,
                src_mask: Tensor | None = None) -> Runner:
    """A Runner for `model` (EncoderDecoder: pass the source and its mask)."""
    if isinstance(model, EncoderDecoder):
        return EncoderDecoderRunner(model, use_cache, max_len, src, src_mask)
    return Runner(model, use_cache, max_len)


@torch.no_grad()
def sequence_log_probs(model: nn.Module, ids: Tensor, start: int, *, mask: Tensor | None = None,
                       src: Tensor | None = None, src_mask: Tensor | None = None) -> Tensor:
    """Log-probabilities (N, L - start) of tokens ids[:, start:] under one full forward pass
    (the reference that beam scores are checked against)."""
    if isinstance(model, EncoderDecoder):
        logits = model(src, ids, src_mask)
    else:
        logits = model(ids, mask)
    logp = logits[:, start - 1:-1].float().log_softmax(-1)  # (N, L - start, V)
    return logp.gather(-1, ids[:, start:, None])[..., 0]
