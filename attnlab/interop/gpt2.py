"""GPT-2 (Radford et al. 2019) <-> attnlab: `GPT2LMHeadModel`, `GPT2Model`.

GPT-2 is a pre-LN decoder with learned positions, a final LayerNorm, tanh-GELU ("gelu_new")
and an output projection tied to the token embedding. Its linear layers are `Conv1D`s, which
store weights as (in, out): they are transposed; the fused `c_attn` (D, 3D) is attnlab's
fused `qkv_proj` (same q | k | v order).

    transformer.wte / wpe          embed.token / embed.positions
    transformer.h.{i}.ln_1         layers.{i}.self_attn_block.norm
    transformer.h.{i}.attn.c_attn  layers.{i}.self_attn.qkv_proj         (transposed)
    transformer.h.{i}.attn.c_proj  layers.{i}.self_attn.out_proj         (transposed)
    transformer.h.{i}.ln_2         layers.{i}.ffn_block.norm
    transformer.h.{i}.mlp.c_fc     layers.{i}.ffn.w1                     (transposed)
    transformer.h.{i}.mlp.c_proj   layers.{i}.ffn.w2                     (transposed)
    transformer.ln_f               final_norm
    lm_head                        head.proj (tied to wte unless tie_word_embeddings=False)
"""

from __future__ import annotations

from typing import Any

from attnlab.config import ModelConfig
from attnlab.interop.common import (Conversion, Derived, flat_config, hf_get, rename, require,
                                    lm_head, matcher, transposed)

FAMILY = "GPT-2"
MODEL_TYPE = "gpt2"
ARCHITECTURES = {"GPT2LMHeadModel": "lm", "GPT2Model": "none"}
# {config.json field: (tokenizer role, GPT2Config's default)}; see attnlab/interop/special.py
SPECIAL_TOKENS = {"bos_token_id": ("bos", 50256), "eos_token_id": ("eos", 50256)}

