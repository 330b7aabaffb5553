"""The lean decoding step: one new token per row through a decoder stack, with packed weights.

Notation: N rows, D d_model, H query heads, G key/value heads, Dh head_dim, L tokens so far
(cached + the new one), S source length, V vocabulary, F d_ff.

At batch 1 a decoding step is a chain of matrix-vector products, bound by reading the weights
once; the generic `Decoder.features` adds per-step work a single new token does not need
(id and position checks, mask and position bookkeeping, module dispatch). This step does only
the arithmetic:

    h = E[token] * s + P[pos] (+ norm)                                   (N, D)
    per layer (norm placement as configured: post, pre, both):
      qkv = addmm(b, h', W_qkv)       W_qkv (D, (H + 2G) Dh): q, k, v fused, (in, out) layout
      k, v -> KVCache buffers at column L - 1 (rotary: rotated first, cos/sin once per step)
      a = sdpa(q, K[:, :, :L], V[:, :, :L], mask of real keys / ALiBi / T5 bias, built once per step)
      h = h + addmm(b_o, a, W_o)
      cross: q = addmm(b, h', W_q); keys/values of the source from the cache (projected once)
      ffn:   addmm(b_2, act(addmm(b_1, h', W_1 [| W_3])), W_2)     (gated: act(x W_1) * x W_3)
    logits = addmm(b, norm(h) * scale, W_head)                        W_head (D, V)

Weights are packed once per model (transposed to (in, out): a row vector times a row-major
matrix streams it in order, about twice as fast on a CPU as the (out, in) layout of nn.Linear
for the (D, V) head; with several CPU threads also cut into one column block per thread, see
`_Matrix`) and kept until a parameter or the thread count changes.
The step equals the generic path up to float rounding (tested: logits at every step against
a full forward pass, atol 1e-5). Configurations it does not cover fall back to the generic
path: see `unsupported`.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.embeddings import Embeddings
from attnlab.models.heads import LMHead
from attnlab.models.transformer import Decoder
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kv_cache import KVCache
from attnlab.nn.layers import FeedForward, Residual, TransformerLayer
from attnlab.nn.positions import BinaryPositions, LearnedPositions, RotaryEmbedding, SinusoidalPositions
from attnlab.nn.scores import Cosine, Dot, General, ScaledDot

_PLAIN = (TransformerLayer, MultiHeadAttention, FeedForward, Residual, nn.Linear, nn.LayerNorm, nn.RMSNorm,
          nn.Dropout, nn.Embedding, Embeddings, LMHead, LearnedPositions, SinusoidalPositions, BinaryPositions,
          RotaryEmbedding, ScaledDot, Dot, Cosine, General)
_CACHE: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, PackedDecoder]]" = weakref.WeakKeyDictionary()


def _plain(module: nn.Module) -> bool:
    """Every submodule of the exact classes the lean step re-implements (subclasses such as
    tensor-parallel linears add behaviour it would skip), with no hooks."""
    for m in module.modules():
        if type(m) not in _PLAIN or m._forward_hooks or m._forward_pre_hooks:
            return False
    return True


def _attention_unsupported(attn: MultiHeadAttention, where: str) -> str | None:
    if attn.long_kernel is not None:
        return f"{where}: long-input kernel {attn.kernel!r}"
    if attn.relative is not None:
        return f"{where}: Shaw relative positions"
    if attn.kernel == "eager" or not attn.score.fused:
        return f"{where}: the eager kernel / score {type(attn.score).__name__}"
    return None


def unsupported(decoder: Decoder) -> str | None:
    """Why the lean step cannot run `decoder` (then generation takes the generic path), or None.

    Covered: every norm placement and norm, every feed-forward activation (gated too), learned,
    sinusoidal, binary, rotary, ALiBi, T5-bias and no positions, grouped key/value heads, every
    dot-product-shaped score with the fused kernel, cross-attention. Not covered: training mode
    (dropout), Shaw relative positions, the eager kernel or additive scores, long-input kernels,
    subclassed modules (e.g. tensor-parallel linears) and hooks.

    Args:
        decoder: the Decoder stack with an LM head (`runner.lm_decoder(model)`).

    Returns:
        None when the lean step covers it, else a one-line reason.
    """
    if decoder.training:
        return "the model is in training mode (dropout); call model.eval()"
    for i, layer in enumerate(decoder.layers):
        reason = _attention_unsupported(layer.self_attn, f"layer {i} self-attention")
        if reason is None and layer.cross_attn is not None:
            reason = _attention_unsupported(layer.cross_attn, f"layer {i} cross-attention")
        if reason is not None:
            return reason
    if not isinstance(decoder.head, LMHead) or not all(_plain(m) for m in (decoder.embed, decoder.head, *decoder.layers)):
        return "modules of other classes than the generic stack's, or hooks"
    rotary = [layer.self_attn.rotary for layer in decoder.layers if layer.self_attn.rotary is not None]
    if any(r.rotary_dim != rotary[0].rotary_dim or not torch.equal(r.inv_freq, rotary[0].inv_freq) for r in rotary):
        return "rotary embeddings that differ between layers"
    return None


def _norm(module: nn.Module | None) -> Callable[[Tensor], Tensor] | None:
    """The norm as a plain function (LayerNorm/RMSNorm without module dispatch)."""
    if module is None:
        return None
    if type(module) is nn.LayerNorm:  # parameters bound once: no module attribute lookups per call
        shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
        return lambda x: F.layer_norm(x, shape, weight, bias, eps)
    if type(module) is nn.RMSNorm:
        shape, weight, eps = module.normalized_shape, module.weight, module.eps
        return lambda x: F.rms_norm(x, shape, weight, eps)
    return module


class _Matrix:
    """y = x @ W^T + b for x (N, in), with W packed once for the lean step.

    W is transposed to (in, out): a row times a row-major matrix streams it in order. On a CPU
    with T > 1 threads it is further cut into T column blocks, stored (T, in, out / T), and the
    product is one batched call, one block per thread: a BLAS matrix-vector call streams the whole
    weight on one core (24 GB/s measured on a 2-core EPYC; 35 GB/s with the blocks), and for a
    few rows the blocked product is 1.2-1.35x faster too. The blocks' outputs lie side by side:
    (T, 1, out / T) is the (1, out) row as it is; more rows need one (N, out) copy.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None):
        """weight (out, in) as in nn.Linear (several concatenated along out), bias (out,) or None."""
        n_out, n_in = weight.shape
        T = torch.get_num_threads()
        self.blocks = T if T > 1 and n_out % T == 0 and weight.device.type == "cpu" else 1
        w = weight.t()  # (in, out)
        if self.blocks == 1:
            self.w, self.b = w.contiguous(), bias
        else:
            self.w = w.reshape(n_in, T, n_out // T).transpose(0, 1).contiguous()  # (T, in, out / T)
            self.b = None if bias is None else bias.reshape(T, 1, n_out // T)

    def __call__(self, x: Tensor) -> Tensor:
        if self.blocks == 1:
            return torch.mm(x, self.w) if self.b is None else torch.addmm(self.b, x, self.w)
        N = x.shape[0]
        xs = x.expand(self.blocks, N, x.shape[1])  # a new leading dim, no copy
        y = torch.bmm(xs, self.w) if self.b is None else torch.baddbmm(self.b, xs, self.w)  # (T, N, out / T)
        return y.view(1, -1) if N == 1 else y.transpose(0, 1).reshape(N, -1)


def _pack(*linears: nn.Linear) -> _Matrix:
    """Linears sharing an input as one matrix: weights and biases concatenated along out."""
    biases = [m.bias for m in linears]
    return _Matrix(torch.cat([m.weight for m in linears], 0), None if biases[0] is None else torch.cat(biases))


class _Block:
    """One residual block: placement, its norm(s), and the sublayer as a function."""

    def __init__(self, residual: nn.Module):
        self.placement = residual.placement
        self.norm = _norm(residual.norm)
        self.post_norm = _norm(residual.post_norm)

    def __call__(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.placement == "post":
            return self.norm(x + sublayer(x))
        h = sublayer(self.norm(x))
        if self.post_norm is not None:
            h = self.post_norm(h)
        return x + h


class _Layer:
    """Packed weights of one decoder layer, and its single-token step."""

    def __init__(self, layer: nn.Module):
        attn = layer.self_attn
        self.H, self.G, self.Dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.score = attn.score
        self.rotary = attn.rotary
        self.qkv = _pack(attn.q_proj, attn.k_proj, attn.v_proj)
        self.out = _pack(attn.out_proj)
        self.attn_block = _Block(layer.self_attn_block)
        self.cross = None
        if layer.cross_attn is not None:
            c = layer.cross_attn
            self.cross = (_pack(c.q_proj), _pack(c.out_proj), c.score, c.num_heads, c.num_kv_heads, c.head_dim)
            self.cross_block = _Block(layer.cross_attn_block)
        ffn = layer.ffn
        self.act = ffn.act
        self.gated = ffn.w3 is not None
        self.w13 = _pack(ffn.w1, ffn.w3) if self.gated else _pack(ffn.w1)
        self.w2 = _pack(ffn.w2)
        self.ffn_block = _Block(layer.ffn_block)

    def _self_attention(self, x: Tensor, kv, L: int, attn_mask: Tensor | None,
                        rot: tuple[Tensor, Tensor] | None) -> Tensor:
        N, H, G, Dh = x.shape[0], self.H, self.G, self.Dh
        qkv = self.qkv(x)  # (N, (H + 2G) Dh)
        q = qkv[:, :H * Dh].view(N, H, 1, Dh)
        k = qkv[:, H * Dh:(H + G) * Dh].view(N, G, 1, Dh)
        v = qkv[:, (H + G) * Dh:].view(N, G, 1, Dh)
        if rot is not None and self.rotary is not None:
            q = self.rotary.apply_rotation(q, *rot)
            k = self.rotary.apply_rotation(k, *rot)
        kv.k[:, :, L - 1:L] = k
        kv.v[:, :, L - 1:L] = v
        kv.length = L
        qs, ks, scale = self.score.prepare(q, kv.k[:, :, :L])
        a = F.scaled_dot_product_attention(qs, ks, kv.v[:, :, :L], attn_mask=attn_mask, scale=scale,
                                           enable_gqa=G != H)  # (N, H, 1, Dh)
        return self.out(a.reshape(N, H * Dh))

    def _cross_attention(self, x: Tensor, kv, cross_mask: Tensor | None) -> Tensor:
        wq, wo, score, H, G, Dh = self.cross
        N = x.shape[0]
        q = wq(x).view(N, H, 1, Dh)
        qs, ks, scale = score.prepare(q, kv.cross_k)
        a = F.scaled_dot_product_attention(qs, ks, kv.cross_v, attn_mask=cross_mask, scale=scale, enable_gqa=G != H)
        return wo(a.reshape(N, H * Dh))

    def _ffn(self, x: Tensor) -> Tensor:
        h = self.w13(x)  # (N, F) or (N, 2F)
        if self.gated:
            a, b = h.chunk(2, dim=-1)
            h = self.act(a) * b
        else:
            h = self.act(h)
        return self.w2(h)

    def step(self, x: Tensor, kv, L: int, attn_mask: Tensor | None, rot, cross_mask: Tensor | None) -> Tensor:
        """x (N, D) of the new token -> (N, D); appends its key/value at column L - 1."""
        x = self.attn_block(x, lambda h: self._self_attention(h, kv, L, attn_mask, rot))
        if self.cross is not None:
            x = self.cross_block(x, lambda h: self._cross_attention(h, kv, cross_mask))
        return self.ffn_block(x, self._ffn)


class PackedDecoder:
    """A decoder stack's weights packed for the lean step (see the module docstring)."""

    def __init__(self, decoder: Decoder):
        embed = decoder.embed
        self.token = embed.token.weight
        self.scale = embed.scale
        self.positions = embed.positions
        self.learned = isinstance(embed.positions, LearnedPositions)
        self.segment = embed.segment.weight[0] if embed.segment is not None else None
        self.embed_norm = _norm(embed.norm)
        self.position_bias = decoder.position_bias
        rotary = [layer.self_attn.rotary for layer in decoder.layers if layer.self_attn.rotary is not None]
        self.rotary: RotaryEmbedding | None = rotary[0] if rotary else None
        self.layers = [_Layer(layer) for layer in decoder.layers]
        self.final_norm = _norm(decoder.final_norm)
        head = decoder.head
        self.head_scale = head.scale
        self.head_weight, self.head_bias = head.proj.weight, head.proj.bias  # (V, D), (V,) or None
        self._head: _Matrix | None = None

    def embed(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """tokens (N,), pos (N or 1, 1) -> (N, D)."""
        h = F.embedding(tokens, self.token) * self.scale
        if self.positions is not None:
            if self.learned:  # the context was checked once by generate: no per-step bound check
                p = self.positions.weight.index_select(0, pos.view(-1) + self.positions.offset)
            else:
                p = self.positions(pos).view(pos.shape[0], -1)
            h = h + p.to(h.dtype)
        if self.segment is not None:
            h = h + self.segment
        return self.embed_norm(h) if self.embed_norm is not None else h

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (N, D), after the final norm (the output of `Decoder.features`) -> logits (N, V)."""
        if self.head_scale != 1.0:
            hidden = hidden * self.head_scale
        if 1 < hidden.shape[0] <= 8:
            # a few rows: W (V, D) @ h^T (D, N) is the faster product; the bias add (or a copy)
            # writes it back as a contiguous (N, V)
            out_t = torch.mm(self.head_weight, hidden.t()).t()  # (N, V), strides (1, N)
            if self.head_bias is None:
                return out_t.contiguous()
            return torch.add(out_t, self.head_bias, out=out_t.new_empty(out_t.shape))
        if self._head is None:  # packed on first use (an extra copy of the (V, D) matrix)
            with torch.no_grad():
                self._head = _Matrix(self.head_weight, self.head_bias)
        return self._head(hidden)

    def step(self, tokens: Tensor, pos: Tensor, key_pos: Tensor | None, key_mask: Tensor | None, cache: KVCache,
             L: int, cross_mask: Tensor | None = None) -> Tensor:
        """One new token per row through the stack.

        Args:
            tokens: (N,) the new tokens, at position `pos` (N or 1, 1).
            key_pos: (N or 1, L) positions of every key (ALiBi / T5 bias), else unused.
            key_mask: (N, L) bool, True on real keys, or None when no key is padding.
            cache: filled up to L - 1 positions; the new key/value goes to column L - 1.
            cross_mask: (N, 1, 1, S) bool source mask of the cross-attention, or None.

        Returns:
            (N, V) next-token logits.
        """
        x = self.embed(tokens, pos)
        mask = key_mask[:, None, None, :] if key_mask is not None else None  # (N, 1, 1, L)
        if self.position_bias is not None:
            bias = self.position_bias(pos, key_pos).to(x.dtype)  # (N or 1, H, 1, L)
            mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
        rot = self.rotary.cos_sin(pos, x.dtype) if self.rotary is not None else None
        for i, layer in enumerate(self.layers):
            x = layer.step(x, cache.layers[i], L, mask, rot, cross_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.logits(x)


def _signature(decoder: Decoder) -> tuple:
    return torch.get_num_threads(), tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in decoder.parameters())


def packed(decoder: Decoder) -> PackedDecoder:
    """The packed weights of `decoder`, built on first use and rebuilt when any parameter's
    storage or in-place version changes (training steps, load_state_dict, .to()) or the number
    of torch threads does (the blocks of `_Matrix`).

    Args:
        decoder: a Decoder for which `unsupported(decoder)` is None.

    Returns:
        Its PackedDecoder, kept (weakly keyed by the decoder) for later calls.
    """
    signature = _signature(decoder)
    hit = _CACHE.get(decoder)
    if hit is not None and hit[0] == signature:
        return hit[1]
    with torch.no_grad():
        pack = PackedDecoder(decoder)
    _CACHE[decoder] = (signature, pack)
    return pack
