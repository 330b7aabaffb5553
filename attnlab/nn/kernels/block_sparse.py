"""Blockwise attention over a table of key blocks: memory O(T * keys per query), never T x T.

Notation: B batch, H heads, T length, Dh head_dim, b block (tile) size, NQ = ceil(T / b) query
blocks, n key blocks per query block (the table's width), g global keys, K = n * b + g keys
gathered per query, c query blocks per chunk.

    q block i (b, Dh) ----------------------.
    key blocks table[i] (n, b, Dh) + g global keys  --> scores (b, K) --band/causal/mask-->
                                             softmax --> (b, K) @ values (K, Dh) --> out block i

The forward pass walks over chunks of c query blocks and keeps only the output and the
log-sum-exp per query; the backward pass recomputes each chunk's scores from them (as
FlashAttention does, Dao et al. 2022, https://arxiv.org/abs/2205.14135) and adds the gradients
of the gathered keys and values back with index_add. Peak extra memory is one chunk's
(B, H, c, b, K) scores plus O(T) buffers, on any device, with plain PyTorch ops.

Masks and biases given densely (bool mask or float bias broadcastable to (B, H, T, T), e.g.
a decoder's causal-and-padding mask or ALiBi / T5 scores) are gathered for the attended
entries only; their own T x T storage is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 1 << 22  # scores per chunk (B * H * c * b * K): 16 MiB in fp32


@dataclass
class BlockPlan:
    """What each query block gathers.

    Args:
        block: tile size b.
        table: (NQ, n) key blocks per query block; NQ is the sentinel for "no block".
        band: keep only keys with |i - j| <= band inside the gathered blocks (None = all).
        causal: keep only keys j <= i.
        global_keys: (B, g) positions every query also attends to (sentinel >= T), or None.
            With a band, a global key inside the window counts once (in the window).
    """

    block: int
    table: Tensor
    band: int | None
    causal: bool
    global_keys: Tensor | None = None


def _as_4d(x: Tensor | None, name: str, t: int) -> Tensor | None:
    if x is None:
        return None
    while x.dim() < 4:
        x = x[None]
    if x.dim() != 4 or x.shape[-1] != t or x.shape[-2] not in (1, t):
        raise ValueError(f"{name} must broadcast to (B, H, T, T) with T = {t}, got {tuple(x.shape)}")
    return x


class _Chunker:
    """Builds one chunk's gathered keys, values and masked scores; shared by both passes."""

    def __init__(self, plan: BlockPlan, t: int, mask: Tensor | None, bias: Tensor | None, scale: float,
                 kx: Tensor, vx: Tensor):
        B, H, _, Dh = kx.shape
        b = plan.block
        self.plan, self.t, self.scale, self.b = plan, t, scale, b
        self.mask, self.bias = mask, bias
        self.kb = kx.view(B, H, -1, b, Dh)  # (B, H, NQ + 1, b, Dh), the last block is zeros
        self.vb = vx.view(B, H, -1, b, Dh)
        self.ar = torch.arange(b, device=kx.device)
        g = 0 if plan.global_keys is None else plan.global_keys.shape[1]
        self.g = g
        if g:
            gk = plan.global_keys.to(kx.device)
            self.g_valid = gk < t  # (B, g)
            self.gk = gk.clamp(max=t - 1)  # gather index (B, g); invalid slots are masked
            sentinel = torch.where(self.g_valid, gk, torch.full_like(gk, kx.shape[2] - 1))
            self.g_scatter = sentinel  # where a global key's gradient goes (the zero row if empty)
            idx = sentinel[:, None, :, None].expand(B, H, g, Dh)
            self.kg, self.vg = kx.gather(2, idx), vx.gather(2, idx)  # (B, H, g, Dh)
            if mask is not None:
                m = mask.expand(B, *mask.shape[1:])
                self.mask_cols = m.gather(3, self.gk[:, None, None, :].expand(B, m.shape[1], m.shape[2], g))
            if bias is not None:
                bb = bias.expand(B, *bias.shape[1:])
                self.bias_cols = bb.gather(3, self.gk[:, None, None, :].expand(B, bb.shape[1], bb.shape[2], g))

    def positions(self, s: int, e: int) -> tuple[Tensor, Tensor, Tensor]:
        table = self.plan.table[s:e]  # (c, n)
        qi = torch.arange(s * self.b, e * self.b, device=table.device).view(e - s, self.b)  # (c, b)
        kj = (table[:, :, None] * self.b + self.ar).flatten(1)  # (c, n * b)
        return table, qi, kj

    def allowed(self, qi: Tensor, kj: Tensor) -> Tensor:
        """(B or 1, H or 1, c, b, K) bool."""
        plan, t = self.plan, self.t
        d = qi[:, :, None] - kj[:, None, :]  # (c, b, n * b): query minus key position
        ok = (kj < t)[:, None, :].expand_as(d)
        if plan.band is not None:
            ok = ok & (d <= plan.band) & (d >= (0 if plan.causal else -plan.band))
        elif plan.causal:
            ok = ok & (d >= 0)
        ok = ok[None, None]
        qc, kc = qi.clamp(max=t - 1), kj.clamp(max=t - 1)
        if self.mask is not None:
            rows = qc if self.mask.shape[2] > 1 else torch.zeros_like(qc)
            ok = ok & self.mask[:, :, rows[:, :, None], kc[:, None, :]]
        if not self.g:
            return ok
        dg = qi[None, :, :, None] - self.gk[:, None, None, :]  # (B, c, b, g)
        okg = self.g_valid[:, None, None, :].expand_as(dg)
        if plan.causal:
            okg = okg & (dg >= 0)
        if plan.band is not None:  # a global key inside the window is already counted there
            okg = okg & ~((dg <= plan.band) & (dg >= (0 if plan.causal else -plan.band)))
        okg = okg[:, None]
        if self.mask is not None:
            rows = qc if self.mask.shape[2] > 1 else torch.zeros_like(qc)
            okg = okg & self.mask_cols[:, :, rows]
        B = okg.shape[0]
        ok = ok.expand(B, max(ok.shape[1], okg.shape[1]), *ok.shape[2:])
        return torch.cat([ok, okg.expand(B, ok.shape[1], *okg.shape[2:])], dim=-1)

    def bias_block(self, qi: Tensor, kj: Tensor) -> Tensor:
        t = self.t
        qc, kc = qi.clamp(max=t - 1), kj.clamp(max=t - 1)
        rows = qc if self.bias.shape[2] > 1 else torch.zeros_like(qc)
        out = self.bias[:, :, rows[:, :, None], kc[:, None, :]]  # (B', H', c, b, n * b)
        if not self.g:
            return out
        cols = self.bias_cols[:, :, rows]  # (B, H', c, b, g)
        out = out.expand(cols.shape[0], *out.shape[1:])
        return torch.cat([out, cols.expand(cols.shape[0], out.shape[1], *cols.shape[2:])], dim=-1)

    def gather(self, table: Tensor) -> tuple[Tensor, Tensor]:
        B, H, _, b, Dh = self.kb.shape
        c, n = table.shape
        kg = self.kb[:, :, table].reshape(B, H, c, n * b, Dh)
        vg = self.vb[:, :, table].reshape(B, H, c, n * b, Dh)
        if self.g:
            kg = torch.cat([kg, self.kg[:, :, None].expand(B, H, c, self.g, Dh)], dim=3)
            vg = torch.cat([vg, self.vg[:, :, None].expand(B, H, c, self.g, Dh)], dim=3)
        return kg, vg  # (B, H, c, K, Dh)

    def scores(self, qc: Tensor, kg: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
        s = torch.matmul(qc, kg.transpose(-1, -2)).mul_(self.scale)  # (B, H, c, b, K)
        if self.bias is not None:
            s = s + self.bias_block(qi, kj).to(s.dtype)
        return s.masked_fill_(~self.allowed(qi, kj), float("-inf"))


def _keep_mask(shape: torch.Size, p: float, seed: int, chunk: int, device: torch.device) -> Tensor:
    gen = torch.Generator(device=device).manual_seed(seed + chunk)
    return torch.rand(shape, generator=gen, device=device) >= p


class BlockSparseAttention(torch.autograd.Function):
    """softmax(scale q k^T + bias, pattern & mask) v over a `BlockPlan`, with a recomputing
    backward. Inputs q, k, v (B, H, T, Dh); returns (B, H, T, Dh)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, plan, scale, dropout_p, seed):
        B, H, T, Dh = q.shape
        b, nq = plan.block, plan.table.shape[0]
        length = (nq + 1) * b  # one zero block after the last: the sentinel's keys
        qx, kx, vx = (F.pad(x, (0, 0, 0, length - T)) for x in (q, k, v))
        ch = _Chunker(plan, T, mask, bias, scale, kx, vx)
        out = q.new_zeros(B, H, length, Dh)
        lse = q.new_zeros(B, H, length)
        step = _chunk_blocks(B * H * b * (plan.table.shape[1] * b + ch.g))
        with torch.no_grad():
            for ci, s in enumerate(range(0, nq, step)):
                e = min(nq, s + step)
                table, qi, kj = ch.positions(s, e)
                kg, vg = ch.gather(table)
                qc = qx[:, :, s * b:e * b].view(B, H, e - s, b, Dh)
                sc = ch.scores(qc, kg, qi, kj)
                m = torch.logsumexp(sc, dim=-1)  # (B, H, c, b)
                m = m.masked_fill(m == float("-inf"), float("inf"))  # a query with no key: weights 0
                p = sc.sub_(m[..., None]).exp_()
                if dropout_p:
                    p = p * _keep_mask(p.shape, dropout_p, seed, ci, p.device) / (1 - dropout_p)
                out[:, :, s * b:e * b] = torch.matmul(p, vg).view(B, H, -1, Dh)
                lse[:, :, s * b:e * b] = m.view(B, H, -1)
        ctx.save_for_backward(q, k, v, bias, mask, out, lse)
        ctx.plan, ctx.scale, ctx.dropout_p, ctx.seed, ctx.step = plan, scale, dropout_p, seed, step
        return out[:, :, :T]

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out, lse = ctx.saved_tensors
        plan, scale, p_drop, step = ctx.plan, ctx.scale, ctx.dropout_p, ctx.step
        B, H, T, Dh = q.shape
        b, nq = plan.block, plan.table.shape[0]
        length = out.shape[2]
        qx, kx, vx, do = (F.pad(x, (0, 0, 0, length - T)) for x in (q, k, v, grad_out))
        ch = _Chunker(plan, T, mask, bias, scale, kx, vx)
        delta = (do * out).sum(-1)  # (B, H, L): rowsum(dO * O) = rowsum(P * dP)
        dq, dk, dv = torch.zeros_like(qx), torch.zeros_like(kx), torch.zeros_like(vx)
        dkb, dvb = dk.view(B, H, nq + 1, b, Dh), dv.view(B, H, nq + 1, b, Dh)
        dkg = dvg = None
        if ch.g:
            dkg, dvg = kx.new_zeros(B, H, ch.g, Dh), kx.new_zeros(B, H, ch.g, Dh)
        need_bias = bias is not None and ctx.needs_input_grad[3]
        dbias = torch.zeros_like(bias) if need_bias else None
        nb = plan.table.shape[1] * b
        for ci, s in enumerate(range(0, nq, step)):
            e = min(nq, s + step)
            table, qi, kj = ch.positions(s, e)
            kg, vg = ch.gather(table)
            rows = slice(s * b, e * b)
            qc = qx[:, :, rows].view(B, H, e - s, b, Dh)
            doc = do[:, :, rows].view(B, H, e - s, b, Dh)
            p = ch.scores(qc, kg, qi, kj).sub_(lse[:, :, rows].view(B, H, e - s, b, 1)).exp_()
            pd = p
            if p_drop:
                keep = _keep_mask(p.shape, p_drop, ctx.seed, ci, p.device) / (1 - p_drop)
                pd = p * keep
            dvc = torch.matmul(pd.transpose(-1, -2), doc)  # (B, H, c, K, Dh)
            dp = torch.matmul(doc, vg.transpose(-1, -2))  # (B, H, c, b, K)
            if p_drop:
                dp = dp * keep
            ds = p.mul_(dp.sub_(delta[:, :, rows].view(B, H, e - s, b, 1)))  # dS, in p's storage
            if need_bias:
                _add_bias_grad(dbias, ds, qi, kj, ch)
            dq[:, :, rows] = torch.matmul(ds, kg).mul_(scale).view(B, H, -1, Dh)
            dkc = torch.matmul(ds.transpose(-1, -2), qc).mul_(scale)  # (B, H, c, K, Dh)
            flat = table.flatten()
            c, n = table.shape
            dkb.index_add_(2, flat, dkc[:, :, :, :nb].reshape(B, H, c * n, b, Dh))
            dvb.index_add_(2, flat, dvc[:, :, :, :nb].reshape(B, H, c * n, b, Dh))
            if ch.g:
                dkg += dkc[:, :, :, nb:].sum(2)
                dvg += dvc[:, :, :, nb:].sum(2)
        if ch.g:
            idx = ch.g_scatter[:, None, :, None].expand(B, H, ch.g, Dh)
            dk.scatter_add_(2, idx, dkg)
            dv.scatter_add_(2, idx, dvg)
        return dq[:, :, :T], dk[:, :, :T], dv[:, :, :T], dbias, None, None, None, None, None


def _chunk_blocks(per_block: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, per_block))


def _add_bias_grad(dbias: Tensor, ds: Tensor, qi: Tensor, kj: Tensor, ch: _Chunker) -> None:
    """Scatter dS (B, H, c, b, K) into the dense bias gradient (B', H', Tq', T)."""
    t = ch.t
    Bb, Hb, Tq, _ = dbias.shape
    qc, kc = qi.clamp(max=t - 1), kj.clamp(max=t - 1)
    rows = qc if Tq > 1 else torch.zeros_like(qc)
    nb = kj.shape[1]
    flat_grad = dbias.view(Bb, Hb, Tq * t)
    for bi in range(ds.shape[0]):
        part = ds[bi]
        if Hb == 1:
            part = part.sum(0, keepdim=True)
        target = flat_grad[min(bi, Bb - 1)]
        index = (rows[:, :, None] * t + kc[:, None, :]).flatten()
        target.index_add_(1, index, part[..., :nb].reshape(Hb, -1))
        if ch.g:
            gindex = (rows[:, :, None] * t + ch.gk[bi][None, None, :]).flatten()
            target.index_add_(1, gindex, part[..., nb:].reshape(Hb, -1))


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, plan: BlockPlan, *, scale: float,
                           mask: Tensor | None = None, bias: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """softmax(scale q k^T + bias) v over the keys `plan` allows (and `mask`, if given).

    Args:
        q, k, v: (B, H, T, Dh), self-attention (same T).
        plan: the key blocks per query block, band, causality and global keys.
        scale: multiplies q . k.
        mask: bool, True = may attend, broadcastable to (B, H, T, T) (e.g. (B, 1, 1, T) padding).
        bias: float, broadcastable to (B, H, T, T); gets a gradient when it requires one.
        dropout_p: dropout on the attention weights (replayed exactly in the backward pass).

    Returns:
        (B, H, T, Dh); a query that may attend nowhere gets zeros.

    Raises:
        ValueError: for mismatched shapes.
    """
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must all be (B, H, T, Dh) of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    T = q.shape[2]
    if plan.table.shape[0] != -(-T // plan.block):
        raise ValueError(f"the plan covers {plan.table.shape[0]} blocks of {plan.block}, not T = {T}")
    mask = _as_4d(mask, "mask", T)
    bias = _as_4d(bias, "bias", T)
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True = may attend), got {mask.dtype}")
    plan = BlockPlan(plan.block, plan.table.to(q.device), plan.band, plan.causal,
                     None if plan.global_keys is None else plan.global_keys.to(q.device))
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p else 0
    return BlockSparseAttention.apply(q, k, v, bias, mask, plan, scale, float(dropout_p), seed)
