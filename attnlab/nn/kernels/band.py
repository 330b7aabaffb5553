"""The banded fast path: attention over overlapping windows of tiles, on views, no full copies.

Notation: B batch, H heads, T length, Dh head_dim, b tile, s tiles per side, n = s + 1 (causal)
or 2 s + 1 tiles per window, K = n b window keys, g global keys, R b random keys per tile, c
tiles per chunk.

The window of query tile i is key rows [(i - s) b, (i - s + n) b): for the tiles of a chunk
these windows overlap inside one contiguous slice of k, so `unfold` views them all at once
(c, Dh, K) without copying; only a chunk that reaches past either end of the sequence gets a
small zero-padded temporary. Per chunk and head, in base 2 (q scaled by scale * log2 e):

    scores  [(c, b, K) | (c, b, g) | (c, b, R b)] = [q k_window^T + band | q k_global^T | q k_random^T]
    out     (c, b, Dh) = softmax(scores) [v_window; v_global; v_random]

The three parts are never concatenated: each is exponentiated against the row's maximum and
summed on its own. The band (b, K) is the same for every tile: |i - j| <= w (sliding window,
Beltagy et al. 2020, https://arxiv.org/abs/2004.05150), or every key of the window's tiles
(BigBird's window blocks, Zaheer et al. 2020, https://arxiv.org/abs/2007.14062), and j <= i when
causal. Only its ragged edge columns hold masked entries (for a window that is a multiple of the
tile: two triangles, in the first and last tile of the window), so the mask is added to those
columns only. Global keys (Longformer / BigBird) and per-tile random key blocks (BigBird) are
gathered, small. Global queries, which see every key, take a dense row pass (g rows x T keys,
one head at a time).

The tile geometry (windows, masks, the pitched buffer) is `attnlab.nn.kernels.band_tiles`.

The forward pass keeps each query's log-sum-exp (B, H, T; fp32 under bf16 / fp16 inputs): the
backward pass recomputes a chunk's scores and takes the weights as exp2(s - lse), without a
second softmax. It writes dq straight into its rows. The window gradients of k and v are taken
by key tile, from the transposed band (`Pitched`): key tile j's gradient is one product over
the n query tiles that see it, added once into its rows of dk, dv (no n shifted adds of
per-query-tile windows); random and global keys go back by index_add. Extra memory beyond q/k/v's gradients and the output: the
log-sum-exp, one chunk's buffers (allocated once per call) and a few O(T) vectors. Masked scores
use a large finite negative rather than -inf, so a query with no allowed key gives finite
weights that are then zeroed (never NaN).

Only a key mask (B, T) or none, and no bias: other masks and biases take the general block
kernel (`attnlab.nn.kernels.block_sparse`).

In fp32 on the CPU, for the window alone (no global or random keys) and without dropout, the
elementwise passes run fused in `attnlab.nn.native` (band.cpp): forward, the band's mask, the
row maximum, exp2 and the sum in one op (`band_softmax_`); backward, P = exp2(s + mask) and
dS = P (dP - delta) in one (`band_weights`, dP computed first). A backward chunk holding a query
with no key (padding) takes the PyTorch passes, which zero its rows. Without the compiled ops
(no compiler, `ATTNLAB_NATIVE=0`), the PyTorch passes everywhere; the two agree to fp32 rounding.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.nn import native
from attnlab.nn.kernels.band_tiles import Chunk, Layout, Pitched, accumulate, padded_rows, put_rows, tile_rows

# scores are kept in base 2 (q scaled by scale * log2 e): torch's exp2 is as fast on the masked
# scores (a large negative) as on any other, its exp 15x slower there
LOG2E = math.log2(math.e)


def _keep(shape, p: float, seed: int, like: Tensor) -> Tensor:
    """Dropout's keep-scales (0 or 1 / (1 - p)), drawn from `seed`, in like's dtype and device."""
    gen = torch.Generator(device=like.device).manual_seed(seed)
    return (torch.rand(shape, generator=gen, device=like.device) >= p).to(like.dtype) / (1 - p)


def _chunk_keep(parts: list[Tensor], p: float, seed: int) -> list[Tensor] | None:
    """The dropout keep-scales of one chunk, split like its score parts (one draw, replayed)."""
    if not p:
        return None
    keep = _keep(parts[0].shape[:2] + (sum(x.shape[-1] for x in parts),), p, seed, parts[0])
    return list(keep.split([x.shape[-1] for x in parts], dim=-1))


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
        lay = Layout(T, tile, side, window, causal, key_valid, q.dtype, _extra(gpos, rtab, tile))
        b, alpha = lay.b, scale * LOG2E
        ops = _fused_ops(q, gpos, rtab, dropout_p)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        # base-2 log-sum-exp of each query's scores, for the backward: in fp32 under bf16 / fp16 inputs
        work = torch.promote_types(q.dtype, torch.float32)
        lse = q.new_empty(B, H, lay.nq * b, 1, dtype=work)
        top, total = q.new_empty(lay.nq * b, 1), q.new_empty(lay.nq * b, 1, dtype=work)  # one head's max, sum
        obuf, sbuf = q.new_empty(lay.step, b, Dh), q.new_empty(lay.step, b, lay.K)
        with torch.no_grad():
            for bi in range(B):
                chunks = [(ci, Chunk(lay, bi, s, e, gpos, gvalid, rtab)) for ci, s, e in lay.chunks()]
                for h in range(H):
                    qx, kx, vx, ox = q[bi, h], k[bi, h], v[bi, h], out[bi, h]
                    kg, vg = (None, None) if gpos is None else (kx[gpos[bi]], vx[gpos[bi]])
                    for ci, ch in chunks:
                        s, e, c = ch.s, ch.e, ch.c
                        kr = vr = None
                        if ch.rpos is not None:
                            kr, vr = kx[ch.rpos], vx[ch.rpos]  # (c, R b, Dh)
                        qh = padded_rows(qx, s * b, e * b).view(c, b, Dh)
                        parts = ch.scores(lay, qh, lay.windows(kx, s, e), kg, kr, alpha, sbuf[:c], band=ops is None)
                        m, z = top[s * b:e * b].view(c, b, 1), total[s * b:e * b].view(c, b, 1)
                        if ops is not None:  # the band's mask, max, exp2 and sum in one pass
                            ops.band_softmax_(parts[0], lay.band_bias, m, z)
                        else:
                            torch.amax(parts[0], -1, keepdim=True, out=m)
                            for x in parts[1:]:
                                torch.maximum(m, x.amax(-1, keepdim=True), out=m)
                            for i, x in enumerate(parts):
                                x.sub_(m).exp2_()
                                if i:
                                    z.add_(x.sum(-1, keepdim=True, dtype=work))
                                else:
                                    torch.sum(x, -1, keepdim=True, dtype=work, out=z)
                        keep = _chunk_keep(parts, dropout_p, seed + (bi * H + h) * 100_003 + ci)
                        if keep is not None:
                            parts = [x * kp for x, kp in zip(parts, keep)]
                        o = tile_rows(ox, s, e, b, obuf[:c])
                        torch.bmm(parts[0], lay.windows(vx, s, e).transpose(1, 2), out=o)  # (c, b, Dh)
                        if kg is not None:
                            o.view(-1, Dh).addmm_(parts[1].reshape(-1, kg.shape[0]), vg)
                        if kr is not None:
                            o.baddbmm_(parts[-1], vr)
                        o.div_(z)
                        if ch.rows is not None:
                            o.mul_(ch.rows)  # a query with no key gets zeros
                        put_rows(ox, s, b, o)
                    torch.add(top, total.log2_(), out=lse[bi, h])  # max + log2(sum), the head at once
                    if qrows is not None:
                        rows, allowed = _global_queries(qrows, bi, lay)
                        if rows.numel():
                            keep = _row_keep(rows, T, dropout_p, seed, bi * H + h, q)
                            out[bi, h, rows] = _dense_rows(qx[rows], kx, vx, allowed, scale, keep)[1] @ vx
        ctx.save_for_backward(q, k, v, key_valid, gpos, gvalid, qrows, rtab, out, lse)
        ctx.args = (window, side, causal, tile, scale, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, key_valid, gpos, gvalid, qrows, rtab, out, lse = ctx.saved_tensors
        window, side, causal, tile, scale, dropout_p, seed = ctx.args
        B, H, T, Dh = q.shape
        lay = Layout(T, tile, side, window, causal, key_valid, q.dtype, _extra(gpos, rtab, tile))
        b, K, n, alpha = lay.b, lay.K, lay.n, scale * LOG2E
        fused = lse.dtype == q.dtype  # fp32 / fp64: - lse goes into the score product; bf16 / fp16: after it, in fp32
        ops = _fused_ops(q, gpos, rtab, dropout_p)
        # each row of dk, dv gets its window product once: unless global or random keys add to them
        # too, that product is written, not added (no zero fill first)
        fresh = gpos is None and rtab is None and qrows is None
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        new = torch.empty if fresh else torch.zeros
        dk, dv = new(k.shape, dtype=k.dtype, device=k.device), new(v.shape, dtype=v.dtype, device=v.device)
        sbuf, dpbuf = q.new_empty(lay.step, b, K), q.new_empty(lay.step, b, K)
        pbuf, dsbuf = Pitched(lay, q), Pitched(lay, q)  # the window's P and dS, read both ways
        dqbuf, kbuf = q.new_empty(lay.step, b, Dh), q.new_empty(lay.step + n - 1, b, Dh)
        neg_delta = q.new_zeros(lay.nq * b, 1)  # one head's -rowsum(dO * O), zero past T
        for bi in range(B):
            chunks = [(ci, Chunk(lay, bi, s, e, gpos, gvalid, rtab)) for ci, s, e in lay.chunks()]
            is_row = None
            if qrows is not None:  # a global query's band output was replaced: no band gradient
                rows, allowed = _global_queries(qrows, bi, lay)
                is_row = torch.ones(lay.nq * b, 1, dtype=q.dtype, device=q.device)
                is_row[rows] = 0
            for h in range(H):
                qx, kx, vx, gx, ox = q[bi, h], k[bi, h], v[bi, h], grad_out[bi, h], out[bi, h]
                kg, vg = (None, None) if gpos is None else (kx[gpos[bi]], vx[gpos[bi]])
                dkg = dvg = None
                if kg is not None:
                    dkg, dvg = torch.zeros_like(kg), torch.zeros_like(vg)
                _row_dots(gx, ox, neg_delta[:T]).neg_()
                if is_row is not None:
                    neg_delta.mul_(is_row)
                neg_lse = lse[bi, h].neg()
                for ci, ch in chunks:
                    s, e, c = ch.s, ch.e, ch.c
                    if s == 0:  # no query tile before the first
                        pbuf.clear_before()
                        dsbuf.clear_before()
                    qh = padded_rows(qx, s * b, e * b).view(c, b, Dh)
                    doh = padded_rows(gx, s * b, e * b).reshape(c, b, Dh)
                    mask = ch.rows  # a query with no key had its output zeroed, a global query's replaced
                    if is_row is not None:
                        here = is_row[s * b:e * b].view(c, b, 1)
                        mask = here if mask is None else mask * here
                    if mask is not None:
                        doh = doh * mask
                    nd = neg_delta[s * b:e * b].view(c, b, 1)
                    kwin, vwin = lay.windows(kx, s, e), lay.windows(vx, s, e)
                    kr = vr = None
                    if ch.rpos is not None:
                        kr, vr = kx[ch.rpos], vx[ch.rpos]
                    shift = neg_lse[s * b:e * b].view(c, b, 1)
                    fast = ops if mask is None else None  # no row to zero: P and dS in one fused pass
                    parts = ch.scores(lay, qh, kwin, kg, kr, alpha, sbuf[:c], shift=shift if fused else None,
                                      band=fast is None)
                    shift = None if fused else shift
                    keep = _chunk_keep(parts, dropout_p, seed + (bi * H + h) * 100_003 + ci)
                    pw, dsw = pbuf.by_query(c), dsbuf.by_query(c)
                    if keep is None:
                        dps = [torch.baddbmm(nd.expand(c, b, K), doh, vwin, out=dpbuf[:c])]  # dP - delta
                    else:  # under dropout, - delta comes after the keep
                        dps = [torch.bmm(doh, vwin, out=dpbuf[:c]).mul_(keep[0]).add_(nd)]
                    if fast is not None:  # P = exp2(s + band) and dS = P (dP - delta) in one pass
                        fast.band_weights(parts[0], lay.band_bias, dps[0], pw, dsw)
                    elif keep is None:
                        _weights(parts[0], shift, pw)  # the window's weights P
                    else:
                        torch.mul(_weights(parts[0], shift, parts[0]), keep[0], out=pw)  # P in parts[0], dropped in pw
                    if mask is not None:
                        pw.mul_(mask)  # read by key tile, P meets the unmasked dO
                    for x in parts[1:]:
                        _weights(x, shift, x)
                    pd = parts if keep is None else [x * kp for x, kp in zip(parts, keep)]
                    last = e == lay.nq
                    t0, t1 = pbuf.key_tiles(s, c, last)
                    if last:
                        pbuf.clear_after(c)
                        dsbuf.clear_after(c)
                    if t1 > t0:  # the window gradient of v, by key tile
                        accumulate(dv[bi, h], (s - side + t0) * b, pbuf.by_key(t0, t1),
                                    lay.query_windows(gx, s, t0, t1), 1.0, kbuf, fresh)
                    if kg is not None:
                        g = kg.shape[0]
                        dvg.addmm_(pd[1].reshape(-1, g).t(), doh.reshape(-1, Dh))
                        dps.append(torch.mm(doh.reshape(-1, Dh), vg.t()).view(c, b, g))
                    if kr is not None:
                        dv[bi, h].index_add_(0, ch.rpos.flatten(), torch.bmm(pd[-1].transpose(1, 2), doh).flatten(0, 1))
                        dps.append(torch.bmm(doh, vr.transpose(1, 2)))
                    if fast is None:
                        torch.mul(pw if keep is None else parts[0], dps[0], out=dsw)  # dS / scale
                    for i in range(1, len(parts)):
                        if keep is not None:
                            dps[i].mul_(keep[i])
                        parts[i].mul_(dps[i].add_(nd))  # dS / scale, in P's storage
                    dqh = tile_rows(dq[bi, h], s, e, b, dqbuf[:c])
                    dqh.baddbmm_(dsw, kwin.transpose(1, 2), beta=0, alpha=scale)
                    if t1 > t0:
                        accumulate(dk[bi, h], (s - side + t0) * b, dsbuf.by_key(t0, t1),
                                    lay.query_windows(qx, s, t0, t1), scale, kbuf, fresh)
                    if kg is not None:
                        dqh.view(-1, Dh).addmm_(parts[1].reshape(-1, g), kg, alpha=scale)
                        dkg.addmm_(parts[1].reshape(-1, g).t(), qh.reshape(-1, Dh))
                    if kr is not None:
                        dqh.baddbmm_(parts[-1], kr, alpha=scale)
                        dk[bi, h].index_add_(0, ch.rpos.flatten(),
                                             torch.bmm(parts[-1].transpose(1, 2), qh).flatten(0, 1), alpha=scale)
                    put_rows(dq[bi, h], s, b, dqh)
                    pbuf.carry(c)
                    dsbuf.carry(c)
                if kg is not None:
                    dk[bi, h].index_add_(0, gpos[bi], dkg, alpha=scale)
                    dv[bi, h].index_add_(0, gpos[bi], dvg)
                if qrows is not None and rows.numel():
                    _dense_rows_backward(qx, kx, vx, gx[rows], out[bi, h, rows], rows, allowed, scale,
                                         _row_keep(rows, T, dropout_p, seed, bi * H + h, q),
                                         dq[bi, h], dk[bi, h], dv[bi, h])
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None


def _fused_ops(q: Tensor, gpos: Tensor | None, rtab: Tensor | None, dropout_p: float):
    """`attnlab.nn.native`'s ops for the window's elementwise passes, where they apply: fp32 on
    the CPU, the window alone (no global or random keys, whose scores share the softmax), no
    dropout. None elsewhere, or where they are not built: the PyTorch passes."""
    if q.dtype != torch.float32 or q.device.type != "cpu" or gpos is not None or rtab is not None or dropout_p:
        return None
    return native.kernels()


def _weights(scores: Tensor, shift: Tensor | None, out: Tensor) -> Tensor:
    """out = exp2(scores + shift), the weights, with the shift (- lse) added in its own precision
    (fp32 for bf16 / fp16 scores); scores already shifted when shift is None."""
    if shift is None:
        return torch.exp2(scores, out=out)
    return out.copy_(torch.add(scores, shift).exp2_())


def _row_dots(x: Tensor, y: Tensor, out: Tensor, block: int = 4096) -> Tensor:
    """out (T, 1) = the row-wise dot products of x and y (T, Dh), a block of rows at a time (no
    (T, Dh) temporary)."""
    for i in range(0, x.shape[0], block):
        torch.sum(x[i:i + block] * y[i:i + block], -1, keepdim=True, out=out[i:i + block])
    return out


def _extra(gpos: Tensor | None, rtab: Tensor | None, tile: int) -> int:
    """Keys per query beyond the window: global keys and random blocks."""
    return (0 if gpos is None else gpos.shape[1]) + (0 if rtab is None else rtab.shape[1] * tile)


def _global_queries(qrows: Tensor, bi: int, lay: Layout) -> tuple[Tensor, Tensor]:
    """The global query rows of batch row bi (sentinel dropped) and their allowed keys (g, T)."""
    rows = qrows[bi][qrows[bi] < lay.T]
    allowed = lay.key_valid[bi][None, :].expand(rows.shape[0], lay.T)
    if lay.causal:
        allowed = allowed & (torch.arange(lay.T, device=rows.device)[None, :] <= rows[:, None])
    return rows, allowed


def _row_keep(rows: Tensor, T: int, p: float, seed: int, head: int, like: Tensor) -> Tensor | None:
    return _keep((rows.shape[0], T), p, seed - 1 - head, like) if p else None


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
