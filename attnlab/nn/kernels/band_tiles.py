"""The tile geometry of the banded kernel (`attnlab.nn.kernels.band`): which key rows each query
tile's window covers, the band's mask, one chunk's masks and gathered keys, and the pitched
buffer that lets the backward pass read a chunk's weights by query tile and by key tile.

Notation: T length, Dh head_dim, b tile, s tiles per side, n = s + 1 (causal) or 2 s + 1 tiles per
window, K = n b window keys, c tiles per chunk. Query tile i's window is key rows
[(i - s) b, (i - s + n) b); positions outside [0, T) read as zeros and are masked.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# scores per chunk and head (c * b * (K + g + R b)), 2 MiB in fp32: at 32k tokens (w = 256, 1 thread)
# 2^17 to 2^20 all ran within the shared machine's noise; at 2^16 the per-call overhead shows
CHUNK_ELEMENTS = 1 << 19

def padded_rows(x: Tensor, start: int, stop: int) -> Tensor:
    """Rows [start, stop) of x (T, Dh), zeros outside [0, T): a view when inside."""
    T = x.shape[0]
    if start >= 0 and stop <= T:
        return x[start:stop]
    out = x.new_zeros(stop - start, x.shape[1])
    a, z = max(start, 0), min(stop, T)
    if z > a:
        out[a - start:z - start] = x[a:z]
    return out


class Layout:
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
        self.edges = masked_columns(band)
        ok = torch.zeros(key_valid.shape[0], (self.nq + self.n - 1) * b, dtype=torch.bool, device=dev)
        ok[:, self.left:self.left + T] = key_valid
        self.key_ok = ok  # (B, L): key position p at index p + left
        self.key_valid = key_valid
        self.all_valid = key_valid.all(-1).tolist()  # per batch row: no padded key
        self.step = max(1, min(self.nq, CHUNK_ELEMENTS // (b * (self.K + extra))))  # extra: global, random keys

    def chunks(self):
        """(chunk index, first tile, end tile)."""
        for ci, s in enumerate(range(0, self.nq, self.step)):
            yield ci, s, min(self.nq, s + self.step)

    def windows(self, x: Tensor, s: int, e: int) -> Tensor:
        """The windows (c, Dh, K) of query tiles s..e-1 over x (T, Dh): a view when inside [0, T)."""
        return padded_rows(x, (s - self.side) * self.b, (e - self.side + self.n - 1) * self.b).unfold(0, self.K, self.b)

    def query_windows(self, x: Tensor, s: int, t0: int, t1: int) -> Tensor:
        """For key tiles j = s - side + t (t = t0 .. t1 - 1), the rows of x (T, Dh) of the n query
        tiles that see j, (t1 - t0, n b, Dh): a view when inside [0, T)."""
        b, n = self.b, self.n
        return padded_rows(x, (s - n + 1 + t0) * b, (s + t1) * b).unfold(0, n * b, b).transpose(1, 2)

    def mask_band(self, scores: Tensor) -> Tensor:
        """Add the band mask to the window scores (c, b, K), in place, on its masked columns only."""
        for lo, hi in self.edges:
            scores[..., lo:hi].add_(self.band_bias[:, lo:hi])
        return scores

    def in_window(self, d: Tensor, qtile: Tensor, ktile: Tensor) -> Tensor:
        """Whether a key (query minus key position d, tiles qtile, ktile) lies in the query's window."""
        if self.window is not None:
            return (d <= self.window) & (d >= (0 if self.causal else -self.window))
        rel = qtile - ktile
        return (rel <= self.side) & (rel >= (0 if self.causal else -self.side)) & ((d >= 0) | (not self.causal))


def masked_columns(band: Tensor) -> list[tuple[int, int]]:
    """Column ranges of the band (b, K) that hold a masked entry: the ragged edges before and
    after the columns every query of a tile sees, e.g. [(0, b), (K - b, K)] for a causal window
    that is a multiple of b; everything when the fully seen columns are not one run."""
    full = band.all(0).nonzero().flatten().tolist()
    K = band.shape[1]
    if not full or full[-1] - full[0] + 1 != len(full):
        return [(0, K)]
    return [(lo, hi) for lo, hi in ((0, full[0]), (full[-1] + 1, K)) if hi > lo]


