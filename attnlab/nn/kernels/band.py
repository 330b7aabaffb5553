"""The banded fast path: attention over overlapping windows of tiles, on views, no full copies.

Notation: B batch, H heads, T length, Dh head_dim, b tile, s tiles per side, n = s + 1 (causal)
or 2 s + 1 tiles per window, K = n b window keys, g global keys, R b random keys per tile, c
tiles per chunk.

The window of query tile i is key rows [(i - s) b, (i - s + n) b): for the tiles of a chunk
these windows overlap inside one contiguous slice of k, so `unfold` views them all at once
(c, Dh, K) without copying; only a chunk that reaches past either end of the sequence gets a
small zero-padded temporary. Per chunk and head:

    scores (c, b, K + g + R b) = [scale q k_window^T + band | scale q k_global^T | scale q k_random^T]
    out    (c, b, Dh)          = softmax(scores) [v_window; v_global; v_random]

The band (b, K) is the same for every tile: |i - j| <= w (sliding window, Beltagy et al. 2020,
https://arxiv.org/abs/2004.05150), or every key of the window's tiles (BigBird's window blocks,
Zaheer et al. 2020, https://arxiv.org/abs/2007.14062), and j <= i when causal. Global keys
(Longformer / BigBird) and per-tile random key blocks (BigBird) are gathered, small. Global
queries, which see every key, take a dense row pass (g rows x T keys, one head at a time).

The backward pass recomputes each chunk's scores, writes dq straight into its rows and adds the
window gradients of k and v straight into their rows of dk, dv (one bmm per chunk, then n
shifted adds); random and global keys go back by index_add. Extra memory beyond q/k/v's
gradients and the output: one chunk's scores and a few O(T) vectors. Masked scores use a large
finite negative rather than -inf, so a query with no allowed key gives finite weights that are
then zeroed (never NaN).

Only a key mask (B, T) or none, and no bias: other masks and biases take the general block
kernel (`attnlab.nn.kernels.block_sparse`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 19  # scores per chunk and head (c * b * K): 2 MiB in fp32, cache-sized


def _rows(x: Tensor, start: int, stop: int) -> Tensor:
    """Rows [start, stop) of x (T, Dh), zeros outside [0, T): a view when inside."""
    T = x.shape[0]
    if start >= 0 and stop <= T:
        return x[start:stop]
    out = x.new_zeros(stop - start, x.shape[1])
    a, z = max(start, 0), min(stop, T)
    if z > a:
        out[a - start:z - start] = x[a:z]
    return out


class _Layout:
    """Tile geometry, the band's additive mask and the padded key validity."""

    def __init__(self, T: int, tile: int, side: int, window: int | None, causal: bool, key_valid: Tensor,
                 dtype: torch.dtype, extra: int = 0):
        b, dev = tile, key_valid.device
        self.T, self.b, self.side, self.window, self.causal = T, b, side, window, causal
        self.nq = math.ceil(T / b)
        self.n = side + 1 if causal else 2 * side + 1
        self.K = self.n * b
        self.left = side * b
        self.neg = torch.finfo(dtype).min / 4  # finite: sums of two stay finite
        d = torch.arange(b, device=dev)[:, None] - (torch.arange(self.K, device=dev)[None, :] - self.left)
        band = d >= 0 if causal else torch.ones_like(d, dtype=torch.bool)  # d: query minus key position
        if window is not None:
            band = band & (d <= window) & (d >= -window)
        self.band_ok = band
        self.band_bias = torch.zeros(b, self.K, dtype=dtype, device=dev).masked_fill_(~band, self.neg)
        ok = torch.zeros(key_valid.shape[0], (self.nq + self.n - 1) * b, dtype=torch.bool, device=dev)
        ok[:, self.left:self.left + T] = key_valid
        self.key_ok = ok  # (B, L): key position p at index p + left
        self.key_valid = key_valid
        self.step = max(1, CHUNK_ELEMENTS // (b * (self.K + extra)))  # extra: global and random keys

    def chunks(self):
        """(chunk index, first tile, end tile)."""
        for ci, s in enumerate(range(0, self.nq, self.step)):
            yield ci, s, min(self.nq, s + self.step)

    def in_window(self, d: Tensor, qtile: Tensor, ktile: Tensor) -> Tensor:
        """Whether a key (query minus key position d, tiles qtile, ktile) lies in the query's window."""
        if self.window is not None:
            return (d <= self.window) & (d >= (0 if self.causal else -self.window))
        rel = qtile - ktile
        return (rel <= self.side) & (rel >= (0 if self.causal else -self.side)) & ((d >= 0) | (not self.causal))


class _Chunk:
    """One chunk's masks and gathered keys for batch row bi (shared by all heads)."""

    def __init__(self, lay: _Layout, bi: int, s: int, e: int, gpos: Tensor | None, gvalid: Tensor | None,
                 rtab: Tensor | None):
        b, c, neg, dev = lay.b, e - s, lay.neg, lay.key_ok.device
        self.s, self.e, self.c = s, e, c
        qi = torch.arange(s * b, e * b, device=dev).view(c, b, 1)
        valid = lay.key_ok[bi, s * b:(e + lay.n - 1) * b].unfold(0, lay.K, b)  # (c, K)
        allowed = lay.band_ok[None] & valid[:, None, :]  # (c, b, K)
        self.key_bias = None
        if not bool(valid.all()):
            self.key_bias = torch.zeros(c, 1, lay.K, dtype=lay.band_bias.dtype, device=dev)
            self.key_bias.masked_fill_(~valid[:, None, :], neg)
        rows = allowed.any(-1)
        self.g_bias = self.r_bias = self.rpos = None
        if gpos is not None:
            d = qi - gpos[bi][None, None, :]  # (c, b, g)
            ok = gvalid[bi][None, None, :] & ~lay.in_window(d, qi // b, gpos[bi][None, None, :] // b)
            if lay.causal:
                ok = ok & (d >= 0)
            self.g_bias = torch.zeros(ok.shape, dtype=lay.band_bias.dtype, device=dev).masked_fill_(~ok, neg)
            rows = rows | ok.any(-1)
        if rtab is not None:
            blocks = rtab[s:e]  # (c, R), sentinel nq
            pos = (blocks[..., None] * b + torch.arange(b, device=dev)).flatten(1)  # (c, R b)
            self.rpos = pos.clamp(max=lay.T - 1)
            ok = (pos < lay.T) & lay.key_valid[bi][self.rpos]
            self.r_bias = torch.zeros(c, 1, pos.shape[1], dtype=lay.band_bias.dtype, device=dev)
            self.r_bias.masked_fill_(~ok[:, None, :], neg)
            rows = rows | ok.any(-1)[:, None]
        self.rows = None if bool(rows.all()) else rows[..., None].to(lay.band_bias.dtype)  # (c, b, 1)

    def probs(self, lay: _Layout, qh: Tensor, kwin: Tensor, kg: Tensor | None, kr: Tensor | None,
              scale: float) -> Tensor:
        """softmax of the scores (c, b, K + g + R b)."""
        c, b = self.c, lay.b
        parts = [torch.baddbmm(lay.band_bias.expand(c, b, lay.K), qh, kwin, alpha=scale)]
        if self.key_bias is not None:
            parts[0].add_(self.key_bias)
        if kg is not None:
            g = kg.shape[0]  # one (c b, Dh) x (Dh, g) product, not c tiny ones
            sg = torch.addmm(self.g_bias.view(c * b, g), qh.reshape(c * b, -1), kg.t(), alpha=scale)
            parts.append(sg.view(c, b, g))
        if kr is not None:
            parts.append(torch.baddbmm(self.r_bias.expand(c, b, kr.shape[1]), qh, kr.transpose(1, 2), alpha=scale))
        sc = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return torch.softmax(sc, -1)


def _keep(shape, p: float, seed: int, device) -> Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.rand(shape, generator=gen, device=device) >= p).to(torch.float32) / (1 - p)


def _fold(target: Tensor, windows: Tensor, lay: _Layout, s: int, alpha: float) -> None:
    """Add window gradients (c, K, Dh) into target (T, Dh): tile o of the window of query tile
    i is key tile i - side + o; rows outside [0, T) are dropped."""
    c, _, Dh = windows.shape
    b, T = lay.b, lay.T
    full = T // b
    w = windows.view(c, lay.n, b, Dh)
    tiles = target[:full * b].view(full, b, Dh)
    for o in range(lay.n):
        j0 = s - lay.side + o  # key tile of the chunk's first query tile
        lo, hi = max(j0, 0), min(j0 + c, full)
        if hi > lo:
            tiles[lo:hi].add_(w[lo - j0:hi - j0, o], alpha=alpha)
        if full * b < T and j0 <= full < j0 + c:  # the last, partial tile
            target[full * b:].add_(w[full - j0, o, :T - full * b], alpha=alpha)


def _dense_rows(qg, k, v, allowed, scale, keep):
    """Weights (g, T) of queries qg (g, Dh) over every key, allowed (g, T) bool."""
    sc = torch.mm(qg, k.t()).mul_(scale).masked_fill_(~allowed, float("-inf"))
    p = torch.softmax(sc, -1).masked_fill_(~allowed.any(-1, keepdim=True), 0.0)
    return p, (p if keep is None else p * keep)


class BandAttention(torch.autograd.Function):
    """Banded attention (+ optional global keys, random key blocks and global queries) with a
    recomputing backward. See the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, key_valid, gpos, gvalid, qrows, rtab, window, side, causal, tile, scale, dropout_p,
                seed):
        B, H, T, Dh = q.shape
        lay = _Layout(T, tile, side, window, causal, key_valid, q.dtype, _extra(gpos, rtab, tile))
        b, K = lay.b, lay.K
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        with torch.no_grad():
            for bi in range(B):
                chunks = [(ci, _Chunk(lay, bi, s, e, gpos, gvalid, rtab)) for ci, s, e in lay.chunks()]
                for h in range(H):
                    qx, kx, vx = q[bi, h], k[bi, h], v[bi, h]
                    kg, vg = (None, None) if gpos is None else (kx[gpos[bi]], vx[gpos[bi]])
                    for ci, ch in chunks:
                        s, e, c = ch.s, ch.e, ch.c
                        qh = _rows(qx, s * b, e * b).view(c, b, Dh)
                        kwin = _rows(kx, (s - lay.side) * b, (e - lay.side + lay.n - 1) * b).unfold(0, K, b)
                        vwin = _rows(vx, (s - lay.side) * b, (e - lay.side + lay.n - 1) * b).unfold(0, K, b)
                        kr = vr = None
                        if ch.rpos is not None:
                            kr, vr = kx[ch.rpos], vx[ch.rpos]  # (c, R b, Dh)
                        p = ch.probs(lay, qh, kwin, kg, kr, scale)
                        if dropout_p:
                            p = p * _keep(p.shape, dropout_p, seed + (bi * H + h) * 100_003 + ci, p.device)
                        o = torch.bmm(p[..., :K], vwin.transpose(1, 2))  # (c, b, Dh)
                        at = K
                        if kg is not None:
                            o.view(-1, Dh).addmm_(p[..., at:at + kg.shape[0]].reshape(-1, kg.shape[0]), vg)
                            at += kg.shape[0]
                        if kr is not None:
                            o.baddbmm_(p[..., at:], vr)
                        if ch.rows is not None:
                            o.mul_(ch.rows)
                        stop = min(T, e * b) - s * b
                        out[bi, h, s * b:s * b + stop] = o.view(-1, Dh)[:stop]
                    if qrows is not None:
                        rows, allowed = _global_queries(qrows, bi, lay)
                        if rows.numel():
                            keep = _row_keep(rows, T, dropout_p, seed, bi * H + h, q.device)
                            out[bi, h, rows] = _dense_rows(qx[rows], kx, vx, allowed, scale, keep)[1] @ vx
        ctx.save_for_backward(q, k, v, key_valid, gpos, gvalid, qrows, rtab, out)
        ctx.args = (window, side, causal, tile, scale, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, key_valid, gpos, gvalid, qrows, rtab, out = ctx.saved_tensors
        window, side, causal, tile, scale, dropout_p, seed = ctx.args
        B, H, T, Dh = q.shape
        lay = _Layout(T, tile, side, window, causal, key_valid, q.dtype, _extra(gpos, rtab, tile))
        b, K = lay.b, lay.K
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk, dv = torch.zeros(k.shape, dtype=k.dtype, device=k.device), torch.zeros(v.shape, dtype=v.dtype,
                                                                                    device=v.device)
        for bi in range(B):
            chunks = [(ci, _Chunk(lay, bi, s, e, gpos, gvalid, rtab)) for ci, s, e in lay.chunks()]
            is_row = None
            if qrows is not None:  # a global query's band output was replaced: no band gradient
                rows, allowed = _global_queries(qrows, bi, lay)
                is_row = torch.ones(lay.nq * b, 1, dtype=q.dtype, device=q.device)
                is_row[rows] = 0
            for h in range(H):
                qx, kx, vx, gx = q[bi, h], k[bi, h], v[bi, h], grad_out[bi, h]
                kg, vg = (None, None) if gpos is None else (kx[gpos[bi]], vx[gpos[bi]])
                dkg = dvg = None
                if kg is not None:
                    dkg, dvg = torch.zeros_like(kg), torch.zeros_like(vg)
                for ci, ch in chunks:
                    s, e, c = ch.s, ch.e, ch.c
                    qh = _rows(qx, s * b, e * b).view(c, b, Dh)
                    doh = _rows(gx, s * b, e * b).reshape(c, b, Dh)
                    if ch.rows is not None:
                        doh = doh * ch.rows  # a query with no key had its output zeroed
                    if is_row is not None:
                        doh = doh * is_row[s * b:e * b].view(c, b, 1)
                    delta = (doh * _rows(out[bi, h], s * b, e * b).view(c, b, Dh)).sum(-1, keepdim=True)
                    kwin = _rows(kx, (s - lay.side) * b, (e - lay.side + lay.n - 1) * b).unfold(0, K, b)
                    vwin = _rows(vx, (s - lay.side) * b, (e - lay.side + lay.n - 1) * b).unfold(0, K, b)
                    kr = vr = None
                    if ch.rpos is not None:
                        kr, vr = kx[ch.rpos], vx[ch.rpos]
                    p = ch.probs(lay, qh, kwin, kg, kr, scale)
                    pd = p
                    if dropout_p:
                        keep = _keep(p.shape, dropout_p, seed + (bi * H + h) * 100_003 + ci, p.device)
                        pd = p * keep
                    pdt = pd.transpose(1, 2)  # (c, K + g + R b, b)
                    _fold(dv[bi, h], torch.bmm(pdt[:, :K], doh), lay, s, 1.0)
                    parts = [torch.bmm(doh, vwin)]  # dP (c, b, K)
                    at = K
                    if kg is not None:
                        g = kg.shape[0]
                        dvg.addmm_(pdt[:, at:at + g].transpose(0, 1).reshape(g, -1), doh.reshape(-1, Dh))
                        parts.append(torch.mm(doh.reshape(-1, Dh), vg.t()).view(c, b, g))
                        at += g
                    if kr is not None:
                        dv[bi, h].index_add_(0, ch.rpos.flatten(), torch.bmm(pdt[:, at:], doh).flatten(0, 1))
                        parts.append(torch.bmm(doh, vr.transpose(1, 2)))
                    dp = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
                    if dropout_p:
                        dp.mul_(keep)
                    ds = p.mul_(dp.sub_(delta))  # dS, in p's storage
                    dst = ds.transpose(1, 2)
                    dqh = torch.bmm(ds[..., :K], kwin.transpose(1, 2))
                    _fold(dk[bi, h], torch.bmm(dst[:, :K], qh), lay, s, scale)
                    at = K
                    if kg is not None:
                        g = kg.shape[0]
                        dqh.view(-1, Dh).addmm_(ds[..., at:at + g].reshape(-1, g), kg)
                        dkg.addmm_(dst[:, at:at + g].transpose(0, 1).reshape(g, -1), qh.reshape(-1, Dh))
                        at += g
                    if kr is not None:
                        dqh.baddbmm_(ds[..., at:], kr)
                        dk[bi, h].index_add_(0, ch.rpos.flatten(), torch.bmm(dst[:, at:], qh).flatten(0, 1),
                                             alpha=scale)
                    stop = min(T, e * b) - s * b
                    torch.mul(dqh.view(-1, Dh)[:stop], scale, out=dq[bi, h, s * b:s * b + stop])
                if kg is not None:
                    dk[bi, h].index_add_(0, gpos[bi], dkg, alpha=scale)
                    dv[bi, h].index_add_(0, gpos[bi], dvg)
                if qrows is not None and rows.numel():
                    _dense_rows_backward(qx, kx, vx, gx[rows], out[bi, h, rows], rows, allowed, scale,
                                         _row_keep(rows, T, dropout_p, seed, bi * H + h, q.device),
                                         dq[bi, h], dk[bi, h], dv[bi, h])
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None


def _extra(gpos: Tensor | None, rtab: Tensor | None, tile: int) -> int:
    """Keys per query beyond the window: global keys and random blocks."""
    return (0 if gpos is None else gpos.shape[1]) + (0 if rtab is None else rtab.shape[1] * tile)


def _global_queries(qrows: Tensor, bi: int, lay: _Layout) -> tuple[Tensor, Tensor]:
    """The global query rows of batch row bi (sentinel dropped) and their allowed keys (g, T)."""
    rows = qrows[bi][qrows[bi] < lay.T]
    allowed = lay.key_valid[bi][None, :].expand(rows.shape[0], lay.T)
    if lay.causal:
        allowed = allowed & (torch.arange(lay.T, device=rows.device)[None, :] <= rows[:, None])
    return rows, allowed


def _row_keep(rows: Tensor, T: int, p: float, seed: int, head: int, device) -> Tensor | None:
    return _keep((rows.shape[0], T), p, seed - 1 - head, device) if p else None


def _dense_rows_backward(qx, kx, vx, dout, out, rows, allowed, scale, keep, dq, dk, dv) -> None:
    """Add the gradients of the global query rows' dense attention into dq, dk, dv (T, Dh)."""
    p, pd = _dense_rows(qx[rows], kx, vx, allowed, scale, keep)
    dv.addmm_(pd.t(), dout)
    dp = torch.mm(dout, vx.t())
    if keep is not None:
        dp.mul_(keep)
    ds = p.mul_(dp.sub_((dout * out).sum(-1, keepdim=True)))  # (g, T)
    dq[rows] += torch.mm(ds, kx) * scale
    dk.addmm_(ds.t(), qx[rows], alpha=scale)


def _positions(x: Tensor | None, name: str, B: int, T: int, key_valid: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """(B, g) positions (sentinel >= T) -> (clamped positions, valid) or (None, None) when empty."""
    if x is None or x.shape[-1] == 0:
        return None, None
    if x.dim() != 2 or x.shape[0] != B or x.dtype != torch.long:
        raise ValueError(f"{name} must be a (B, g) LongTensor with B = {B}, got {x.dtype} {tuple(x.shape)}")
    pos = x.clamp(max=T - 1)
    return pos, (x < T) & key_valid.gather(1, pos)


def band_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int | None, causal: bool, tile: int, scale: float,
                   key_valid: Tensor | None = None, global_keys: Tensor | None = None,
                   global_queries: Tensor | None = None, window_blocks: int | None = None,
                   random_blocks: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """softmax over the band (and global and random keys) of scale q . k, times v.

    Args:
        q, k, v: (B, H, T, Dh), any strides.
        window: keys within distance `window` (sliding window), or None with `window_blocks`.
        causal: keys j <= i only.
        tile: tile size b (BigBird's block).
        scale: multiplies q . k.
        key_valid: (B, T) bool, False for padding keys; None = all valid.
        global_keys: (B, g) positions every query also sees (sentinel >= T = empty slot).
        global_queries: (B, g') positions whose queries see every (allowed) key instead.
        window_blocks: instead of `window`, every key of the tiles i - W .. i (+ W when
            bidirectional) of query tile i.
        random_blocks: (NQ, R) extra key tiles per query tile (sentinel NQ = none), disjoint
            from the window and global keys.
        dropout_p: dropout on the weights, replayed exactly by the backward pass.

    Returns:
        (B, H, T, Dh); a query with no allowed key gets zeros.

    Raises:
        ValueError: for both or neither of window / window_blocks, or malformed positions.
    """
    B, H, T, Dh = q.shape
    if (window is None) == (window_blocks is None):
        raise ValueError(f"give exactly one of window and window_blocks, got {window!r} and {window_blocks!r}")
    # a window wider than the sequence sees every key: clamped, it costs what the sequence needs
    # (unclamped, a 4,096 window at T = 1,024 computed a band 8x wider than the keys)
    window = min(window, T - 1) if window is not None else None
    window_blocks = min(window_blocks, math.ceil(T / tile) - 1) if window_blocks is not None else None
    side = math.ceil(window / tile) if window is not None else window_blocks
    if key_valid is None:
        key_valid = torch.ones(B, T, dtype=torch.bool, device=q.device)
    gpos, gvalid = _positions(global_keys, "global_keys", B, T, key_valid)
    qrows = None
    if global_queries is not None and global_queries.shape[-1]:
        _positions(global_queries, "global_queries", B, T, key_valid)
        qrows = global_queries
    if random_blocks is not None and random_blocks.shape != (math.ceil(T / tile), random_blocks.shape[1]):
        raise ValueError(f"random_blocks must be (NQ, R) with NQ = {math.ceil(T / tile)}, got "
                         f"{tuple(random_blocks.shape)}")
    if random_blocks is not None and random_blocks.shape[1] == 0:
        random_blocks = None
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p else 0
    return BandAttention.apply(q, k, v, key_valid, gpos, gvalid, qrows, random_blocks, window, side, causal, tile,
                               scale, float(dropout_p), seed)
