"""Block-diagonal attention: the sequence cut into blocks, each query attending within its own block.

Notation: B batch, H heads, Tq/Tk query/key lengths, Dh head_dim, b block size, NB = ceil(L / b)
blocks of the L positions computed.

Block n holds positions [n b, (n + 1) b); a query at position i sees the keys j with
j // b == i // b (and j <= i when causal). The blocks are a view of q, k, v as (B, H NB, b, Dh)
(the last block padded with zeros), so one call of PyTorch's scaled_dot_product_attention does
them all: time O(T b Dh), memory O(T b) for the block masks, and none in the plain causal case
(its `is_causal` within each block; the padded keys come after every real query).

Under a KV cache the queries are the last Tq of Tk positions: the keys before the first query's
block are never read, and the positions of that block before the first query get dummy (zero)
queries whose rows are dropped, so the blocks line up with the keys again.

A mask or bias (broadcastable to (B, H, Tq, Tk)) is cut into its diagonal blocks; a query with
no allowed key gets zeros. Shared by the kernels that attend within blocks (the local layers of
Liu et al. 2018, https://arxiv.org/abs/1801.10198).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def block_pattern(t_q: int, t_k: int, block: int, causal: bool, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) bool: the last Tq of Tk positions see the keys of their own block (j <= i when causal).

    >>> block_pattern(4, 4, 2, causal=True).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    """
    i = torch.arange(t_k - t_q, t_k, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    allowed = (i // block) == (j // block)
    return allowed & (j <= i) if causal else allowed


def _as_4d(x: Tensor, name: str, t_q: int, t_k: int) -> Tensor:
    """A mask or bias broadcastable to (B, H, Tq, Tk), as 4 dims."""
    if x.dim() > 4 or x.shape[-1] not in (1, t_k) or (x.dim() > 1 and x.shape[-2] not in (1, t_q)):
        raise ValueError(f"{name} must broadcast to (B, H, Tq, Tk) with Tq = {t_q}, Tk = {t_k}, got "
                         f"{tuple(x.shape)}")
    return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))


def _diagonal_blocks(x: Tensor, lead: int, start: int, length: int, block: int, fill) -> Tensor:
    """(B', H', Tq | 1, Tk | 1) -> its diagonal blocks (B', H', NB | 1, b | 1, b | 1) over the
    computed positions: key columns from `start`, `lead` dummy query rows in front, both padded
    with `fill` to NB b. A dimension of size 1 broadcasts (a single query's row may: the dummy
    rows it then also covers are dropped)."""
    nb = math.ceil(length / block)
    B, H, rows, cols = x.shape
    if cols != 1:
        x = F.pad(x[..., start:], (0, nb * block - length), value=fill)
    if rows != 1:
        x = F.pad(x, (0, 0, lead, nb * block - length), value=fill)
    if rows == 1 and cols == 1:
        return x[:, :, None]
    if rows == 1:  # a key vector: block n's keys
        return x.reshape(B, H, nb, 1, block)
    if cols == 1:  # a query vector: block n's queries
        return x.reshape(B, H, nb, block, 1)
    x = x.reshape(B, H, nb, block, nb, block).diagonal(dim1=2, dim2=4)  # (B', H', b, b, NB)
    return x.permute(0, 1, 4, 2, 3)


