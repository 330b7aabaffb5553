"""`LeanRunner`: the cached runner whose steps take the lean path of `attnlab.decoding.fast`.

Notation: N rows, P prompt length (1 for an encoder-decoder: the start token), L tokens so far,
S source length, V vocabulary; R = N when rows differ in their positions (left padding), else 1.

    runner = LeanRunner(model, max_len, src=None, src_mask=None)
    logits = runner.start(prompt, mask)     # generic stack over the prompt, fills the KV cache
    logits = runner.step(ids[:, :L], mask)  # PackedDecoder.step on ids[:, L - 1]
    runner.reorder(index)                   # beams: keys/values gathered into spare buffers

`make_runner` picks it for cached decoding whenever `unsupported(decoder)` is None.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.decoding.fast import packed, unsupported
from attnlab.decoding.runner import Runner
from attnlab.models.transformer import EncoderDecoder
from attnlab.nn.masks import padding_mask, positions_from_mask

__all__ = ["LeanRunner", "unsupported"]


class LeanRunner(Runner):
    """Decoder-only or encoder-decoder (pass the source and its mask) cached decoding.

    State beside the KV cache: `pos` (R, 1), the position of the last token; `key_pos`
    (R, max_len), the positions of every key (ALiBi and T5-bias schemes only); `cross`, the
    (N, 1, 1, S) source mask of the cross-attention (or None when no source is padded).
    """

    def __init__(self, model: nn.Module, max_len: int, src: Tensor | None = None, src_mask: Tensor | None = None):
        super().__init__(model, True, max_len)
        self.pack = packed(self.decoder)
        self.memory = model.encode(src, src_mask) if isinstance(model, EncoderDecoder) else None  # (N, S, D)
        self.src_mask = src_mask
        self.cross = padding_mask(src_mask) if src_mask is not None else None
        self.pos: Tensor | None = None
        self.key_pos: Tensor | None = None

    def start(self, prompt: Tensor, mask: Tensor | None) -> Tensor:
        """Run the prompt (N, P) with its padding mask (or None); logits after it (N, V)."""
        if self.memory is None:
            hidden = self.decoder.features(prompt, mask, cache=self.cache)  # (N, P, D)
        else:
            hidden = self.decoder.features(prompt, None, memory=self.memory, memory_mask=self.src_mask,
                                           cache=self.cache)
            mask = None  # the target side has no padding
        P = prompt.shape[1]
        # the positions features() gave the prompt: real tokens counted when padded
        positions = positions_from_mask(mask) if mask is not None else torch.arange(P, device=prompt.device)[None]
        self.pos = positions[:, -1:].clone()  # (R, 1)
        if self.pack.position_bias is not None:
            self.key_pos = positions.new_zeros(positions.shape[0], self.cache.max_len)
            self.key_pos[:, :P] = positions
        return self.pack.logits(hidden[:, -1])

    def step(self, ids: Tensor, mask: Tensor | None) -> Tensor:
        """ids (N, L) so far (the last one new), mask (N, L) or None -> logits (N, V)."""
        L = ids.shape[1]
        if L > self.cache.max_len:
            raise ValueError(f"the KV cache holds {self.cache.max_len} positions; {L} requested "
                             "(create the runner with a larger max_len)")
        self.pos += 1
        key_pos = None
        if self.key_pos is not None:
            self.key_pos[:, L - 1:L] = self.pos
            key_pos = self.key_pos[:, :L]
        key_mask = mask.bool() if mask is not None else None
        return self.pack.step(ids[:, -1], self.pos, key_pos, key_mask, self.cache, L, self.cross)

    def _rows(self, index: Tensor) -> None:
        if self.pos.shape[0] > 1:  # R = 1: every row has the same positions
            self.pos = self.pos.index_select(0, index)
            if self.key_pos is not None:
                self.key_pos = self.key_pos.index_select(0, index)

    def expand(self, index: Tensor) -> None:
        """Repeat rows (beams, samples) -> rows `index`: the cache, positions, memory, source mask."""
        self.cache.reorder(index)
        if self.pos is not None:
            self._rows(index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, index)
                self.cross = padding_mask(self.src_mask)

    def reorder(self, index: Tensor) -> None:
        """Beam reorder within items (the row count stays): the self-attention keys/values are
        gathered into spare buffers; the cross keys/values and the memory, shared by the beams
        of an item, stay."""
        self.cache.reorder_self(index)
        self._rows(index)
