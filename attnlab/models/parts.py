"""The modules a ModelConfig asks for — attention, layers, embeddings, heads — and the
initialisation of their weights: what every family's `build` (attnlab.models.families) composes."""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.embeddings import Embeddings
from attnlab.models.heads import ClassificationHead, LMHead, MLMHead, RegressionHead, TokenClassificationHead
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kernels import KernelSetup, TokenIds, build_kernel, kernel_class
from attnlab.nn.layers import FeedForward, TransformerLayer
from attnlab.nn.moe import MoEFeedForward
from attnlab.nn.norms import make_norm
from attnlab.nn.positions import POSITION_SCHEMES, Sizes
from attnlab.nn.scores import build_score


def position_module(cfg: ModelConfig, where: str, causal: bool = False) -> nn.Module | None:
    """The position module the scheme places at `where` (`embeddings`, `bias`, `rotary`,
    `relative`), or None when it acts elsewhere."""
    scheme = POSITION_SCHEMES[cfg.position.scheme]
    if scheme.where != where:
        return None
    width = cfg.position_dim if where == "embeddings" else cfg.d_model
    return scheme.build(cfg.position, Sizes(width, cfg.num_heads, cfg.resolved_head_dim, causal))


def token_ids_of(cfg: ModelConfig) -> TokenIds | None:
    """A stack's input ids holder, when its kernel picks tokens by id (set by a hook on its embeddings)."""
    att = cfg.attention
    return TokenIds() if kernel_class(att.kernel).needs_token_ids(att.kernel_options) else None


def _attention(cfg: ModelConfig, *, self_attention: bool, causal: bool = False, layer: int = 0,
               token_ids: TokenIds | None = None) -> MultiHeadAttention:
    att, head_dim = cfg.attention, cfg.resolved_head_dim
    name, options = att.kernel, att.kernel_options
    if not self_attention and not kernel_class(name).supports.cross_attention:
        name, options = "auto", None  # a self-attention-only kernel: cross-attention takes the default
    # built first, then positions and score: the order their parameters draw their initial values in
    kernel = build_kernel(name, options, KernelSetup(cfg.num_heads, head_dim, layer, token_ids,
                                                     num_kv_heads=cfg.resolved_num_kv_heads))
    positions = {}
    if self_attention:
        for where in ("rotary", "relative"):
            module = position_module(cfg, where, causal)
            if module is not None:
                positions[where] = module
    score = build_score(att.score, cfg.num_heads, head_dim, cosine_temperature=att.cosine_temperature,
                        additive_dim=att.additive_dim, gaussian_sigma=att.gaussian_sigma)
    return MultiHeadAttention(cfg.d_model, cfg.num_heads, head_dim=head_dim, num_kv_heads=att.num_kv_heads,
                              bias=att.bias, score=score, kernel=kernel, dropout=att.dropout, causal=causal,
                              cross_attention=not self_attention, **positions)


def transformer_layers(cfg: ModelConfig, n: int, *, cross: bool, causal: bool = False,
            token_ids: TokenIds | None = None) -> list[TransformerLayer]:
    norm = partial(make_norm, cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
    layers = [
        TransformerLayer(
            _attention(cfg, self_attention=True, causal=causal, layer=i, token_ids=token_ids),
            _feed_forward(cfg, i),
            cross_attn=_attention(cfg, self_attention=False) if cross else None,
            make_norm=norm, placement=cfg.norm_placement, dropout=cfg.dropout,
        )
        for i in range(n)
    ]
    return layers


def _feed_forward(cfg: ModelConfig, layer: int) -> nn.Module | None:
    """Layer `layer`'s feed-forward: plain, E of them behind a router (`cfg.moe`), or none (d_ff=0:
    attention-only layers)."""
    if not cfg.d_ff:
        return None

    def make() -> FeedForward:
        return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, bias=cfg.ffn_bias)

    moe = cfg.moe
    if not moe.num_experts or (layer + 1) % moe.every:
        return make()
    return MoEFeedForward(make, cfg.d_model, moe.num_experts, moe.top_k, moe.capacity_factor, moe.noisy)


def embeddings(cfg: ModelConfig, token: nn.Embedding) -> Embeddings:
    norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias) if cfg.embedding_norm else None
    return Embeddings(token, positions=position_module(cfg, "embeddings"), scale=cfg.embedding_scale,
                      type_vocab_size=cfg.type_vocab_size, norm=norm, dropout=cfg.dropout,
                      concat_dim=cfg.position_dim if cfg.position.combine == "concat" else 0)


def final_norm_of(cfg: ModelConfig) -> nn.Module | None:
    return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias) if cfg.final_norm else None


def _lm_head(cfg: ModelConfig, token: nn.Embedding) -> nn.Module:
    tied = token if cfg.tie_embeddings else None
    return LMHead(cfg.d_model, cfg.vocab_size, bias=cfg.lm_head_bias, tied=tied, scale=cfg.lm_head_scale)


def _mlm_head(cfg: ModelConfig, token: nn.Embedding) -> nn.Module:
    norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
    return MLMHead(cfg.d_model, cfg.vocab_size, activation=cfg.activation, norm=norm,
                   tied=token if cfg.tie_embeddings else None)


# `ModelConfig.head` -> (config, token embedding) -> the head on the last hidden state, or None
HEADS: dict[str, Callable[[ModelConfig, nn.Embedding], nn.Module | None]] = {
    "none": lambda cfg, token: None,
    "lm": _lm_head,
    "mlm": _mlm_head,
    "classification": lambda cfg, token: ClassificationHead(cfg.d_model, cfg.num_labels, cfg.dropout),
    "token_classification": lambda cfg, token: TokenClassificationHead(cfg.d_model, cfg.num_labels, cfg.dropout),
    "regression": lambda cfg, token: RegressionHead(cfg.d_model, cfg.dropout),
}


def head_of(cfg: ModelConfig, token: nn.Embedding) -> nn.Module | None:
    return HEADS[cfg.head](cfg, token)


def record_token_ids(stack: nn.Module, token_ids: TokenIds | None) -> None:
    """Give the stack's kernel its input ids (when it picks tokens by id): recorded by a hook on
    its embeddings, before the layers run."""
    if token_ids is not None:
        stack.embed.register_forward_pre_hook(token_ids.hook)


def init_transformer(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """`init_weights` with `cfg.init_std`, unless the model is on the meta device (nothing to fill)."""
    if not any(p.is_meta for p in model.parameters()):
        with torch.no_grad():
            init_weights(model, cfg.init_std)
    return model


def init_weights(model: nn.Module, std: float) -> None:
    """Normal(0, std) for linear and embedding weights, zero biases; norms and position
    tables keep the initialisation their modules give them."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