class Chunk:
    """One chunk's masks and gathered keys for batch row bi (shared by all heads)."""

    def __init__(self, lay: Layout, bi: int, s: int, e: int, gpos: Tensor | None, gvalid: Tensor | None,
                 rtab: Tensor | None):
        b, c, neg, dev = lay.b, e - s, lay.neg, lay.key_ok.device
        self.s, self.e, self.c = s, e, c
        valid = lay.key_ok[bi, s * b:(e + lay.n - 1) * b].unfold(0, lay.K, b)  # (c, K)
        self.key_bias = None
        if not bool(valid.all()):  # keys before 0 or after T - 1, or padding
            self.key_bias = torch.zeros(c, 1, lay.K, dtype=lay.band_bias.dtype, device=dev)
            self.key_bias.masked_fill_(~valid[:, None, :], neg)
        # without padding every query sees at least its own key: only then can a row be empty
        rows = None if lay.all_valid[bi] else (lay.band_ok[None] & valid[:, None, :]).any(-1)  # (c, b)
        self.g_bias = self.r_bias = self.rpos = None
        if gpos is not None:
            qi = torch.arange(s * b, e * b, device=dev).view(c, b, 1)
            d = qi - gpos[bi][None, None, :]  # (c, b, g)
            ok = gvalid[bi][None, None, :] & ~lay.in_window(d, qi // b, gpos[bi][None, None, :] // b)
            if lay.causal:
                ok = ok & (d >= 0)
            self.g_bias = torch.zeros(ok.shape, dtype=lay.band_bias.dtype, device=dev).masked_fill_(~ok, neg)
            rows = None if rows is None else rows | ok.any(-1)
        if rtab is not None:
            blocks = rtab[s:e]  # (c, R), sentinel nq
            pos = (blocks[..., None] * b + torch.arange(b, device=dev)).flatten(1)  # (c, R b)
            self.rpos = pos.clamp(max=lay.T - 1)
            ok = (pos < lay.T) & lay.key_valid[bi][self.rpos]
            self.r_bias = torch.zeros(c, 1, pos.shape[1], dtype=lay.band_bias.dtype, device=dev)
            self.r_bias.masked_fill_(~ok[:, None, :], neg)
            rows = None if rows is None else rows | ok.any(-1)[:, None]
        self.rows = None if rows is None or bool(rows.all()) else rows[..., None].to(lay.band_bias.dtype)  # (c, b, 1)

    def scores(self, lay: Layout, qh: Tensor, kwin: Tensor, kg: Tensor | None, kr: Tensor | None, alpha: float,
               out: Tensor, shift: Tensor | None = None, band: bool = True) -> list[Tensor]:
        """The masked scores alpha q . k [window (c, b, K), global (c, b, g), random (c, b, R b)] of
        the queries qh (c, b, Dh), plus shift (c, b, 1) when given; the window part is written into out.
        band=False leaves the band's mask (`lay.band_bias`) out of the window part, for a fused
        pass that adds it (`attnlab.nn.native`)."""
        c, b = self.c, lay.b
        if shift is None:
            window = out.baddbmm_(qh, kwin, beta=0, alpha=alpha)
        else:  # the shift is copied into out, then the product added to it: no pass of its own
            window = torch.baddbmm(shift.expand_as(out), qh, kwin, alpha=alpha, out=out)
        parts = [lay.mask_band(window) if band else window]
        if self.key_bias is not None:
            window.add_(self.key_bias)
        if kg is not None:
            g = kg.shape[0]  # one (c b, Dh) x (Dh, g) product, not c tiny ones
            sg = torch.addmm(self.g_bias.view(c * b, g), qh.reshape(c * b, -1), kg.t(), alpha=alpha)
            parts.append(sg.view(c, b, g))
        if kr is not None:
            parts.append(torch.baddbmm(self.r_bias.expand(c, b, kr.shape[1]), qh, kr.transpose(1, 2), alpha=alpha))
        if shift is not None:
            for x in parts[1:]:
                x.add_(shift)
        return parts


class Pitched:
    """The window weights P (or their gradients dS) of a chunk, read by query tile and by key tile.

    A flat buffer of tiles b (K + 1) apart (b spare values after each tile, never read): the
    chunk's c query tiles after the n - 1 tiles before them (kept by `carry` from the chunk before,
    zeros before the first chunk), then room for n - 1 more (zeros after the last chunk):

        [ n - 1 carried | c of this chunk | n - 1 zeros (last chunk) ]     tile p at p b (K + 1)

    By query tile (`by_query`), tile p is (b, K): row r, column o b + kk = query r of tile p and
    key kk of its window tile o. By key tile (`by_key`), the n query tiles p = t .. t + n - 1 that
    see key tile t hold it as their window tile o = n - 1 - (p - t), at offset
    t b (K + 1) + (n - 1) b + ((p - t) b + r) K + kk: with that pitch, entry (kk, (p - t) b + r) is
    one strided (b, n b) matrix. So the window gradient of k (or v) is one product per key tile,
    (b, n b) x (n b, Dh), added once, instead of n shifted adds of per-query-tile windows."""

    def __init__(self, lay: Layout, like: Tensor):
        self.lay, self.pitch, self.pad = lay, lay.b * (lay.K + 1), lay.n - 1
        self.buf = like.new_empty((lay.step + 2 * self.pad) * self.pitch)

    def by_query(self, c: int) -> Tensor:
        """(c, b, K): the chunk's tiles."""
        lay = self.lay
        return self.buf.as_strided((c, lay.b, lay.K), (self.pitch, lay.K, 1), self.pad * self.pitch)

    def by_key(self, t0: int, t1: int) -> Tensor:
        """(t1 - t0, b, n b): key tiles t0 .. t1 - 1 (key tile j = s - side + t) against their queries."""
        lay = self.lay
        return self.buf.as_strided((t1 - t0, lay.b, lay.K), (self.pitch, 1, lay.K), t0 * self.pitch + self.pad * lay.b)

    def key_tiles(self, s: int, c: int, last: bool) -> tuple[int, int]:
        """The key tiles t0 .. t1 - 1 (j = s - side + t) completed by the chunk of tiles s .. s + c - 1:
        all its key tiles when it is the last."""
        side = self.lay.side
        return max(0, side - s), min(c + (self.pad if last else 0), self.lay.nq + side - s)

    def clear_before(self) -> None:
        self.buf[:self.pad * self.pitch].zero_()

    def clear_after(self, c: int) -> None:
        self.buf[(self.pad + c) * self.pitch:(2 * self.pad + c) * self.pitch].zero_()

    def carry(self, c: int) -> None:
        """The chunk's last n - 1 tiles become the tiles before the next chunk."""
        if self.pad:
            tail = self.buf[c * self.pitch:(c + self.pad) * self.pitch]
            self.buf[:self.pad * self.pitch] = tail if c >= self.pad else tail.clone()


def accumulate(target: Tensor, start: int, a: Tensor, x: Tensor, alpha: float, spare: Tensor, fresh: bool) -> None:
    """Rows start .. start + m b - 1 of target (T, Dh) += alpha a @ x (a: (m, b, K), x: (m, K, Dh)),
    rows past T dropped; = instead of += when `fresh`."""
    m, b, Dh = a.shape[0], a.shape[1], target.shape[1]
    if start + m * b <= target.shape[0]:
        target[start:start + m * b].view(m, b, Dh).baddbmm_(a, x, beta=0 if fresh else 1, alpha=alpha)
        return
    rows = torch.bmm(a, x, out=spare[:m]).view(-1, Dh)[:target.shape[0] - start]
    if fresh:
        torch.mul(rows, alpha, out=target[start:])
    else:
        target[start:].add_(rows, alpha=alpha)


def tile_rows(x: Tensor, s: int, e: int, b: int, spare: Tensor) -> Tensor:
    """Rows of tiles s..e-1 of x (T, Dh) as (c, b, Dh): a view of x when they lie inside it,
    else `spare` (to be copied back with `_put_rows`)."""
    if e * b <= x.shape[0]:
        return x[s * b:e * b].view(e - s, b, x.shape[1])
    return spare


def put_rows(x: Tensor, s: int, b: int, rows: Tensor) -> None:
    """Copy tile rows (c, b, Dh) back into x (T, Dh) from row s b, unless they are a view of it."""
    if rows.data_ptr() != x[s * b:].data_ptr():
        stop = x.shape[0] - s * b
        x[s * b:] = rows.view(-1, x.shape[1])[:stop]
