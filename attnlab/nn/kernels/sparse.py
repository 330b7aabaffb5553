"""What the sparse-pattern kernels share: tiles, key validity, the window's block table, global
token positions, and the dense row pass of global queries.

Notation: B batch, H heads, T length, Dh head_dim, b block (tile) size, NQ = ceil(T / b) query
blocks, w window, g global tokens. Positions are tensor indices 0..T-1 (not position ids), so a
pattern is the same with or without padding.

A pattern is described twice, and the two descriptions must agree (the tests check it): as a
block table for the blockwise kernels (`attnlab.nn.kernels.block_sparse`): for each query
block, the key blocks it gathers (sentinel NQ = "no block"), refined element-wise by a band
|i - j| <= w and by causality; and as a dense bool (T, T) mask (True = may attend), each kernel's
`dense_mask` (built on `attnlab.nn.masks.window_mask`), for the dense reference and plots.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.kernels.base import Supports
from attnlab.nn.kernels.block_sparse import _as_4d

# the long-input kernels: self-attention only, dot-product-shaped scores as wide as v, no weights (the dense
# reference runs when asked, or under a KV cache), no values term, not split by tensor parallelism
SPARSE = Supports(kv_cache=False, weights=False, any_score=False, wide_qk=False, value_term=False,
                  cross_attention=False, grouped_kv=False, pattern=True, tensor_parallel=False)


def check_int(name: str, value: object, *, low: int = 1) -> None:
    """Raises ValueError unless `value` is an integer >= low."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def default_tile(window: int, *, banded: bool = False) -> int:
    """The tile a window is computed in: 64 in the block kernel, 32 in the banded one, or smaller
    for narrow windows (fewer wasted scores at the window's ragged edges).

    The banded kernel computes w + b scores per query for the w + 1 a window allows: at w = 256 a
    tile of 32 wastes 11% of them instead of 20%, and forward + backward ran 10-17% faster (2
    threads, 16k-64k tokens, windows 128-512). The block kernel gathers per tile and ran faster
    with 64.
    """
    if banded:
        return min(32, default_tile(window))
    return 64 if window >= 64 else max(8, 1 << max(0, math.ceil(math.log2(max(window, 1)))))


def window_table(t: int, block: int, window: int, causal: bool) -> Tensor:
    """(NQ, n) key blocks of a window: query block i gathers blocks i - ceil(w / b) .. i
    (+ ceil(w / b) when bidirectional); blocks outside [0, NQ) are the sentinel NQ.

    Args:
        t: sequence length T.
        block: tile size b.
        window: w, the largest |i - j| allowed (keys within distance w on each allowed side).
        causal: keys on the left only.

    Returns:
        LongTensor (NQ, n).
    """
    check_int("t", t)
    check_int("block", block)
    check_int("window", window, low=0)
    nq = math.ceil(t / block)
    side = math.ceil(window / block)
    offsets = torch.arange(-side, 1 if causal else side + 1)
    table = torch.arange(nq)[:, None] + offsets[None, :]
    return table.masked_fill((table < 0) | (table >= nq), nq)


def global_index(global_tokens: Tensor | None, t: int, batch: int, device: torch.device | None = None) -> Tensor:
    """Global positions as a padded (B, g) index; the sentinel t marks an empty slot.

    Args:
        global_tokens: None (no global token), a 1-D LongTensor of positions shared by the
            batch, or a (B, T) bool tensor (True = global).
        t: sequence length T; positions >= T are dropped.
        batch: B.

    Returns:
        LongTensor (B, g), g >= 0.

    Raises:
        ValueError: for a tensor of another shape or dtype.
    """
    if global_tokens is None:
        return torch.empty(batch, 0, dtype=torch.long, device=device)
    if global_tokens.dtype == torch.bool:
        if global_tokens.shape != (batch, t):
            raise ValueError(f"global token flags must be (B, T) = {(batch, t)}, got {tuple(global_tokens.shape)}")
        count = int(global_tokens.sum(-1).max()) if global_tokens.numel() else 0
        pos = torch.arange(t, device=global_tokens.device).expand(batch, t)
        key = torch.where(global_tokens, pos, t + pos)  # globals first, in order
        order = key.sort(-1).values[:, :count]
        return torch.where(order < t, order, t).to(device or global_tokens.device)
    if global_tokens.dim() != 1 or global_tokens.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"global positions must be a 1-D integer tensor or (B, T) bool flags, got "
                         f"{global_tokens.dtype} of shape {tuple(global_tokens.shape)}")
    pos = torch.unique(global_tokens.long())
    if pos.numel() and int(pos.min()) < 0:
        raise ValueError(f"global positions must be >= 0, got {pos.tolist()}")
    pos = pos[pos < t]
    return pos.to(device)[None].expand(batch, -1).contiguous()


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must all be (B, H, T, Dh) of one shape (self-attention), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")


def default_scale(q: Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def key_valid(q: Tensor, mask: Tensor | None, bias: Tensor | None) -> Tensor | None | bool:
    """(B, T) key validity when the band fast path applies (no bias; no mask or a key mask
    (B or 1, 1, 1, T)); False when the general block kernel is needed."""
    if bias is not None:
        return False
    if mask is None:
        return None
    B, _, T, _ = q.shape
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True = may attend), got {mask.dtype}")
    m = _as_4d(mask, "mask", T)
    if m.shape[1] != 1 or m.shape[2] != 1:
        return False
    return m[:, 0, 0, :].expand(B, T)


def global_rows(q: Tensor, k: Tensor, v: Tensor, out: Tensor, rows: Tensor, *, scale: float, causal: bool,
                mask: Tensor | None, bias: Tensor | None, dropout_p: float) -> Tensor:
    """Replace the outputs of the query rows (B, g) (sentinel T = none) by dense attention of
    those queries over every key. out (B, H, T, Dh) -> (B, H, T, Dh)."""
    B, H, T, Dh = q.shape
    g = rows.shape[1]
    if g == 0:
        return out
    rc = rows.clamp(max=T - 1)
    qg = q.gather(2, rc[:, None, :, None].expand(B, H, g, Dh))  # (B, H, g, Dh)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # (B, H, g, T)
    keys = torch.arange(T, device=q.device)
    allowed = (keys[None, None, :] <= rc[:, :, None]) if causal else torch.ones(1, 1, T, dtype=torch.bool,
                                                                                device=q.device)
    allowed = allowed[:, None]  # (B or 1, 1, g, T)
    mask, bias = _as_4d(mask, "mask", T), _as_4d(bias, "bias", T)
    if mask is not None:
        m = mask.expand(B, *mask.shape[1:])
        if m.shape[2] > 1:
            m = m.gather(2, rc[:, None, :, None].expand(B, m.shape[1], g, T))
        allowed = allowed & m
    if bias is not None:
        bb = bias.expand(B, *bias.shape[1:])
        if bb.shape[2] > 1:
            bb = bb.gather(2, rc[:, None, :, None].expand(B, bb.shape[1], g, T))
        scores = scores + bb.to(scores.dtype)
    allowed = allowed.expand(B, H, g, T)
    work = torch.promote_types(scores.dtype, torch.float32)  # fp32 softmax under bf16, fp64 stays fp64
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1, dtype=work).to(scores.dtype)
    weights = weights.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # a row with no key: zeros, not NaN
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    og = torch.matmul(weights, v)  # (B, H, g, Dh)
    padded = torch.cat([out, out.new_zeros(B, H, 1, Dh)], dim=2)  # row T takes the empty slots
    return padded.scatter(2, rows[:, None, :, None].expand(B, H, g, Dh), og)[:, :, :T]
