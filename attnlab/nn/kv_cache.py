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

`SegmentMemory` is the other state a decoder can carry between calls: Transformer-XL's memory of
the previous segments' layer inputs, attended like a cache's keys but recomputed per segment.
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


class SegmentMemory:
    """Transformer-XL's segment memory (Dai et al. 2019, https://arxiv.org/abs/1901.02860): per
    layer, that layer's inputs at the last `mem_len` positions read so far, without gradient.

    A decoder run with `mems=memory` attends from the new segment over [memory; segment] (causal
    over the concatenation; the memory asks no queries) and then advances the memory in place,
    as a forward extends a KVCache: layer l's memory becomes the last mem_len rows of [its
    memory; its input over the segment], detached (the stop-gradient of the paper: training
    back-propagates within a segment only). The memory sits at the M positions just before the
    segment's first, so relative position schemes see the true distances across segments.

        memory = SegmentMemory(mem_len=64)
        for segment in segments:                       # consecutive (B, T) pieces of B streams
            logits = decoder(segment, mems=memory)     # reads, then advances, the memory
        # or functionally: logits, states = decoder.segment(segment, states)

    Args:
        mem_len: M, the positions kept per layer (> 0).
        states: per layer (B, M', D) with M' <= mem_len, e.g. the `states` of an earlier memory;
            None = empty (the first segment).

    Raises:
        ValueError: mem_len not a positive integer; states of unequal shapes or longer than mem_len.
    """

    def __init__(self, mem_len: int, states: list[Tensor] | tuple[Tensor, ...] | None = None):
        if not isinstance(mem_len, int) or isinstance(mem_len, bool) or mem_len <= 0:
            raise ValueError(f"mem_len must be a positive integer, got {mem_len!r}")
        self.mem_len = mem_len
        self.states: list[Tensor] | None = None
        self._next: list[Tensor] = []  # the states being built by the forward in progress
        if states is not None:
            states = [s.detach() for s in states]  # no gradient into an earlier segment, whoever made them
            shapes = {tuple(s.shape) for s in states}
            if not states or len(shapes) > 1 or states[0].dim() != 3 or states[0].shape[1] > mem_len:
                raise ValueError(f"states must be one (B, M, D) tensor per layer, all of one shape, with M <= "
                                 f"mem_len={mem_len}; got shapes {sorted(shapes)}")
            self.states = states if states[0].shape[1] else None

    @property
    def length(self) -> int:
        """M, the positions the memory holds (0 before the first segment)."""
        return 0 if self.states is None else self.states[0].shape[1]

    def check(self, batch: int, num_layers: int, width: int) -> None:
        """Refuse states that do not fit a stack of `num_layers` layers of `width` on `batch` rows."""
        if self.states is None:
            return
        B, _, D = self.states[0].shape
        if len(self.states) != num_layers or B != batch or D != width:
            raise ValueError(f"the segment memory holds {len(self.states)} layers of (B={B}, D={D}); this stack has "
                             f"{num_layers} layers of width {width} and the segment {batch} rows")

    def key_positions(self, positions: Tensor) -> Tensor:
        """Positions (B or 1, M + T) of the memory's and the segment's keys, given the
        segment's (B or 1, T): the memory sits at the M positions just before the segment."""
        M = self.length
        if M == 0:
            return positions
        before = positions[:, :1] - M + torch.arange(M, device=positions.device)  # (B or 1, M)
        return torch.cat([before, positions], dim=1)

    def exchange(self, layer: int, h: Tensor) -> Tensor | None:
        """Layer `layer`'s memory (B, M, D) (None while empty), recording its input h (B, T, D)
        over the new segment for the memory that `commit` makes current."""
        if layer == 0:
            self._next = []  # a new forward (one that failed midway recorded a partial list)
        old = self.states[layer] if self.states is not None else None
        full = h if old is None else torch.cat([old, h], dim=1)
        self._next.append(full[:, -self.mem_len:].detach())
        return old

    def commit(self) -> None:
        """Make the states recorded by the finished forward the memory (after its last layer)."""
        self.states, self._next = self._next, []
