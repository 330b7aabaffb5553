"""Multi-head attention: projections around a score function and a kernel.

Notation: B batch, Tq/Tk query/key lengths, D d_model, H query heads, G key/value heads
(G = H: multi-head; 1 < G < H: grouped-query; G = 1: multi-query), Dh head_dim.

    x (B, Tq, D) --q_proj--> (B, H, Tq, Dh) ---.
    context (B, Tk, D) --k_proj, v_proj--> (B, G, Tk, Dh), shared by H/G query heads each
                                              `--> softmax(f(q, k) + bias, mask) v --out_proj--> (B, Tq, D)

Self-attention passes no `context` (keys and values come from x); cross-attention passes
the encoder output. The mask is bool, True = may attend, broadcastable to (B, H, Tq, Tk).

Long-input kernels (`sliding_window`, `longformer`, `bigbird`, `linformer`; attnlab.nn.sparse,
attnlab.nn.linformer) are injected as `long_kernel` and used for self-attention; `causal` says
whether the layer is a decoder's. They compute the pattern blockwise and AND it with the mask
given (padding, the decoder's causal mask). With a KV cache or need_weights=True, the sparse
patterns fall back to the dense kernels with the pattern as a bool mask over the keys so far
(same results; cost O(Tq * Tk) per call); Linformer refuses a cache (it is encoder-only).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.kernels import attention_weights, sdpa_attention
from attnlab.nn.kv_cache import LayerKV
from attnlab.nn.linformer import LinformerKernel
from attnlab.nn.positions import RelativePositions, RotaryEmbedding
from attnlab.nn.scores import ScaledDot, ScoreFunction


class MultiHeadAttention(nn.Module):
    """h heads of size Dh each, concatenated, then an output projection.

    Args:
        d_model: width of the input and output.
        num_heads: query heads H.
        head_dim: Dh; default d_model // num_heads.
        num_kv_heads: key/value heads G (must divide H); default H.
        bias: biases on the four projections.
        score: the score function; default `ScaledDot()`.
        kernel: `auto` (fused whenever possible), `eager` or `sdpa`.
        dropout: dropout on the attention weights while training.
        rotary: rotate q and k by position (self-attention only).
        relative: Shaw et al. relative position terms (self-attention only).
        kv_dim: width of `context` when it differs from d_model.
        long_kernel: the module computing a long-input kernel (`SlidingWindowKernel`,
            `LongformerKernel`, `BigBirdKernel`, `LinformerKernel`); required for those kernels.
        causal: this is a decoder's self-attention (the long kernels need to know; for the others
            causality stays the mask's business).
    """

    def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
                 num_kv_heads: int | None = None, bias: bool = True, score: ScoreFunction | None = None,
                 kernel: str = "auto", dropout: float = 0.0, rotary: RotaryEmbedding | None = None,
                 relative: RelativePositions | None = None, kv_dim: int | None = None,
                 long_kernel: nn.Module | None = None, causal: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or d_model // num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={num_heads}")
        long_names = ("sliding_window", "longformer", "bigbird", "linformer")
        if kernel not in ("auto", "eager", "sdpa", *long_names):
            raise ValueError(f"kernel={kernel!r} is not one of auto, eager, sdpa, {', '.join(long_names)}")
        if (kernel in long_names) != (long_kernel is not None):
            raise ValueError(f"kernel={kernel!r} and long_kernel={type(long_kernel).__name__}: the long-input "
                             "kernels need their module as long_kernel, the others none")
        if long_kernel is not None and not (score or ScaledDot()).fused:
            raise ValueError(f"kernel={kernel!r} needs a dot-product-shaped score, got {type(score).__name__}")
        if long_kernel is not None and relative is not None and relative.value_table is not None:
            raise ValueError(f"kernel={kernel!r} cannot add Shaw relative embeddings to the values")
        self.score = score if score is not None else ScaledDot()
        if kernel == "sdpa" and not self.score.fused:
            raise ValueError(f"kernel='sdpa' cannot compute score {type(self.score).__name__}")
        self.kernel = kernel
        self.long_kernel = long_kernel
        self.causal = causal
        self.dropout = dropout
        self.rotary = rotary
        self.relative = relative
        kv_dim = kv_dim or d_model
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(kv_dim, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(kv_dim, self.num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)

    def _heads(self, x: Tensor, proj: nn.Linear, n: int) -> Tensor:
        B, T, _ = x.shape
        return proj(x).view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, Dh)

    def uses_fused_kernel(self, need_weights: bool = False) -> bool:
        """Whether a forward call takes PyTorch's fused kernel."""
        values_term = self.relative is not None and self.relative.value_table is not None
        return self.kernel != "eager" and self.score.fused and not need_weights and not values_term

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None, *,
                bias: Tensor | None = None, q_pos: Tensor | None = None, k_pos: Tensor | None = None,
                need_weights: bool = False, cache: LayerKV | None = None) -> tuple[Tensor, Tensor | None]:
        """Attend from x (B, Tq, D) to context (default x).

        Args:
            mask: bool, True = may attend, broadcastable to (B, H, Tq, Tk).
            bias: additive float scores (ALiBi, T5), broadcastable to (B, H, Tq, Tk).
            q_pos, k_pos: position ids (B or 1, T) for rotary and relative schemes; with a cache,
                k_pos covers every key (cached and new), q_pos the new queries.
            need_weights: also return the attention weights (forces the eager kernel).
            cache: decoding state; self-attention appends the new keys and values to it,
                cross-attention projects the context once and reuses it.

        Returns:
            (output (B, Tq, D), weights (B, H, Tq, Tk) or None).
        """
        B, Tq, _ = x.shape
        if (self.rotary is not None or self.relative is not None) and (q_pos is None or k_pos is None):
            raise ValueError("rotary and relative positions need q_pos and k_pos")
        q = self._heads(x, self.q_proj, self.num_heads)  # (B, H, Tq, Dh)
        if self.rotary is not None:
            q = self.rotary.rotate(q, q_pos)
        if context is not None and cache is not None and cache.cross_k is not None:
            k, v = cache.cross_k, cache.cross_v  # the source was projected at the first step
        else:
            kv_in = x if context is None else context
            k = self._heads(kv_in, self.k_proj, self.num_kv_heads)  # (B, G, Tk, Dh)
            v = self._heads(kv_in, self.v_proj, self.num_kv_heads)
            if self.rotary is not None:
                k = self.rotary.rotate(k, k_pos[:, -k.shape[2]:])  # new keys are the last ones
            if cache is not None and context is not None:
                cache.cross_k, cache.cross_v = k, v
            elif cache is not None:
                k, v = cache.append(k, v)  # (B, G, past + Tq, Dh)
        rel_index = None
        if self.relative is not None:
            rel_index = self.relative.distance_index(q_pos, k_pos)
            rel_bias = self.relative.score_bias(q, rel_index, self.head_dim**-0.5)
            bias = rel_bias if bias is None else bias + rel_bias
        dropout_p = self.dropout if self.training else 0.0

        if self.long_kernel is not None and context is None:
            long = self._long_attention(q, k, v, mask, bias, dropout_p, need_weights, cache)
            if long is not None:
                out, weights = long
                out = out.transpose(1, 2).reshape(B, Tq, self.num_heads * self.head_dim)
                return self.out_proj(out), weights
            # a cache or need_weights: the dense kernels below, with the pattern as a mask
            Tk = k.shape[2]
            pattern = self.long_kernel.dense_mask(Tk, self.causal, device=q.device, batch=B)
            pattern = pattern[..., Tk - Tq:, :]  # the rows of the new queries
            if pattern.dim() == 2:
                pattern = pattern[None, None]
            mask = pattern if mask is None else mask & pattern
        if self.uses_fused_kernel(need_weights):
            qs, ks, scale = self.score.prepare(q, k)
            out = sdpa_attention(qs, ks, v, scale=scale, mask=mask, bias=bias, dropout_p=dropout_p,
                                 enable_gqa=self.num_kv_heads != self.num_heads)
            weights = None
        else:
            if self.num_kv_heads != self.num_heads:  # each key/value head serves H/G query heads
                k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
                v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
            scores = self.score(q, k)
            if bias is not None:
                scores = scores + bias.to(scores.dtype)
            weights = attention_weights(scores, mask)  # (B, H, Tq, Tk)
            dropped = F.dropout(weights, dropout_p) if dropout_p else weights
            out = dropped @ v
            if rel_index is not None and self.relative.value_table is not None:
                out = out + self.relative.value_term(dropped, rel_index)
        out = out.transpose(1, 2).reshape(B, Tq, self.num_heads * self.head_dim)
        return self.out_proj(out), weights

    def _long_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                        dropout_p: float, need_weights: bool, cache: LayerKV | None) -> tuple[Tensor, Tensor | None] | None:
        """The long-input kernel's (out (B, H, T, Dh), weights or None), or None to fall back to the
        dense kernels (sparse patterns under a cache or need_weights)."""
        if cache is not None or need_weights:
            if not isinstance(self.long_kernel, LinformerKernel):
                return None
        if self.num_kv_heads != self.num_heads:  # the long kernels take one key/value head per query head
            k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
            v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        qs, ks, scale = self.score.prepare(q, k)
        if isinstance(self.long_kernel, LinformerKernel):
            if cache is not None:
                raise ValueError("attention.kernel='linformer' is encoder-only and takes no KV cache")
            return self.long_kernel(qs, ks, v, scale=scale, causal=self.causal, mask=mask, bias=bias,
                                    dropout_p=dropout_p, need_weights=need_weights)
        out = self.long_kernel(qs, ks, v, scale=scale, causal=self.causal, mask=mask, bias=bias, dropout_p=dropout_p)
        return out, None
