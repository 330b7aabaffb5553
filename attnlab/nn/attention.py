"""Multi-head attention: projections and positions around a score function and a kernel.

Notation: B batch, Tq/Tk query/key lengths, D d_model, H query heads, G key/value heads
(G = H: multi-head; 1 < G < H: grouped-query; G = 1: multi-query), Dh head_dim.

    self-attention:   x (B, Tq, D) --qkv_proj--> q (B, H, Tq, Dh) | k, v (B, G, Tq, Dh)  ---.
    cross-attention:  x (B, Tq, D) --q_proj--> q;  context (B, Tk, D) --kv_proj--> k | v  ---|
            `--> kernel: softmax(f(q, k) + bias, mask) v, each k/v head shared by H/G query heads
                 --out_proj--> (B, Tq, D)

The projections that read the same input are one fused Linear (litgpt's `qkv`): x is read
once and a decoding step makes one matrix product instead of three. The output columns of
`qkv_proj` are q's H heads, then k's G, then v's G (Dh each); `kv_proj` holds k's, then v's.
A self-attention module (the default) takes no `context`; one built with cross_attention=True
attends from x to the `context` it is given (the encoder output). The mask is bool, True =
may attend, broadcastable to (B, H, Tq, Tk).

`step` is the decoding fast path of `forward` for one new token per row: the same projections
(through their inference layout, `attnlab.nn.linear`) and the same kernel call, with the mask,
positions and rotation shared by all layers (`attnlab.nn.kv_cache.Step`).

The kernel (`attnlab.nn.kernels`) is picked once, at construction: a dot-product-shaped score
without a relative values term goes through the kernel's call (`_kernel_call`); any other score
or Shaw et al.'s values term takes the generic scoring path (`_scored`: any f(q, k), the eager
softmax, the values term). A call the kernel cannot do, as its `supports` says (a KV cache, the
weights), takes the dense reference instead: the scoring path with the kernel's sparse pattern
(`dense_mask`, if any) as a bool mask over the keys so far; same results, O(Tq * Tk) per call.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.kernels import Kernel, KernelSetup, build_kernel, eager_attention
from attnlab.nn.hook_points import HookPoint, tap
from attnlab.nn.kernels.base import repeat_kv
from attnlab.nn.kv_cache import LayerKV, Step
from attnlab.nn.linear import project
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
        kernel: a registered kernel name (built with its default options), or a built `Kernel`
            (`attnlab.nn.kernels.build_kernel`); `auto` resolves here to the fused kernel or eager.
        dropout: dropout on the attention weights while training.
        rotary: rotate q and k by position (self-attention only).
        relative: Shaw et al. relative position terms (self-attention only).
        kv_dim: width of `context` when it differs from d_model (cross-attention).
        cross_attention: attend to a `context` (q from x, k and v from the context: `q_proj`
            and a fused `kv_proj`); default self-attention (one fused `qkv_proj`).
        causal: this is a decoder's self-attention (kernels whose pattern applies causality read
            it; for the others causality stays the mask's business).

    Raises:
        ValueError: num_kv_heads not dividing num_heads, an unknown kernel, a kernel that
            cannot compute the score or the relative values term, or positions (rotary,
            relative) or kv_dim given to the wrong kind of attention.
    """

    def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
                 num_kv_heads: int | None = None, bias: bool = True, score: ScoreFunction | None = None,
                 kernel: str | Kernel = "auto", dropout: float = 0.0, rotary: RotaryEmbedding | None = None,
                 relative: RelativePositions | None = None, kv_dim: int | None = None,
                 cross_attention: bool = False, causal: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or d_model // num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={num_heads}")
        self.score = score if score is not None else ScaledDot()
        values_term = relative is not None and relative.value_table is not None
        if isinstance(kernel, str):
            # G too: a kernel with parameters per key/value head (a convolution compressing them) holds G of them
            setup = KernelSetup(num_heads, self.head_dim, num_kv_heads=self.num_kv_heads)
            kernel = build_kernel(kernel, setup=setup)
        kernel = kernel.resolve(fused_score=self.score.fused, value_term=values_term)
        if not kernel.supports.any_score and not self.score.fused:
            raise ValueError(f"kernel={kernel.name!r} needs a dot-product-shaped score, "
                             f"got {type(self.score).__name__}")
        if values_term and not kernel.supports.value_term:
            raise ValueError(f"kernel={kernel.name!r} cannot add Shaw relative embeddings to the values")
        self.kernel = kernel
        self._supports = kernel.supports  # read on every call: a plain attribute, not a submodule look-up
        # a dot-product-shaped score goes through the kernel; any other, or a values term, is scored here
        self._attend = self._kernel_call if self.score.fused and not values_term else self._scored
        self.causal = causal
        self.dropout = dropout
        self.rotary = rotary
        self.relative = relative
        q_width, kv_width = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if cross_attention:
            if rotary is not None or relative is not None:
                raise ValueError("rotary and relative positions apply to self-attention, not cross_attention=True")
            self.qkv_proj = None
            self.q_proj = nn.Linear(d_model, q_width, bias=bias)
            self.kv_proj = nn.Linear(kv_dim or d_model, 2 * kv_width, bias=bias)
        else:
            if kv_dim not in (None, d_model):
                raise ValueError(f"kv_dim={kv_dim} applies to cross_attention=True (self-attention reads x, width "
                                 f"d_model={d_model})")
            self.qkv_proj = nn.Linear(d_model, q_width + 2 * kv_width, bias=bias)
            self.q_proj = self.kv_proj = None
        self.out_proj = nn.Linear(q_width, d_model, bias=bias)
        # hook points (attnlab.nn.hook_points): q (B, H, T, Dh), k and v (B, G, T, Dh) as projected (before
        # rotation), the pattern (B, H, Tq, Tk), z (B, H, Tq, Dh) the heads' outputs before out_proj, result
        # (B, H, Tq, D) each head's share of the output (out_proj's bias excluded)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_pattern, self.hook_z, self.hook_result = HookPoint(), HookPoint(), HookPoint()
        self._points = (self.hook_q, self.hook_k, self.hook_v, self.hook_pattern, self.hook_z, self.hook_result)

    def hooked(self) -> bool:
        """Whether this module or one of its hook points has a forward hook."""
        if self._forward_hooks or self._forward_pre_hooks:
            return True
        for point in self._points:
            if point._forward_hooks or point._forward_pre_hooks:
                return True
        return False

    def _heads(self, y: Tensor, n: int) -> Tensor:
        """A projection's output (B, T, n Dh) -> (B, n, T, Dh)."""
        B, T, _ = y.shape
        return y.view(B, T, n, self.head_dim).transpose(1, 2)

    def uses_fused_kernel(self, need_weights: bool = False) -> bool:
        """Whether a forward call takes PyTorch's fused kernel."""
        s = self.kernel.supports
        return s.fused and self._attend == self._kernel_call and (s.weights or not need_weights)

    def upgrade_state(self, state: dict[str, Tensor], prefix: str) -> None:
        """Rename, in place, the tensors of a checkpoint saved by an older layout: a long-input
        kernel held as `long_kernel` (with its own parameters) is `kernel` now; separate
        q_proj, k_proj, v_proj are the fused `qkv_proj` (self-attention) or q_proj and a fused
        `kv_proj` (cross-attention)."""
        old = f"{prefix}long_kernel."
        for name in [n for n in state if n.startswith(old)]:
            state[f"{prefix}kernel.{name[len(old):]}"] = state.pop(name)
        fused, parts = ("qkv_proj", "qkv") if self.qkv_proj is not None else ("kv_proj", "kv")
        for t in ("weight", "bias"):
            names = [f"{prefix}{p}_proj.{t}" for p in parts]
            if all(n in state for n in names):
                state[f"{prefix}{fused}.{t}"] = torch.cat([state.pop(n) for n in names])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.upgrade_state(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None, *,
                bias: Tensor | None = None, q_pos: Tensor | None = None, k_pos: Tensor | None = None,
                need_weights: bool = False, cache: LayerKV | None = None,
                mem: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Attend from x (B, Tq, D) to context (default x).

        Args:
            mask: bool, True = may attend, broadcastable to (B, H, Tq, Tk).
            bias: additive float scores (ALiBi, T5), broadcastable to (B, H, Tq, Tk).
            q_pos, k_pos: position ids (B or 1, T) for rotary and relative schemes; with a cache,
                k_pos covers every key (cached and new), q_pos the new queries.
            need_weights: also return the attention weights (a kernel that cannot return them
                takes the dense reference for this call).
            cache: decoding state; self-attention appends the new keys and values to it,
                cross-attention projects the context once and reuses it.
            mem: (B, M, D) self-attention inputs at the M positions before x (Transformer-XL's
                segment memory, `attnlab.nn.kv_cache.SegmentMemory`): their keys and values come
                before x's, as a cache's would (k_pos then covers the M + Tq keys); no queries.

        Returns:
            (output (B, Tq, D), weights (B, H, Tq, Tk) or None).

        Raises:
            ValueError: missing position ids, or a call the kernel cannot do (cross-attention with a
                self-attention-only kernel; a cache with a kernel that has no dense equivalent).
        """
        B, Tq, _ = x.shape
        H, G = self.num_heads, self.num_kv_heads
        if (self.rotary is not None or self.relative is not None) and (q_pos is None or k_pos is None):
            raise ValueError("rotary and relative positions need q_pos and k_pos")
        if self.qkv_proj is not None:
            if context is not None:
                raise ValueError("this MultiHeadAttention is a self-attention: it takes no context "
                                 "(build it with cross_attention=True to attend to one)")
            q, k, v = self._heads(self.qkv_proj(x), H + 2 * G).split([H, G, G], dim=1)  # (B, H | G | G, Tq, Dh)
            q, k, v = tap(self.hook_q, q), tap(self.hook_k, k), tap(self.hook_v, v)
            if self.rotary is not None:
                q = self.rotary.rotate(q, q_pos)
                k = self.rotary.rotate(k, k_pos[:, -Tq:])  # new keys are the last ones
            if mem is not None:
                k, v = self._memory_kv(mem, k, v, k_pos)  # (B, G, M + Tq, Dh)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, G, past + Tq, Dh)
        else:
            if context is None:
                raise ValueError("this MultiHeadAttention is a cross-attention: pass the context (the encoder output)")
            if mem is not None:
                raise ValueError("a segment memory (mem) extends a self-attention's keys; this is a cross-attention")
            if not self.kernel.supports.cross_attention:
                raise ValueError(f"kernel={self.kernel.name!r} is for self-attention; cross-attention takes another")
            q = tap(self.hook_q, self._heads(self.q_proj(x), H))  # (B, H, Tq, Dh)
            if cache is not None and cache.cross_k is not None:
                k, v = cache.cross_k, cache.cross_v  # the source was projected at the first step
            else:
                k, v = self._heads(self.kv_proj(context), 2 * G).split([G, G], dim=1)  # (B, G, Tk, Dh)
                k, v = tap(self.hook_k, k), tap(self.hook_v, v)
                if cache is not None:
                    cache.cross_k, cache.cross_v = k, v
        # keys beyond the queries (a cache's or a memory's): kernels without that support take the dense reference
        out, weights = self._attention(q, k, v, mask, bias, q_pos, k_pos, need_weights,
                                       cache is not None or mem is not None)
        if self.hook_pattern.hooked:
            out, weights = self._hooked_pattern(q, k, v, out, weights, mask, bias, q_pos, k_pos)
        out = tap(self.hook_z, out)  # (B, H, Tq, Dh)
        y = self.out_proj(out.transpose(1, 2).reshape(B, Tq, H * self.head_dim))
        if self.hook_result.hooked:
            y = self._hooked_result(out, y)
        return y, weights

    def _hooked_pattern(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, weights: Tensor | None,
                        mask: Tensor | None, bias: Tensor | None, q_pos: Tensor | None,
                        k_pos: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The pattern through `hook_pattern`: the weights the call computed, or, under a kernel that
        returns none (a fused or sparse one), the same weights computed exactly on the side by the
        dense reference (a sparse kernel's over the keys it allows), the kernel's output kept. A hook
        that returns another pattern gets the output recomputed from it: pattern @ v."""
        s = self._supports
        if weights is None:
            bias, values = self._position_terms(q, q_pos, k_pos, bias)
            if s.dense_reference:
                _, weights = self._scored(q, k, v, self._with_pattern(mask, q, k), bias, 0.0, True, values)
            elif s.weights:
                _, weights = self._attend(q, k, v, mask, bias, 0.0, True, values)
            else:
                raise ValueError(f"attention.kernel={self.kernel.name!r} computes no attention pattern")
        edited = self.hook_pattern(weights)
        if edited is weights:
            return out, weights
        if not s.dense_reference:
            raise ValueError(f"attention.kernel={self.kernel.name!r} attends over keys it computes itself "
                             "(no dense equivalent): its pattern can be read, not replaced")
        if edited.shape != weights.shape:
            raise ValueError(f"a hook on hook_pattern returned shape {tuple(edited.shape)}; "
                             f"expected {tuple(weights.shape)}")
        _, vr = repeat_kv(k, v, self.num_heads)
        _, values = self._position_terms(q, q_pos, k_pos, None)
        edited = edited.to(vr.dtype)
        out = edited @ vr
        return (out if values is None else out + values(edited)), weights

    def _hooked_result(self, z: Tensor, y: Tensor) -> Tensor:
        """Each head's share of the output (B, H, Tq, D) through `hook_result`: out_proj of that
        head's z alone, its bias taken off; a hook that returns other shares gets their sum + bias."""
        B, H, Tq, Dh = z.shape
        blocks = z.new_zeros(B, H, Tq, H, Dh)
        index = torch.arange(H, device=z.device)
        blocks[:, index, :, index] = z.transpose(0, 1)  # head h's z in head h's columns only
        bias = self.out_proj.bias
        result = self.out_proj(blocks.view(B, H, Tq, H * Dh))
        if bias is not None:
            result = result - bias
        edited = self.hook_result(result)
        if edited is result:
            return y
        return edited.sum(1) + bias if bias is not None else edited.sum(1)

    def _memory_kv(self, mem: Tensor, k: Tensor, v: Tensor, k_pos: Tensor | None) -> tuple[Tensor, Tensor]:
        """The keys and values of the memory `mem` (B, M, D) put before the new ones k, v
        (B, G, Tq, Dh): projected by the key/value rows of `qkv_proj` only (the memory asks no
        queries), rotated at the first M of k_pos."""
        G, M = self.num_kv_heads, mem.shape[1]
        proj, rows = self.qkv_proj, self.num_heads * self.head_dim  # q's rows come first
        bias = proj.bias[rows:] if proj.bias is not None else None
        mk, mv = self._heads(F.linear(mem, proj.weight[rows:], bias), 2 * G).split([G, G], dim=1)  # (B, G, M, Dh)
        if self.rotary is not None:
            mk = self.rotary.rotate(mk, k_pos[:, :M])
        return torch.cat([mk, k], dim=2), torch.cat([mv, v], dim=2)

    def step(self, x: Tensor, kv: LayerKV, step: Step) -> Tensor:
        """`forward` for one new token per row while decoding: x (N, D) -> (N, D).

        Self-attention writes the new key/value into `kv` at column step.length - 1 and attends
        over the keys so far with `step`'s mask, bias and positions; cross-attention attends over
        the source keys/values the prompt's `forward` projected. A module with hooks takes its
        own `forward` (with the cache), so that the hooks see the call; so does one with a hooked
        hook point.
        """
        if self.hooked():
            if self.qkv_proj is None:
                return self(x[:, None], step.memory, mask=step.memory_mask, cache=kv)[0][:, 0]
            return self(x[:, None], mask=step.mask, bias=step.bias, q_pos=step.positions, k_pos=step.key_positions,
                        cache=kv)[0][:, 0]
        N, H, G, Dh = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        m = self._modules  # read once: a submodule read as an attribute takes nn.Module's slow fallback
        qkv_proj = m.get("qkv_proj")
        if qkv_proj is not None:
            qkv = project(qkv_proj, x).view(N, H + 2 * G, 1, Dh)
            q, k, v = qkv.narrow(1, 0, H), qkv.narrow(1, H, G), qkv.narrow(1, H + G, G)  # (N, H | G | G, 1, Dh)
            rotary = m.get("rotary")
            if rotary is not None:
                cos, sin = step.rotation(rotary, x.dtype)  # once per step for the whole stack
                q, k = rotary.apply_rotation(q, cos, sin), rotary.apply_rotation(k, cos, sin)
            k, v = kv.write(k, v, step.length)  # (N, G, L, Dh)
            out, _ = self._attention(q, k, v, step.mask, step.bias, step.positions, step.key_positions, False, True)
        else:
            q = project(m["q_proj"], x).view(N, H, 1, Dh)
            out, _ = self._attention(q, kv.cross_k, kv.cross_v, step.memory_mask, None, None, None, False, True)
        return project(m["out_proj"], out.reshape(N, H * Dh))

    def _attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                   q_pos: Tensor | None, k_pos: Tensor | None, need_weights: bool,
                   cached: bool) -> tuple[Tensor, Tensor | None]:
        """Heads after projection and positions -> (out (B, H, Tq, Dh), weights or None): Shaw's
        relative terms, then the kernel, or the dense reference for a call it cannot do."""
        bias, values = self._position_terms(q, q_pos, k_pos, bias)
        dropout_p = self.dropout if self.training else 0.0
        s = self._supports
        unsupported = ("a KV cache" if cached and not s.kv_cache
                       else "need_weights=True" if need_weights and not s.weights else None)
        if unsupported is None:
            return self._attend(q, k, v, mask, bias, dropout_p, need_weights, values)
        if s.dense_reference:
            return self._scored(q, k, v, self._with_pattern(mask, q, k), bias, dropout_p, need_weights, values)
        raise ValueError(f"attention.kernel={self.kernel.name!r} cannot run with {unsupported} and has no "
                         "dense equivalent to fall back on (it is for encoders, without a cache)")

    def _position_terms(self, q: Tensor, q_pos: Tensor | None, k_pos: Tensor | None,
                        bias: Tensor | None) -> tuple[Tensor | None, object]:
        """Shaw et al.'s relative terms: (the score bias with their key term added, their values
        term as a function of the weights, or None); the bias unchanged without them."""
        if self.relative is None:
            return bias, None
        rel_index = self.relative.distance_index(q_pos, k_pos)
        rel_bias = self.relative.score_bias(q, rel_index, self.head_dim**-0.5)
        bias = rel_bias if bias is None else bias + rel_bias
        values = partial(self.relative.value_term, index=rel_index) if self.relative.value_table is not None else None
        return bias, values

    def _kernel_call(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                     dropout_p: float, need_weights: bool, values=None) -> tuple[Tensor, Tensor | None]:
        """The kernel on the score's dot-product form: softmax(scale q' k'^T + bias, mask) v."""
        if not self._supports.grouped_kv:
            k, v = repeat_kv(k, v, self.num_heads)
        m = self._modules
        qs, ks, scale = m["score"].prepare(q, k)
        kernel = m["kernel"]
        # without hooks, the kernel's forward directly: a decoding step makes one call per layer
        call = kernel if kernel._forward_hooks or kernel._forward_pre_hooks else kernel.forward
        return call(qs, ks, v, scale=scale, mask=mask, bias=bias, dropout_p=dropout_p, causal=self.causal,
                    need_weights=need_weights)

    def _scored(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                dropout_p: float, need_weights: bool, values=None) -> tuple[Tensor, Tensor]:
        """The generic scoring path: any f(q, k) + bias, the eager softmax, the values term."""
        k, v = repeat_kv(k, v, self.num_heads)  # each key/value head serves H/G query heads
        scores = self.score(q, k)  # (B, H, Tq, Tk)
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        return eager_attention(scores, v, mask=mask, dropout_p=dropout_p, values=values)

    def _with_pattern(self, mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
        """`mask` AND the kernel's pattern, restricted to the rows of the Tq new queries."""
        Tq, Tk = q.shape[2], k.shape[2]
        pattern = self.kernel.dense_mask(Tk, self.causal, device=q.device, batch=q.shape[0])
        if pattern is None:
            return mask
        pattern = pattern[..., Tk - Tq:, :]
        if pattern.dim() == 2:
            pattern = pattern[None, None]
        return pattern if mask is None else mask & pattern
