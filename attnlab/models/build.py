"""`build_model(config)`: the one place a ModelConfig turns into modules."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from attnlab.config import LONG_KERNELS, ModelConfig
from attnlab.models.embeddings import Embeddings
from attnlab.models.heads import (ClassificationHead, LMHead, MLMHead, NSPHead, Pooler, RegressionHead,
                                  TokenClassificationHead)
from attnlab.models.transformer import Decoder, Encoder, EncoderDecoder
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import FeedForward, TransformerLayer, make_norm
from attnlab.nn.linformer import LinformerKernel
from attnlab.nn.positions import (ALiBi, BinaryPositions, LearnedPositions, RelativePositions, RotaryEmbedding,
                                  SinusoidalPositions, T5RelativeBias)
from attnlab.nn.scores import build_score
from attnlab.nn.sparse import BigBirdKernel, LongformerKernel, SlidingWindowKernel


def _absolute_positions(cfg: ModelConfig) -> nn.Module | None:
    pos = cfg.position
    if pos.scheme == "sinusoidal":
        return SinusoidalPositions(cfg.d_model, layout=pos.sinusoidal_layout)
    if pos.scheme == "learned":
        return LearnedPositions(pos.max_len, cfg.d_model, offset=pos.learned_offset)
    if pos.scheme == "binary":
        return BinaryPositions(cfg.d_model, pos.max_len)
    return None


def _position_bias(cfg: ModelConfig, causal: bool) -> nn.Module | None:
    pos = cfg.position
    if pos.scheme == "alibi":
        return ALiBi(cfg.num_heads)
    if pos.scheme == "t5_bias":
        return T5RelativeBias(cfg.num_heads, pos.t5_num_buckets, pos.t5_max_distance, bidirectional=not causal)
    return None


class _TokenFlags:
    """Holds (B, T) bool flags `input_ids == global_token_id`, set by a hook on a stack's
    embeddings before its layers run, read by that stack's Longformer kernels."""

    def __init__(self, token_id: int):
        self.token_id = token_id
        self.value = None

    def hook(self, module: nn.Module, args: tuple) -> None:
        self.value = args[0] == self.token_id


def _long_kernel(cfg: ModelConfig, layer: int, token_flags: _TokenFlags | None) -> nn.Module | None:
    att = cfg.attention
    if att.kernel == "sliding_window":
        return SlidingWindowKernel(att.window)
    if att.kernel == "longformer":
        return LongformerKernel(att.window, att.global_positions, token_flags)
    if att.kernel == "bigbird":
        return BigBirdKernel(att.block_size, att.window_blocks, att.global_blocks, att.random_blocks,
                             att.random_seed + layer)
    if att.kernel == "linformer":
        return LinformerKernel(att.linformer_max_len, att.linformer_k, cfg.num_heads, att.linformer_sharing)
    return None


def _attention(cfg: ModelConfig, *, self_attention: bool, causal: bool = False, layer: int = 0,
               token_flags: _TokenFlags | None = None) -> MultiHeadAttention:
    att, pos, head_dim = cfg.attention, cfg.position, cfg.resolved_head_dim
    long_kernel = _long_kernel(cfg, layer, token_flags) if self_attention else None
    kernel = "auto" if att.kernel in LONG_KERNELS and not self_attention else att.kernel  # cross-attention
    rotary = relative = None
    if self_attention and pos.scheme == "rotary":
        rotary = RotaryEmbedding(head_dim, pos.rotary_dim, pos.rotary_base)
    if self_attention and pos.scheme == "relative":
        relative = RelativePositions(head_dim, pos.relative_max_distance, values=pos.relative_values)
    score = build_score(att.score, cfg.num_heads, head_dim, cosine_temperature=att.cosine_temperature,
                        additive_dim=att.additive_dim)
    return MultiHeadAttention(cfg.d_model, cfg.num_heads, head_dim=head_dim, num_kv_heads=att.num_kv_heads,
                              bias=att.bias, score=score, kernel=kernel, dropout=att.dropout,
                              rotary=rotary, relative=relative, long_kernel=long_kernel, causal=causal)


def _layers(cfg: ModelConfig, n: int, *, cross: bool, causal: bool = False,
            token_flags: _TokenFlags | None = None) -> list[TransformerLayer]:
    norm = partial(make_norm, cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
    return [
        TransformerLayer(
            _attention(cfg, self_attention=True, causal=causal, layer=i, token_flags=token_flags),
            FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, bias=cfg.ffn_bias),
            cross_attn=_attention(cfg, self_attention=False) if cross else None,
            make_norm=norm, placement=cfg.norm_placement, dropout=cfg.dropout,
        )
        for i in range(n)
    ]


def _token_flags(cfg: ModelConfig) -> _TokenFlags | None:
    att = cfg.attention
    return _TokenFlags(att.global_token_id) if att.kernel == "longformer" and att.global_token_id is not None else None


def _embeddings(cfg: ModelConfig, token: nn.Embedding) -> Embeddings:
    norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias) if cfg.embedding_norm else None
    return Embeddings(token, positions=_absolute_positions(cfg), scale=cfg.embedding_scale,
                      type_vocab_size=cfg.type_vocab_size, norm=norm, dropout=cfg.dropout)


