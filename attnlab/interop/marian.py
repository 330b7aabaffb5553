"""Marian (Junczys-Dowmunt et al. 2018, https://arxiv.org/abs/1804.00344) <-> attnlab: `MarianMTModel`.

Marian keeps the original Transformer's layout (Vaswani et al. 2017): post-LN, sinusoidal
positions, token embeddings scaled by sqrt(d_model), no embedding norm, a shared vocabulary
tied to the output — plus a bias on the logits (`final_logits_bias`). Its sinusoidal table
puts every sin first and every cos second (`position.sinusoidal_layout="halves"`); the table
is fixed, so it is checked on reading and regenerated on writing, never stored by attnlab.
The layers follow BART's names (see `bart.py`).

    model.shared (or model.{enc,dec}oder.embed_tokens when not shared)
                                      decoder.embed.token (= encoder.embed.token when shared)
    model.{enc,dec}oder.embed_positions  (fixed sinusoidal table: checked, not loaded)
    model.*.layers.{i}.*              as BART
    final_logits_bias (1, V)          decoder.head.proj.bias (V,)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.interop.bart import seq2seq_common, seq2seq_hf_fields, seq2seq_layer_rules, seq2seq_requirements
from attnlab.interop.common import Conversion, Derived, copy_of, flat_config, hf_get, rename, require, reshaped, matcher
from attnlab.nn.positions import SinusoidalPositions

FAMILY = "Marian"
MODEL_TYPE = "marian"
ARCHITECTURES = {"MarianMTModel": "lm"}
# {config.json field: (tokenizer role, MarianConfig's default)}; the decoder starts with pad (written by
# config_to_hf); see attnlab/interop/special.py
SPECIAL_TOKENS = {"bos_token_id": ("bos", None), "eos_token_id": ("eos", 0), "forced_eos_token_id": ("eos", 0)}


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    """ModelConfig of a Marian config.json dict.

    Raises:
        ValueError: see `bart.seq2seq_common`.
    """
    src_vocab = hf_get(hf, "vocab_size", 58101)
    shared = bool(hf_get(hf, "share_encoder_decoder_embeddings", True))
    tgt_vocab = src_vocab if shared else hf_get(hf, "decoder_vocab_size", src_vocab)
    pad = hf.get("pad_token_id", 58100)
    return ModelConfig(
        vocab_size=tgt_vocab, **seq2seq_common(hf, FAMILY), embedding_norm=False, share_embeddings=shared,
        src_vocab_size=None if shared else src_vocab,
        attention={"score": "scaled_dot", "bias": True, "dropout": float(hf_get(hf, "attention_dropout", 0.0))},
        position={"scheme": "sinusoidal", "sinusoidal_layout": "halves",
                  "max_len": hf_get(hf, "max_position_embeddings", 512)},
        pad_token_id=pad if isinstance(pad, int) and 0 <= pad < tgt_vocab else None,
    )


matches = matcher(MODEL_TYPE, "sinusoidal")  # does a config convert to this family (`to_hf`)


def config_to_hf(cfg: ModelConfig) -> tuple[dict[str, Any], str]:
    """(config.json dict, architecture name) of an attnlab config.

    Raises:
        ValueError: listing every field Marian cannot express.
    """
    require(FAMILY, flat_config(cfg), {
        **seq2seq_requirements(cfg), "position.scheme": "sinusoidal", "position.sinusoidal_layout": "halves",
        "embedding_norm": False,
    })
    if cfg.pad_token_id is None:
        raise ValueError("this config cannot be expressed as a Marian model: pad_token_id=None "
                         "(Marian needs a pad id, also used as decoder_start_token_id)")
    hf = {"model_type": MODEL_TYPE, "architectures": ["MarianMTModel"], **seq2seq_hf_fields(cfg),
          "vocab_size": cfg.resolved_src_vocab_size, "decoder_vocab_size": cfg.vocab_size,
          "share_encoder_decoder_embeddings": cfg.share_embeddings, "decoder_start_token_id": cfg.pad_token_id}
    return hf, "MarianMTModel"


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """Marian's fixed (max_len, D) position table: [sin | cos] per position."""
    return SinusoidalPositions(d_model, layout="halves")(torch.arange(max_len))


def _positions(name: str, cfg: ModelConfig) -> Derived:
    def check(t: Tensor, hf: Any) -> str | None:
        want = sinusoidal_table(t.shape[0], cfg.d_model) if t.dim() == 2 and t.shape[1] == cfg.d_model else None
        if want is None or not torch.allclose(t.float(), want, atol=1e-4):
            return f"{name} is not the sinusoidal [sin | cos] table attnlab computes for d_model={cfg.d_model}"
        return None

    return Derived(name, check, make=lambda _: sinusoidal_table(cfg.position.max_len, cfg.d_model))


def conversion(cfg: ModelConfig, architecture: str) -> Conversion:
    """Rules between Marian's tensor names and attnlab's for this config."""
    if cfg.share_embeddings:
        rules = [rename("model.shared.weight", "decoder.embed.token.weight")]
        derived = [copy_of(f"model.{s}.embed_tokens.weight", "model.shared.weight") for s in ("encoder", "decoder")]
        target = "model.shared.weight"
    else:
        rules = [rename(f"model.{s}.embed_tokens.weight", f"{s}.embed.token.weight") for s in ("encoder", "decoder")]
        derived = []
        target = "model.decoder.embed_tokens.weight"
    derived += [_positions(f"model.{s}.embed_positions.weight", cfg) for s in ("encoder", "decoder")]
    rules += seq2seq_layer_rules(cfg, "model.")
    rules.append(reshaped("final_logits_bias", "decoder.head.proj.bias", lambda t: (1, t.numel())))
    if cfg.tie_embeddings:
        derived.append(copy_of("lm_head.weight", target))
    else:
        rules.append(rename("lm_head.weight", "decoder.head.proj.weight"))
    return Conversion(rules, derived)
