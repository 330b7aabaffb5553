"""Feed-forward, residual blocks and the Transformer layer (activations: `attnlab.nn.activations`,
norms: `attnlab.nn.norms`).

Norm placement around a sublayer f (Xiong et al. 2020, https://arxiv.org/abs/2002.04745):

    post (the paper):  x = Norm(x + Dropout(f(x)))
    pre:               x = x + Dropout(f(Norm(x)))            (needs a final norm on the stack)
    both (sandwich, the attention half of NormFormer, Shleifer et al. 2021):
                       x = x + Dropout(Norm'(f(Norm(x))))
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from attnlab.nn.activations import GATED as _GATED
from attnlab.nn.activations import activation_fn
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.hook_points import HookPoint, tap, tap_row
from attnlab.nn.kv_cache import LayerKV, Step
from attnlab.nn.linear import project
from attnlab.nn.norms import apply_norm


class FeedForward(nn.Module):
    """Position-wise W2 act(W1 x + b1) + b2; gated variants use W2 (act(W1 x) * W3 x).

    Gated variants hold W1 and W3 as one Linear `w13` ((2 F, D): W1's rows, then W3's), so x is
    read once; plain ones hold `w1`. Checkpoints that store w1 and w3 apart still load (`upgrade_state`).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True):
        super().__init__()
        self.act = activation_fn(activation)
        self.gated = activation in _GATED
        self.w1 = None if self.gated else nn.Linear(d_model, d_ff, bias=bias)
        self.w13 = nn.Linear(d_model, 2 * d_ff, bias=bias) if self.gated else None
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.hook_hidden = HookPoint()  # (..., F) what w2 reads: act(W1 x), or act(W1 x) * W3 x

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D); a decoding step's (N, D) goes through the inference layout."""
        m = self._modules  # the Linears, read once (see Residual)
        if self.gated:
            a, b = project(m["w13"], x).chunk(2, dim=-1)  # (..., F) each
            h = self.act(a) * b
        else:
            h = self.act(project(m["w1"], x))
        return project(m["w2"], tap(m["hook_hidden"], h))

    def upgrade_state(self, state: dict[str, Tensor], prefix: str) -> None:
        """Rename, in place, the tensors of a checkpoint saved before the gate was fused:
        `w1` and `w3` of a gated feed-forward become one `w13`."""
        if not self.gated:
            return
        for t in ("weight", "bias"):
            w1, w3 = f"{prefix}w1.{t}", f"{prefix}w3.{t}"
            if w1 in state and w3 in state:
                state[f"{prefix}w13.{t}"] = torch.cat([state.pop(w1), state.pop(w3)])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.upgrade_state(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class Residual(nn.Module):
    """A residual connection around one sublayer, with the norm(s) where `placement` says."""

    def __init__(self, make: Callable[[], nn.Module], placement: str, dropout: float):
        super().__init__()
        if placement not in ("post", "pre", "both"):
            raise ValueError(f"placement={placement!r} is not one of post, pre, both")
        self.placement = placement
        self.norm = make()
        self.post_norm = make() if placement == "both" else None
        self.dropout = nn.Dropout(dropout)

    # `_modules[...]`: a submodule read as an attribute goes through nn.Module's slow fallback, and a
    # decoding step reads these norms a dozen times per token

    def normed(self, x: Tensor) -> Tensor:
        """The sublayer's input: x, or Norm(x) before the sublayer (pre, both)."""
        return x if self.placement == "post" else apply_norm(self._modules["norm"], x)

    def add(self, x: Tensor, out: Tensor) -> Tensor:
        """x plus the sublayer's output `out` (computed on `normed(x)`), normed where placed."""
        post_norm = self._modules.get("post_norm")
        if post_norm is not None:  # both: Norm' on the sublayer's output
            out = apply_norm(post_norm, out)
        if self.training:  # dropout is the identity at inference: no call (a decoding step makes many)
            out = self.dropout(out)
        return apply_norm(self._modules["norm"], x + out) if self.placement == "post" else x + out

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.add(x, sublayer(self.normed(x)))


class TransformerLayer(nn.Module):
    """Self-attention, optional cross-attention to a memory, feed-forward; each in a Residual.

    An encoder layer has no cross-attention; a decoder layer of an encoder-decoder has one. An
    attention-only layer (`ffn=None`; d_ff=0 in a ModelConfig) has no feed-forward sublayer.
    Causality is the mask's business, not the layer's.

    Hook points (`attnlab.nn.hook_points`), each (B, T, D): `hook_resid_pre` (the layer's input),
    `hook_attn_out` (the self-attention's output, before dropout and the residual add),
    `hook_resid_mid` (after that add), `hook_cross_out` and `hook_resid_cross` (the same around the
    cross-attention, in layers that have one), `hook_ffn_out`, `hook_resid_post` (the layer's output).
    """

    def __init__(self, self_attn: MultiHeadAttention, ffn: nn.Module | None, *, make_norm: Callable[[], nn.Module],
                 placement: str = "post", dropout: float = 0.1, cross_attn: MultiHeadAttention | None = None):
        super().__init__()
        self.self_attn = self_attn
        self.self_attn_block = Residual(make_norm, placement, dropout)
        self.cross_attn = cross_attn
        self.cross_attn_block = Residual(make_norm, placement, dropout) if cross_attn is not None else None
        self.ffn = ffn
        self.ffn_block = Residual(make_norm, placement, dropout) if ffn is not None else None
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint(), HookPoint()
        if cross_attn is not None:
            self.hook_cross_out, self.hook_resid_cross = HookPoint(), HookPoint()
        if ffn is not None:
            self.hook_ffn_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: Tensor, mask: Tensor | None = None, *, bias: Tensor | None = None,
                positions: Tensor | None = None, key_positions: Tensor | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None,
                cache: LayerKV | None = None, mem: Tensor | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D). `positions` (B or 1, T) feed rotary/relative schemes
        (`key_positions`: those of every key when a cache or `mem` holds earlier ones); `memory`
        (B, S, D) with bool `memory_mask` broadcastable to (B, H, T, S). `mem` (B, M, D): this
        layer's inputs at the M positions before x (Transformer-XL's segment memory, detached);
        self-attention reads keys/values from [mem; x], both through the same norm."""
        k_pos = positions if key_positions is None else key_positions
        m = self._modules
        x = tap(m["hook_resid_pre"], x)
        block = self.self_attn_block
        past = block.normed(mem) if mem is not None else None
        h, _ = self.self_attn(block.normed(x), mask=mask, bias=bias, q_pos=positions, k_pos=k_pos, cache=cache,
                              mem=past)
        x = tap(m["hook_resid_mid"], block.add(x, tap(m["hook_attn_out"], h)))
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this layer has cross-attention: pass the encoder output as `memory`")
            block = self.cross_attn_block
            h, _ = self.cross_attn(block.normed(x), memory, mask=memory_mask, cache=cache)
            x = tap(m["hook_resid_cross"], block.add(x, tap(m["hook_cross_out"], h)))
        block = self.ffn_block
        if block is not None:
            x = block.add(x, tap(m["hook_ffn_out"], self.ffn(block.normed(x))))
        return tap(m["hook_resid_post"], x)

    def step(self, x: Tensor, kv: LayerKV, step: Step) -> Tensor:
        """`forward` for one new token per row while decoding: x (N, D) -> (N, D), the same
        modules and residual blocks; the shared per-step inputs (mask, positions) come in `step`
        (built once by `TransformerStack.step`), the new key/value go into `kv`. The hook points see
        (N, 1, D), as a forward's (B, T, D) with T = 1."""
        m = self._modules  # the sublayers, read once (see Residual)
        x = tap_row(m["hook_resid_pre"], x)
        block = m["self_attn_block"]
        h = tap_row(m["hook_attn_out"], m["self_attn"].step(block.normed(x), kv, step))
        x = tap_row(m["hook_resid_mid"], block.add(x, h))
        cross_attn = m.get("cross_attn")
        if cross_attn is not None:
            block = m["cross_attn_block"]
            h = tap_row(m["hook_cross_out"], cross_attn.step(block.normed(x), kv, step))
            x = tap_row(m["hook_resid_cross"], block.add(x, h))
        block, ffn = m["ffn_block"], m["ffn"]
        if block is not None:
            hidden = ffn._modules.get("hook_hidden")  # (a mixture of experts has none)
            if hidden is not None and hidden.hooked:  # its hook sees (N, 1, F)
                h = ffn(block.normed(x)[:, None])[:, 0]
            else:
                h = ffn(block.normed(x))
            x = block.add(x, tap_row(m["hook_ffn_out"], h))
        return tap_row(m["hook_resid_post"], x)
