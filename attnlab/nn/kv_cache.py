"""Incremental decoding state: keys and values of the tokens seen so far.

Notation: B batch (or batch x beams), G key/value heads, L capacity, Dh head_dim.

Each layer keeps preallocated (B, G, L, Dh) buffers for its self-attention, appended to one
step at a time, and the cross-attention keys/values of the source, computed once. Keys are
stored after rotary rotation, so a step never recomputes the past.

    cache = KVCache(max_len=prompt_len + max_new_tokens)
    logits = decoder(prompt, cache=cache)                 # fills positions [0, prompt_len)
    logits = decoder(next_token[:, None], cache=cache)    # one more position
"""

from __future__ import annotations

import torch
from torch import Tensor


class LayerKV:
    """One layer's cached keys and values (self-attention and cross-attention)."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.length = 0
        self.k: Tensor | None = None  # (B, G, L, Dh)
        self.v: Tensor | None = None
        self.cross_k: Tensor | None = None  # (B, G, S, Dh)
        self.cross_v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, G, T, Dh) after the cached ones; return all keys and values so far."""
        B, G, T, Dh = k.shape
        if self.k is None:
            self.k = k.new_empty(B, G, self.max_len, Dh)
            self.v = v.new_empty(B, G, self.max_len, Dh)
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; {end} requested "
                             "(create the cache with a larger max_len)")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows `index` (B',), in that order (beam search)."""
        for name in ("k", "v", "cross_k", "cross_v"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.index_select(0, index))


class KVCache:
    """The decoding state of a whole stack: one `LayerKV` per layer, created on first use."""

    def __init__(self, max_len: int):
        if not isinstance(max_len, int) or max_len <= 0:
            raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
        self.max_len = max_len
        self.layers: list[LayerKV] = []
        self.positions: Tensor | None = None  # (B, past) position ids of the cached tokens

    def track_positions(self, q_pos: Tensor) -> Tensor:
        """Record the positions (B, T) of the tokens about to be cached; return those of every
        key so far (B, past + T). Called once per forward by the stack."""
        self.positions = q_pos if self.positions is None else torch.cat([self.positions, q_pos], dim=1)
        return self.positions

    @property
    def length(self) -> int:
        """Positions already cached."""
        return self.layers[0].length if self.layers else 0

    def layer(self, i: int) -> LayerKV:
        while len(self.layers) <= i:
            self.layers.append(LayerKV(self.max_len))
        return self.layers[i]

    def reorder(self, index: Tensor) -> None:
        """Reorder every layer's batch rows (after a beam-search step)."""
        index = torch.as_tensor(index, dtype=torch.long)
        for layer in self.layers:
            layer.reorder(index)
        if self.positions is not None:
            self.positions = self.positions.index_select(0, index.to(self.positions.device))