def block_diagonal_attention(q: Tensor, k: Tensor, v: Tensor, *, block: int, causal: bool, scale: float,
                             mask: Tensor | None = None, bias: Tensor | None = None,
                             dropout_p: float = 0.0) -> Tensor:
    """softmax(scale q k^T + bias) v within blocks of `block` positions (causal within each).

    Args:
        q: (B, H, Tq, Dh), the last Tq positions.
        k, v: (B, H, Tk, Dh | Dv), Tk >= Tq (Tk > Tq: a KV cache holds the earlier keys).
        block: b >= 1.
        causal: keys j <= i only.
        scale: multiplies q . k.
        mask: bool, True = may attend, broadcastable to (B, H, Tq, Tk).
        bias: float scores added before the softmax, broadcastable to (B, H, Tq, Tk).
        dropout_p: dropout on the weights.

    Returns:
        (B, H, Tq, Dv); a query with no allowed key gets zeros.

    Raises:
        ValueError: for a block < 1, mismatched heads or lengths, or a mask or bias of another shape.
    """
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    if k.shape[:2] != (B, H) or v.shape[:3] != k.shape[:3] or Tq > Tk:
        raise ValueError(f"q (B, H, Tq, Dh), k and v (B, H, Tk >= Tq, Dh) expected, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    start = (Tk - Tq) // block * block  # the first key of the first query's block
    lead = Tk - Tq - start  # positions of that block before the first query
    L = Tk - start
    nb = math.ceil(L / block)
    pad = nb * block - L
    qb = F.pad(q, (0, 0, lead, pad)).reshape(B, H * nb, block, q.shape[-1])  # (B, H NB, b, Dh)
    kb = F.pad(k[:, :, start:], (0, 0, 0, pad)).reshape(B, H * nb, block, k.shape[-1])
    vb = F.pad(v[:, :, start:], (0, 0, 0, pad)).reshape(B, H * nb, block, v.shape[-1])
    attn = _block_mask(q, mask, bias, Tq, Tk, lead, start, L, block, causal)
    if attn is not None:  # (B', H', NB | 1, b | 1, b | 1) -> (B', H NB, b | 1, b | 1)
        attn = attn.expand(attn.shape[0], H, nb, *attn.shape[-2:]).reshape(attn.shape[0], H * nb, *attn.shape[-2:])
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=attn, dropout_p=dropout_p, scale=scale,
                                         is_causal=causal and attn is None)
    return out.view(B, H, nb * block, v.shape[-1])[:, :, lead:lead + Tq]


def block_diagonal_flops(t_q: int, t_k: int, block: int, num_heads: int, qk_dim: int, v_dim: int) -> int:
    """Matrix-multiplication FLOPs of one `block_diagonal_attention` call on one sequence: SDPA over
    the NB blocks of b x b that hold the last Tq of Tk positions (the last one padded),
    2 H NB b^2 (qk_dim + v_dim); H T b (qk_dim + v_dim) x 2 when b divides T, against
    2 H T^2 (qk_dim + v_dim) for dense attention.

    >>> block_diagonal_flops(8, 8, 4, num_heads=1, qk_dim=2, v_dim=2)  # 2 blocks of 4 x 4
    256
    """
    start = (t_k - t_q) // block * block
    nb = math.ceil((t_k - start) / block)
    return 2 * num_heads * nb * block * block * (qk_dim + v_dim)


def _block_mask(q: Tensor, mask: Tensor | None, bias: Tensor | None, Tq: int, Tk: int, lead: int, start: int,
                L: int, block: int, causal: bool) -> Tensor | None:
    """The blocks' bool mask or float bias (B', H', NB | 1, b | 1, b | 1), or None when SDPA's
    own causal flag (or nothing) is all it takes."""
    nb, dev = math.ceil(L / block), q.device
    allowed = None
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool (True = may attend), got {mask.dtype}")
        allowed = _diagonal_blocks(_as_4d(mask, "mask", Tq, Tk), lead, start, L, block, False)
    if nb * block > L and not causal:  # causal: the padded keys come after every real query
        real = (torch.arange(nb * block, device=dev) < L).view(1, 1, nb, 1, block)
        allowed = real if allowed is None else allowed & real
    scores = None
    if bias is not None:
        scores = _diagonal_blocks(_as_4d(bias.to(q.dtype), "bias", Tq, Tk), lead, start, L, block, 0.0)
    if causal and (allowed is not None or scores is not None):
        tril = torch.ones(block, block, dtype=torch.bool, device=dev).tril().view(1, 1, 1, block, block)
        allowed = tril if allowed is None else allowed & tril
    if scores is None:
        return allowed
    return scores if allowed is None else torch.where(allowed, scores, float("-inf"))
