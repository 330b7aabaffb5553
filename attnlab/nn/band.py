"""The sliding-window fast path: banded attention over overlapping windows, no gathers.

Notation: B batch, H heads, T length, Dh head_dim, w window, b tile, s = ceil(w / b) tiles
per side, n = s + 1 (causal) or 2 s + 1 tiles per window, K = n b keys per window, g global
keys (Longformer), c tiles per chunk.

Per head, k is padded by s b zero rows on the left (and right, when bidirectional); the window
of query tile i is then rows [i b, i b + K) of that padded copy, and `unfold` views every window
at once without copying, so

    scores (c, b, K) = bmm(q tiles, k windows^T)    + band (b, K), the same for every tile
    out    (c, b, Dh) = bmm(softmax(scores), v windows)

The backward pass recomputes the scores per chunk and adds the key/value gradients back window
offset by window offset (one bmm per chunk, then n shifted adds). Extra memory: one head's padded
copies (O(T Dh)) and one chunk's scores. Masked scores use a large finite negative rather than
-inf, so a query with no allowed key gives finite weights that are then zeroed (never NaN).

Only a key mask (B, 1, 1, T) or none, and no bias: other masks and biases take the general
block kernel (`attnlab.nn.block_sparse`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 1 << 21  # scores per chunk and head (c * b * K): 8 MiB in fp32


class _Layout:
    """Window geometry, the band's additive mask and per-row key validity."""

    def __init__(self, T: int, window: int, causal: bool, tile: int, key_valid: Tensor, dtype: torch.dtype):
        b = tile
        self.T, self.b, self.window, self.causal = T, b, window, causal
        self.side = math.ceil(window / b)
        self.nq = math.ceil(T / b)
        self.n = self.side + 1 if causal else 2 * self.side + 1
        self.K = self.n * b
        self.left = self.side * b
        self.length = self.left + self.nq * b + (0 if causal else self.side * b)
        self.neg = torch.finfo(dtype).min / 4  # finite: sums of two stay finite
        r = torch.arange(b, device=key_valid.device)[:, None]
        col = torch.arange(self.K, device=key_valid.device)[None, :]
        d = r - (col - self.left)  # query minus key position, for every tile
        band = (d <= window) & (d >= (0 if causal else -window))
        self.band_bias = torch.zeros(b, self.K, dtype=dtype, device=key_valid.device).masked_fill_(~band, self.neg)
        ok = torch.zeros(key_valid.shape[0], self.length, dtype=torch.bool, device=key_valid.device)
        ok[:, self.left:self.left + T] = key_valid
        self.key_ok = ok  # (B, L)
        self.step = max(1, CHUNK_ELEMENTS // (b * self.K))

    def pad_keys(self, x: Tensor) -> Tensor:
        """(T, Dh) -> (L, Dh) with the zero rows around."""
        return F.pad(x, (0, 0, self.left, self.length - self.left - self.T))

    def pad_queries(self, x: Tensor) -> Tensor:
        return F.pad(x, (0, 0, 0, self.nq * self.b - self.T))

    def chunk_bias(self, bi: int, s: int, e: int, g_bias: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """(additive key bias (c, 1, K) or None when every key is valid, row validity (c, b, 1) or None)."""
        valid = self.key_ok[bi].unfold(0, self.K, self.b)[s:e]  # (c, K)
        key_bias = None
        if not bool(valid.all()):
            key_bias = torch.zeros(valid.shape, dtype=self.band_bias.dtype, device=valid.device)
            key_bias = key_bias.masked_fill_(~valid, self.neg)[:, None, :]
        if key_bias is None and g_bias is None:
            return None, None
        allowed = self.band_bias[None] > self.neg / 2
        if key_bias is not None:
            allowed = allowed & valid[:, None, :]
        rows = allowed.any(-1)
        if g_bias is not None:
            rows = rows | (g_bias > self.neg / 2).any(-1)
        return key_bias, rows[..., None]


def _global_bias(lay: _Layout, bi: int, s: int, e: int, gpos: Tensor, gvalid: Tensor) -> Tensor:
    """(c, b, g) additive mask of the global keys: allowed when valid, causal-ok and outside
    the window (inside, the window already counts them)."""
    qi = torch.arange(s * lay.b, e * lay.b, device=gpos.device).view(e - s, lay.b, 1)
    d = qi - gpos[bi][None, None, :]
    in_band = (d <= lay.window) & (d >= (0 if lay.causal else -lay.window))
    ok = gvalid[bi][None, None, :] & ~in_band
    if lay.causal:
        ok = ok & (d >= 0)
    return torch.zeros(ok.shape, dtype=lay.band_bias.dtype, device=ok.device).masked_fill_(~ok, lay.neg)


def _scores(lay, qh, kp, kgh, s, e, key_bias, g_bias):
    c = e - s
    kw = kp.unfold(0, lay.K, lay.b)[s:e]  # (c, Dh, K), a view
    sc = torch.baddbmm(lay.band_bias.expand(c, lay.b, lay.K), qh, kw)  # (c, b, K)
    if key_bias is not None:
        sc.add_(key_bias)
    if kgh is not None:
        sc = torch.cat([sc, torch.matmul(qh, kgh.t()) + g_bias], dim=-1)  # (c, b, K + g)
    return sc


def _keep(shape, p, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.rand(shape, generator=gen, device=device) >= p).to(torch.float32) / (1 - p)


def _fold(tiles: Tensor, windows: Tensor, s: int, e: int, n: int) -> None:
    """Add window gradients (c, K, Dh) into the padded per-tile gradient (L / b, b, Dh): tile o of
    the window of query tile i is key tile i + o."""
    c, K, Dh = windows.shape
    w = windows.view(c, n, K // n, Dh)
    for o in range(n):
        tiles[s + o:e + o] += w[:, o]


class BandAttention(torch.autograd.Function):
    """Sliding-window attention (+ optional global keys) with a recomputing backward."""

    @staticmethod
    def forward(ctx, q, k, v, kg, vg, key_valid, gpos, gvalid, window, causal, tile, scale, dropout_p, seed):
        B, H, T, Dh = q.shape
        lay = _Layout(T, window, causal, tile, key_valid, q.dtype)
        out = torch.empty_like(q)
        g = 0 if kg is None else kg.shape[2]
        with torch.no_grad():
            for bi in range(B):
                for h in range(H):
                    qp = lay.pad_queries(q[bi, h] * scale)
                    kp, vp = lay.pad_keys(k[bi, h]), lay.pad_keys(v[bi, h])
                    for ci, s in enumerate(range(0, lay.nq, lay.step)):
                        e = min(lay.nq, s + lay.step)
                        g_bias = _global_bias(lay, bi, s, e, gpos, gvalid) if g else None
                        key_bias, rows = lay.chunk_bias(bi, s, e, g_bias)
                        qh = qp[s * lay.b:e * lay.b].view(e - s, lay.b, Dh)
                        p = torch.softmax(_scores(lay, qh, kp, kg[bi, h] if g else None, s, e, key_bias, g_bias), -1)
                        if dropout_p:
                            p = p * _keep(p.shape, dropout_p, seed + (bi * H + h) * 100_003 + ci, p.device)
                        o = torch.bmm(p[..., :lay.K], vp.unfold(0, lay.K, lay.b)[s:e].transpose(1, 2))
                        if g:
                            o += torch.matmul(p[..., lay.K:], vg[bi, h])
                        if rows is not None:
                            o = o * rows
                        o = o.view(-1, Dh)
                        stop = min(T, e * lay.b) - s * lay.b
                        out[bi, h, s * lay.b:s * lay.b + stop] = o[:stop]
        ctx.save_for_backward(q, k, v, kg, vg, key_valid, gpos, gvalid, out)
        ctx.args = (window, causal, tile, scale, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, kg, vg, key_valid, gpos, gvalid, out = ctx.saved_tensors
        window, causal, tile, scale, dropout_p, seed = ctx.args
        B, H, T, Dh = q.shape
        lay = _Layout(T, window, causal, tile, key_valid, q.dtype)
        b, K = lay.b, lay.K
        g = 0 if kg is None else kg.shape[2]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dkg = dvg = None
        if g:
            dkg, dvg = torch.zeros_like(kg), torch.zeros_like(vg)
        for bi in range(B):
            for h in range(H):
                qp = lay.pad_queries(q[bi, h] * scale)
                delta = (grad_out[bi, h] * out[bi, h]).sum(-1)  # (T,): rowsum(dO * O) = rowsum(P * dP)
                dop, dlt = lay.pad_queries(grad_out[bi, h]), F.pad(delta, (0, lay.nq * b - T))
                kp, vp = lay.pad_keys(k[bi, h]), lay.pad_keys(v[bi, h])
                dqp = torch.empty_like(qp)
                dkp, dvp = torch.zeros_like(kp), torch.zeros_like(vp)
                dkb, dvb = dkp.view(-1, b, Dh), dvp.view(-1, b, Dh)
                for ci, s in enumerate(range(0, lay.nq, lay.step)):
                    e = min(lay.nq, s + lay.step)
                    c = e - s
                    g_bias = _global_bias(lay, bi, s, e, gpos, gvalid) if g else None
                    key_bias, rows = lay.chunk_bias(bi, s, e, g_bias)
                    qh = qp[s * b:e * b].view(c, b, Dh)
                    doh = dop[s * b:e * b].view(c, b, Dh)
                    if rows is not None:
                        doh = doh * rows  # a query with no key had its output zeroed
                    p = torch.softmax(_scores(lay, qh, kp, kg[bi, h] if g else None, s, e, key_bias, g_bias), -1)
                    pd = p
                    if dropout_p:
                        keep = _keep(p.shape, dropout_p, seed + (bi * H + h) * 100_003 + ci, p.device)
                        pd = p * keep
                    _fold(dvb, torch.bmm(pd[..., :K].transpose(1, 2), doh), s, e, lay.n)
                    if g:
                        dvg[bi, h] += pd[..., K:].reshape(-1, g).t() @ doh.reshape(-1, Dh)
                    vw = vp.unfold(0, K, b)[s:e]  # (c, Dh, K)
                    dp = torch.bmm(doh, vw)  # (c, b, K)
                    if g:
                        dp = torch.cat([dp, torch.matmul(doh, vg[bi, h].t())], dim=-1)
                    if dropout_p:
                        dp = dp * keep
                    ds = p.mul_(dp.sub_(dlt[s * b:e * b].view(c, b, 1)))  # dS in p's storage
                    kw = kp.unfold(0, K, b)[s:e]
                    dqh = torch.bmm(ds[..., :K], kw.transpose(1, 2))
                    if g:
                        dqh += torch.matmul(ds[..., K:], kg[bi, h])
                        dkg[bi, h] += ds[..., K:].reshape(-1, g).t() @ qh.reshape(-1, Dh)
                    dqp[s * b:e * b] = dqh.view(-1, Dh)
                    _fold(dkb, torch.bmm(ds[..., :K].transpose(1, 2), qh), s, e, lay.n)
                dq[bi, h] = dqp[:T] * scale
                dk[bi, h] = dkp[lay.left:lay.left + T]
                dv[bi, h] = dvp[lay.left:lay.left + T]
        return dq, dk, dv, dkg, dvg, None, None, None, None, None, None, None, None, None


def band_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int, causal: bool, tile: int, scale: float,
                   key_valid: Tensor | None = None, global_keys: Tensor | None = None,
                   dropout_p: float = 0.0) -> Tensor:
    """softmax over keys within distance `window` (and the global keys) of scale q . k, times v.

    Args:
        q, k, v: (B, H, T, Dh).
        window, causal: the band (see `attnlab.nn.sparse.sliding_window_attention`).
        tile: tile size b.
        scale: multiplies q . k.
        key_valid: (B, T) bool, False for padding keys; None = all valid.
        global_keys: (B, g) positions every query also sees (sentinel >= T = empty slot).
        dropout_p: dropout on the weights, replayed exactly by the backward pass.

    Returns:
        (B, H, T, Dh); a query with no allowed key gets zeros.
    """
    B, H, T, Dh = q.shape
    if key_valid is None:
        key_valid = torch.ones(B, T, dtype=torch.bool, device=q.device)
    kg = vg = gpos = gvalid = None
    if global_keys is not None and global_keys.shape[1]:
        gvalid = (global_keys < T) & key_valid.gather(1, global_keys.clamp(max=T - 1))
        gpos = global_keys.clamp(max=T - 1)
        idx = gpos[:, None, :, None].expand(B, H, gpos.shape[1], Dh)
        kg, vg = k.gather(2, idx), v.gather(2, idx)  # autograd carries their gradients back to k, v
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p else 0
    return BandAttention.apply(q, k, v, kg, vg, key_valid, gpos, gvalid, window, causal, tile, scale,
                               float(dropout_p), seed)
