"""Incremental decoding state: keys and values of the tokens seen so far.

Notation: B batch (or batch x beams), G key/value heads, L capacity, Dh head_dim.

Each layer keeps preallocated (B, G, L, Dh) buffers for its self-attention, appended to one
step at a time, and the cross-attention keys/values of the source, computed once. Keys are
stored after rotary rotation, so a step never recomputes the past.

    cache = KVCache(max_len=prompt_len + max_new_tokens)
    logits = decoder(prompt, cache=cache)                 # fills positions [0, prompt_len)
    logits = decoder(next_token[:, None], cache=cache)    # one more position
    hidden = decoder.step(next_token, cache)              # the same, the decoding fast path

A decoding step (`TransformerStack.step`) builds its `Step` once, the inputs every layer
shares; each layer writes its new key/value at column `length - 1` of its buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Step:
    """The inputs every layer of one decoding step shares (N rows, one new token each).

    Attributes:
        length: L, tokens so far, the new one included; its key/value go to column L - 1.
        positions: (N, 1) position of the new token.
        key_positions: (N, L) positions of every key so far.
        mask: (N, 1, 1, L) bool (True = real key), or None when no key is padding.
        bias: (N or 1, H, 1, L) float ALiBi / T5 scores with -inf on padded keys (then `mask`
            is None), or None.
        memory: (N, S, D) the encoder output (its keys/values are cached; read only by a
            hooked cross-attention, which runs its own forward), or None.
        memory_mask: (N, 1, 1, S) bool source mask of the cross-attention, or None.
        rotations: rotary cos/sin of `positions`, computed once per rotary module (a stack's
            layers share one, `TransformerStack`).
    """

    length: int
    positions: Tensor
    key_positions: Tensor
    mask: Tensor | None = None
    bias: Tensor | None = None
    memory: Tensor | None = None
    memory_mask: Tensor | None = None
    rotations: dict = field(default_factory=dict)

    def rotation(self, rotary, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(cos, sin) of `rotary` (a RotaryEmbedding) at the new position, (N, 1, 1, R)."""
        hit = self.rotations.get(id(rotary))
        if hit is None:
            hit = self.rotations[id(rotary)] = rotary.cos_sin(self.positions, dtype)
        return hit


class LayerKV:
    """One layer's cached keys and values (self-attention and cross-attention)."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.length = 0
        self.k: Tensor | None = None  # (B, G, L, Dh)
        self.v: Tensor | None = None
        self.cross_k: Tensor | None = None  # (B, G, S, Dh)
        self.cross_v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # reorder_self's second pair of buffers

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

    def write(self, k: Tensor, v: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """The decoding step's append: k, v (B, G, 1, Dh) of the token at column length - 1 (the
        stack checked the capacity); return every key and value so far (B, G, length, Dh)."""
        self.k.narrow(2, length - 1, 1).copy_(k)  # narrow: one call, cheaper than slice indexing per step
        self.v.narrow(2, length - 1, 1).copy_(v)
        self.length = length
        return self.k.narrow(2, 0, length), self.v.narrow(2, 0, length)

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows `index` (B',), in that order (beam search)."""
        for name in ("k", "v", "cross_k", "cross_v"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.index_select(0, index))
        self._spare = None

    def reorder_self(self, index: Tensor) -> None:
        """Beam reorder within items: rows `index` (B,) of the self-attention keys/values, the
        filled positions only, gathered into a spare pair of buffers that then swaps with the
        live one (no allocation after the first call). Cross keys/values stay: every beam of an
        item shares its source."""
        if self.k is None:
            return
        if index.shape[0] != self.k.shape[0]:
            raise ValueError(f"reorder_self keeps the number of rows ({self.k.shape[0]}), got {index.shape[0]} indices")
        if self._spare is None:
            self._spare = (torch.empty_like(self.k), torch.empty_like(self.v))
        spare_k, spare_v = self._spare
        n = self.length
        torch.index_select(self.k[:, :, :n], 0, index, out=spare_k[:, :, :n])
        torch.index_select(self.v[:, :, :n], 0, index, out=spare_v[:, :, :n])
        self._spare = (self.k, self.v)
        self.k, self.v = spare_k, spare_v


class KVCache:
    """The decoding state of a whole stack: one `LayerKV` per layer, created on first use."""

    def __init__(self, max_len: int):
        if not isinstance(max_len, int) or max_len <= 0:
            raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
        self.max_len = max_len
        self.layers: list[LayerKV] = []
        self._positions: Tensor | None = None  # (B, max_len) preallocated position ids
        self._filled = 0  # columns of _positions written so far

    @property
    def positions(self) -> Tensor | None:
        """(B, past) position ids of the cached tokens, or None before the first call."""
        return None if self._positions is None else self._positions[:, :self._filled]

    def track_positions(self, q_pos: Tensor) -> Tensor:
        """Record the positions (B, T) of the tokens about to be cached; return those of every
        key so far (B, past + T). Called once per forward by the stack; writes into a
        preallocated (B, max_len) buffer (no concatenation per step)."""
        B, T = q_pos.shape
        end = self._filled + T
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; {end} requested "
                             "(create the cache with a larger max_len)")
        if self._positions is None:
            self._positions = q_pos.new_zeros(B, self.max_len)
        self._positions[:, self._filled:end] = q_pos
        self._filled = end
        return self._positions[:, :end]

    def advance(self) -> tuple[Tensor, Tensor]:
        """A decoding step's positions: the new token of each row is one past its last cached
        one. Records it; returns (its position (B, 1), the positions of every key (B, past + 1)).

        Raises:
            ValueError: the cache is full, or nothing was cached yet (run the prompt first).
        """
        n = self._filled
        if self._positions is None or n == 0:
            raise ValueError("a decoding step needs a cache filled by the prompt first (features(..., cache=cache))")
        if n >= self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; {n + 1} requested "
                             "(create the cache with a larger max_len)")
        new = self._positions[:, n - 1:n] + 1  # (B, 1)
        self._positions[:, n:n + 1] = new
        self._filled = n + 1
        return new, self._positions[:, :n + 1]

    @property
    def length(self) -> int:
        """Positions already cached."""
        return self.layers[0].length if self.layers else 0

    def layer(self, i: int) -> LayerKV:
        while len(self.layers) <= i:
            self.layers.append(LayerKV(self.max_len))
        return self.layers[i]

    def reorder_self(self, index: Tensor) -> None:
        """Beam reorder within items (the row count stays): the self-attention keys/values
        and the positions follow rows `index` (N,); the cross keys/values, shared by the beams
        of an item, stay. No allocation after the first call (see `LayerKV.reorder_self`)."""
        for layer in self.layers:
            layer.reorder_self(index)
        if self._positions is not None:
            n = self._filled
            self._positions[:, :n] = self._positions[:, :n].index_select(0, index.to(self._positions.device))

    def reorder(self, index: Tensor) -> None:
        """Reorder every layer's batch rows (after a beam-search step)."""
        index = torch.as_tensor(index, dtype=torch.long)
        for layer in self.layers:
            layer.reorder(index)
        if self._positions is not None:
            self._positions = self._positions.index_select(0, index.to(self._positions.device))