def _final_norm(cfg: ModelConfig) -> nn.Module | None:
    return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias) if cfg.final_norm else None


def _head(cfg: ModelConfig, token: nn.Embedding) -> nn.Module | None:
    tied = token if cfg.tie_embeddings else None
    if cfg.head == "lm":
        return LMHead(cfg.d_model, cfg.vocab_size, bias=cfg.lm_head_bias, tied=tied, scale=cfg.lm_head_scale)
    if cfg.head == "mlm":
        norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        return MLMHead(cfg.d_model, cfg.vocab_size, activation=cfg.activation, norm=norm, tied=tied)
    if cfg.head == "classification":
        return ClassificationHead(cfg.d_model, cfg.num_labels, cfg.dropout)
    if cfg.head == "token_classification":
        return TokenClassificationHead(cfg.d_model, cfg.num_labels, cfg.dropout)
    if cfg.head == "regression":
        return RegressionHead(cfg.d_model, cfg.dropout)
    return None


def init_weights(model: nn.Module, std: float) -> None:
    """Normal(0, std) for linear and embedding weights, zero biases; norms and position
    tables keep the initialisation their modules give them."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


def _build_rnn(cfg: ModelConfig) -> nn.Module:
    """arch='rnn_encoder_decoder': torch's default RNN/Linear initialisation, embeddings N(0, 1/d_model)."""
    from attnlab.models.rnn import RNNEncoderDecoder

    r = cfg.rnn
    model = RNNEncoderDecoder(cfg.vocab_size, cfg.d_model, r.hidden_size, cell=r.cell, attention=r.attention,
                              num_layers=r.num_layers, bidirectional=r.bidirectional,
                              src_vocab_size=None if cfg.share_embeddings else cfg.resolved_src_vocab_size,
                              conv_window=r.conv_window, attention_hidden=r.attention_hidden,
                              dropout=cfg.dropout, tie_embeddings=cfg.tie_embeddings)
    if not any(p.is_meta for p in model.parameters()):
        with torch.no_grad():
            for emb in {id(e): e for e in (model.src_embed, model.tgt_embed)}.values():
                nn.init.normal_(emb.weight, std=cfg.d_model**-0.5)
    model.config = cfg
    return model


def build_model(config: ModelConfig) -> nn.Module:
    """An Encoder, Decoder or EncoderDecoder as `config.arch` says, freshly initialised.

    Build on the meta device to count parameters without allocating them:
    `with torch.device("meta"): build_model(cfg)`.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(config).__name__}")
    cfg = config
    if cfg.arch == "rnn_encoder_decoder":
        return _build_rnn(cfg)
    token = nn.Embedding(cfg.vocab_size, cfg.d_model)
    if cfg.arch == "decoder":
        flags = _token_flags(cfg)
        model = Decoder(_embeddings(cfg, token), _layers(cfg, cfg.num_layers, cross=False, causal=True,
                                                         token_flags=flags),
                        final_norm=_final_norm(cfg), position_bias=_position_bias(cfg, causal=True),
                        head=_head(cfg, token), classifier_pooling=cfg.classifier_pooling)
    elif cfg.arch == "encoder":
        flags = _token_flags(cfg)
        model = Encoder(_embeddings(cfg, token), _layers(cfg, cfg.num_layers, cross=False, token_flags=flags),
                        final_norm=_final_norm(cfg), position_bias=_position_bias(cfg, causal=False),
                        head=_head(cfg, token), classifier_pooling=cfg.classifier_pooling,
                        pooler=Pooler(cfg.d_model) if cfg.pooler else None,
                        nsp_head=NSPHead(cfg.d_model) if cfg.nsp_head else None)
    else:
        src_token = token if cfg.share_embeddings else nn.Embedding(cfg.resolved_src_vocab_size, cfg.d_model)
        flags, dec_flags = _token_flags(cfg), _token_flags(cfg)
        encoder = Encoder(_embeddings(cfg, src_token), _layers(cfg, cfg.num_layers, cross=False, token_flags=flags),
                          final_norm=_final_norm(cfg), position_bias=_position_bias(cfg, causal=False))
        decoder = Decoder(_embeddings(cfg, token), _layers(cfg, cfg.resolved_decoder_layers, cross=True, causal=True,
                                                           token_flags=dec_flags),
                          final_norm=_final_norm(cfg), position_bias=_position_bias(cfg, causal=True),
                          head=_head(cfg, token))
        model = EncoderDecoder(encoder, decoder)
    stacks = [(model.encoder, flags), (model.decoder, dec_flags)] if cfg.arch == "encoder_decoder" else [(model, flags)]
    for stack, stack_flags in stacks:
        if stack_flags is not None:  # longformer's global_token_id: flag the ids before the layers run
            stack.embed.register_forward_pre_hook(stack_flags.hook)
    if not any(p.is_meta for p in model.parameters()):
        with torch.no_grad():
            init_weights(model, cfg.init_std)
    model.config = cfg
    return model