_ACT_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    """ModelConfig of a GPT-2 config.json dict.

    Raises:
        ValueError: a GPT-2 option attnlab does not compute (layer-wise attention scaling,
            an unknown activation).
    """
    if hf_get(hf, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("GPT-2 config: scale_attn_by_inverse_layer_idx=True is not supported")
    act = hf_get(hf, "activation_function", "gelu_new")
    if act not in _ACT_FROM_HF:
        raise ValueError(f"GPT-2 config: activation_function={act!r} is not one of {', '.join(_ACT_FROM_HF)}")
    d_model, vocab = hf_get(hf, "n_embd", 768), hf_get(hf, "vocab_size", 50257)
    pad = hf.get("pad_token_id")
    return ModelConfig(
        arch="decoder", vocab_size=vocab, d_model=d_model, num_layers=hf_get(hf, "n_layer", 12),
        num_heads=hf_get(hf, "n_head", 12), d_ff=hf.get("n_inner") or 4 * d_model, activation=_ACT_FROM_HF[act],
        dropout=float(hf_get(hf, "resid_pdrop", 0.1)), norm="layernorm",
        norm_eps=float(hf_get(hf, "layer_norm_epsilon", 1e-5)), norm_placement="pre", final_norm=True,
        attention={"score": "scaled_dot" if hf_get(hf, "scale_attn_weights", True) else "dot", "bias": True,
                   "dropout": float(hf_get(hf, "attn_pdrop", 0.1))},
        position={"scheme": "learned", "max_len": hf_get(hf, "n_positions", 1024)},
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", True)), head=ARCHITECTURES[architecture],
        pad_token_id=pad if isinstance(pad, int) and 0 <= pad < vocab else None,
        init_std=float(hf_get(hf, "initializer_range", 0.02)),
    )


matches = matcher(MODEL_TYPE)  # does a config convert to this family (`to_hf`)


def config_to_hf(cfg: ModelConfig) -> tuple[dict[str, Any], str]:
    """(config.json dict, architecture name) of an attnlab config.

    Raises:
        ValueError: listing every field GPT-2 cannot express.
    """
    flat = flat_config(cfg)
    require(FAMILY, flat, {
        "arch": "decoder", "norm": "layernorm", "norm_bias": True, "norm_placement": "pre", "final_norm": True,
        "ffn_bias": True, "attention.bias": True, "attention.score": ("scaled_dot", "dot"),
        "attention.num_kv_heads": (None, cfg.num_heads), "head_dim": (None, cfg.d_model // cfg.num_heads),
        "position.scheme": "learned", "position.learned_offset": 0, "embedding_scale": False,
        "embedding_norm": False, "type_vocab_size": 0, "lm_head_bias": False, "lm_head_scale": 1.0,
        "head": ("lm", "none"), "activation": tuple(_ACT_TO_HF),
    })
    architecture = "GPT2LMHeadModel" if cfg.head == "lm" else "GPT2Model"
    hf = {
        "model_type": MODEL_TYPE, "architectures": [architecture], "vocab_size": cfg.vocab_size,
        "n_embd": cfg.d_model, "n_layer": cfg.num_layers, "n_head": cfg.num_heads, "n_inner": cfg.d_ff,
        "n_positions": cfg.position.max_len, "activation_function": _ACT_TO_HF[cfg.activation],
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.attention.dropout,
        "layer_norm_epsilon": cfg.norm_eps, "initializer_range": cfg.init_std,
        "scale_attn_weights": cfg.attention.score == "scaled_dot", "scale_attn_by_inverse_layer_idx": False,
        "tie_word_embeddings": cfg.tie_embeddings, "pad_token_id": cfg.pad_token_id,
    }
    return hf, architecture


def conversion(cfg: ModelConfig, architecture: str) -> Conversion:
    """Rules between GPT-2's tensor names and attnlab's for this config."""
    p = "transformer." if architecture == "GPT2LMHeadModel" else ""
    rules = [rename(f"{p}wte.weight", "embed.token.weight"), rename(f"{p}wpe.weight", "embed.positions.weight")]
    derived: list[Derived] = []
    for i in range(cfg.num_layers):
        h, o = f"{p}h.{i}.", f"layers.{i}."
        rules += [
            rename(f"{h}ln_1.weight", f"{o}self_attn_block.norm.weight"),
            rename(f"{h}ln_1.bias", f"{o}self_attn_block.norm.bias"),
            transposed(f"{h}attn.c_attn.weight", f"{o}self_attn.qkv_proj.weight"),  # both fused q | k | v
            rename(f"{h}attn.c_attn.bias", f"{o}self_attn.qkv_proj.bias"),
            transposed(f"{h}attn.c_proj.weight", f"{o}self_attn.out_proj.weight"),
            rename(f"{h}attn.c_proj.bias", f"{o}self_attn.out_proj.bias"),
            rename(f"{h}ln_2.weight", f"{o}ffn_block.norm.weight"),
            rename(f"{h}ln_2.bias", f"{o}ffn_block.norm.bias"),
            transposed(f"{h}mlp.c_fc.weight", f"{o}ffn.w1.weight"),
            rename(f"{h}mlp.c_fc.bias", f"{o}ffn.w1.bias"),
            transposed(f"{h}mlp.c_proj.weight", f"{o}ffn.w2.weight"),
            rename(f"{h}mlp.c_proj.bias", f"{o}ffn.w2.bias"),
        ]
        # causal-mask buffers that older checkpoints carry: bookkeeping, not weights
        derived += [Derived(f"{h}attn.bias"), Derived(f"{h}attn.masked_bias")]
    rules += [rename(f"{p}ln_f.weight", "final_norm.weight"), rename(f"{p}ln_f.bias", "final_norm.bias")]
    lm_head(cfg, f"{p}wte.weight", rules, derived)
    return Conversion(rules, derived)
