"""Named model configurations: the published sizes, and tiny ones for tests and demos.

    cfg = attnlab.presets.get("gpt2-small")
    cfg = attnlab.presets.get("tiny-decoder", vocab_size=300)   # with overrides
"""

from __future__ import annotations

from typing import Any, Callable

from attnlab.config import AttentionConfig, ModelConfig, PositionConfig


def _vaswani(d_model: int, d_ff: int, heads: int, dropout: float) -> ModelConfig:
    # "Attention Is All You Need", table 3: shared 37k BPE vocabulary, tied embeddings and output
    return ModelConfig(arch="encoder_decoder", vocab_size=37000, d_model=d_model, num_layers=6, num_heads=heads,
                       d_ff=d_ff, activation="relu", dropout=dropout, norm_placement="post",
                       position=PositionConfig("sinusoidal"), embedding_scale=True, pad_token_id=0)


def _bert(d_model: int, layers: int, heads: int) -> ModelConfig:
    # Devlin et al. 2019: learned positions (512), two segments, embedding LayerNorm, pooler
    return ModelConfig(arch="encoder", vocab_size=30522, d_model=d_model, num_layers=layers, num_heads=heads,
                       d_ff=4 * d_model, activation="gelu", dropout=0.1, norm_eps=1e-12, norm_placement="post",
                       position=PositionConfig("learned", max_len=512), type_vocab_size=2, embedding_norm=True,
                       pooler=True, pad_token_id=0)


def _gpt(vocab: int, ctx: int, placement: str, activation: str) -> ModelConfig:
    return ModelConfig(arch="decoder", vocab_size=vocab, d_model=768, num_layers=12, num_heads=12, d_ff=3072,
                       activation=activation, dropout=0.1, norm_placement=placement,
                       position=PositionConfig("learned", max_len=ctx), tie_embeddings=True, pad_token_id=None)


def _t5_small() -> ModelConfig:
    # Raffel et al. 2020 (T5 v1.0): RMSNorm pre-norm, no biases, unscaled dot-product
    # attention, bucketed relative bias, ReLU feed-forward, tied embeddings
    return ModelConfig(arch="encoder_decoder", vocab_size=32128, d_model=512, num_layers=6, num_heads=8, d_ff=2048,
                       activation="relu", ffn_bias=False, dropout=0.1, norm="rmsnorm", norm_eps=1e-6,
                       norm_placement="pre", attention=AttentionConfig(score="dot", bias=False),
                       position=PositionConfig("t5_bias"), pad_token_id=0)


def _tiny(arch: str) -> ModelConfig:
    return ModelConfig(arch=arch, vocab_size=97, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                       norm_placement="pre", position=PositionConfig("learned", max_len=64), pad_token_id=0)


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "vaswani-base": lambda: _vaswani(512, 2048, 8, 0.1),
    "vaswani-big": lambda: _vaswani(1024, 4096, 16, 0.3),
    "bert-base": lambda: _bert(768, 12, 12),
    "bert-large": lambda: _bert(1024, 24, 16),
    "gpt1": lambda: _gpt(40478, 512, "post", "gelu"),
    "gpt2-small": lambda: _gpt(50257, 1024, "pre", "gelu_tanh"),
    "t5-small": _t5_small,
    "tiny-decoder": lambda: _tiny("decoder"),
    "tiny-encoder": lambda: _tiny("encoder"),
    "tiny-encoder-decoder": lambda: _tiny("encoder_decoder"),
}


def names() -> list[str]:
    """Every preset name."""
    return list(PRESETS)


def get(name: str, **overrides: Any) -> ModelConfig:
    """A fresh ModelConfig for preset `name`, with `overrides` applied (and validated).

    Raises:
        ValueError: unknown name or an invalid override.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    cfg = PRESETS[name]()
    return cfg.replace(**overrides) if overrides else cfg
