"""BART (Lewis et al. 2020, https://arxiv.org/abs/1910.13461) <-> attnlab:
`BartForConditionalGeneration`.

BART is a post-LN encoder-decoder with one shared vocabulary (tied output), learned positions
whose table keeps 2 unused rows first (position t reads row t + 2: `position.learned_offset=2`),
a LayerNorm on each stack's embeddings (`embedding_norm`), optional sqrt(d_model) scaling
(`scale_embedding`) and a bias on the logits (`final_logits_bias` -> `lm_head_bias`).
Marian shares this layer layout (see `marian.py`).

    model.shared                                   decoder.embed.token (= encoder.embed.token)
    model.{enc,dec}oder.embed_positions            {enc,dec}oder.embed.positions
    model.{enc,dec}oder.layernorm_embedding        {enc,dec}oder.embed.norm
    model.*.layers.{i}.self_attn.{q,k,v}_proj      *.layers.{i}.self_attn.qkv_proj (joined)
    model.*.layers.{i}.self_attn.out_proj          *.layers.{i}.self_attn.out_proj
    model.*.layers.{i}.self_attn_layer_norm        *.layers.{i}.self_attn_block.norm
    model.decoder.layers.{i}.encoder_attn.{q,out}_proj  decoder.layers.{i}.cross_attn.{q,out}_proj
    model.decoder.layers.{i}.encoder_attn.{k,v}_proj    decoder.layers.{i}.cross_attn.kv_proj (joined)
    model.decoder.layers.{i}.encoder_attn_layer_norm    decoder.layers.{i}.cross_attn_block.norm
    model.*.layers.{i}.fc1 / fc2 / final_layer_norm *.layers.{i}.ffn.w1 / ffn.w2 / ffn_block.norm
    final_logits_bias (1, V)                       decoder.head.proj.bias (V,)
"""

from __future__ import annotations

from typing import Any

from attnlab.config import ModelConfig
from attnlab.interop.common import (Conversion, Derived, Rule, copy_of, flat_config, hf_get, joined, rename, require,
                                    reshaped, matcher)

FAMILY = "BART"
MODEL_TYPE = "bart"
ARCHITECTURES = {"BartForConditionalGeneration": "lm"}
# {config.json field: (tokenizer role, BartConfig's default)}; the decoder starts with </s>; see
# attnlab/interop/special.py
SPECIAL_TOKENS = {"bos_token_id": ("bos", 0), "eos_token_id": ("eos", 2), "decoder_start_token_id": ("eos", 2),
                  "forced_eos_token_id": ("eos", 2)}

ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu"}
ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "swish"}


def seq2seq_common(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """ModelConfig fields that BART and Marian configs spell alike.

    Raises:
        ValueError: encoder and decoder with different widths or heads (attnlab uses one
            d_ff and one num_heads for both stacks), or an unknown activation.
    """
    for a, b in (("encoder_ffn_dim", "decoder_ffn_dim"), ("encoder_attention_heads", "decoder_attention_heads")):
        if hf_get(hf, a, None) != hf_get(hf, b, None):
            raise ValueError(f"{family} config: {a}={hf.get(a)} differs from {b}={hf.get(b)}; "
                             "attnlab uses one value for both stacks")
    act = hf_get(hf, "activation_function", "gelu")
    if act not in ACT_FROM_HF:
        raise ValueError(f"{family} config: activation_function={act!r} is not one of {', '.join(ACT_FROM_HF)}")
    return dict(
        arch="encoder_decoder", d_model=hf_get(hf, "d_model", 1024), num_layers=hf_get(hf, "encoder_layers", 12),
        num_decoder_layers=hf_get(hf, "decoder_layers", 12), num_heads=hf_get(hf, "encoder_attention_heads", 16),
        d_ff=hf_get(hf, "encoder_ffn_dim", 4096), activation=ACT_FROM_HF[act],
        dropout=float(hf_get(hf, "dropout", 0.1)), norm="layernorm", norm_eps=1e-5, norm_placement="post",
        final_norm=False, embedding_scale=bool(hf_get(hf, "scale_embedding", False)), lm_head_bias=True,
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", True)), head="lm",
        init_std=float(hf_get(hf, "init_std", 0.02)),
    )


def seq2seq_requirements(cfg: ModelConfig) -> dict[str, Any]:
    """Fields both BART and Marian need to have these values."""
    return {
        "arch": "encoder_decoder", "norm": "layernorm", "norm_bias": True, "norm_eps": 1e-5,
        "norm_placement": "post", "final_norm": False, "ffn_bias": True, "attention.bias": True,
        "attention.score": "scaled_dot", "attention.num_kv_heads": (None, cfg.num_heads),
        "head_dim": (None, cfg.d_model // cfg.num_heads), "type_vocab_size": 0, "lm_head_bias": True,
        "lm_head_scale": 1.0, "head": "lm", "activation": tuple(ACT_TO_HF),
    }


def seq2seq_hf_fields(cfg: ModelConfig) -> dict[str, Any]:
    """config.json fields both BART and Marian spell alike."""
    return {
        "d_model": cfg.d_model, "encoder_layers": cfg.num_layers, "decoder_layers": cfg.resolved_decoder_layers,
        "encoder_attention_heads": cfg.num_heads, "decoder_attention_heads": cfg.num_heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff, "activation_function": ACT_TO_HF[cfg.activation],
        "dropout": cfg.dropout, "attention_dropout": cfg.attention.dropout, "activation_dropout": 0.0,
        "scale_embedding": cfg.embedding_scale, "max_position_embeddings": cfg.position.max_len,
        "tie_word_embeddings": cfg.tie_embeddings, "init_std": cfg.init_std, "pad_token_id": cfg.pad_token_id,
        "is_encoder_decoder": True,
    }


def seq2seq_layer_rules(cfg: ModelConfig, prefix: str) -> list[Rule]:
    """Layer and embedding-norm rules of a BART-layout model (`prefix` = "model.")."""
    rules = []
    D = cfg.d_model
    for stack, n_layers in (("encoder", cfg.num_layers), ("decoder", cfg.resolved_decoder_layers)):
        for i in range(n_layers):
            h, o = f"{prefix}{stack}.layers.{i}.", f"{stack}.layers.{i}."
            pairs = [("self_attn.out_proj", "self_attn.out_proj"), ("self_attn_layer_norm", "self_attn_block.norm"),
                     ("fc1", "ffn.w1"), ("fc2", "ffn.w2"), ("final_layer_norm", "ffn_block.norm")]
            for t in ("weight", "bias"):
                rules.append(joined(tuple(f"{h}self_attn.{n}_proj.{t}" for n in "qkv"),
                                    f"{o}self_attn.qkv_proj.{t}", (D, D, D)))
            if stack == "decoder":
                pairs += [("encoder_attn.q_proj", "cross_attn.q_proj"), ("encoder_attn.out_proj", "cross_attn.out_proj"),
                          ("encoder_attn_layer_norm", "cross_attn_block.norm")]
                for t in ("weight", "bias"):
                    rules.append(joined(tuple(f"{h}encoder_attn.{n}_proj.{t}" for n in "kv"),
                                        f"{o}cross_attn.kv_proj.{t}", (D, D)))
            rules += [rename(f"{h}{a}.{t}", f"{o}{b}.{t}") for a, b in pairs for t in ("weight", "bias")]
    return rules


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    """ModelConfig of a BART config.json dict.

    Raises:
        ValueError: see `seq2seq_common`.
    """
    vocab = hf_get(hf, "vocab_size", 50265)
    pad = hf.get("pad_token_id", 1)
    return ModelConfig(
        vocab_size=vocab, **seq2seq_common(hf, FAMILY), embedding_norm=True,
        share_embeddings=bool(hf_get(hf, "tie_word_embeddings", True)),
        attention={"score": "scaled_dot", "bias": True, "dropout": float(hf_get(hf, "attention_dropout", 0.0))},
        position={"scheme": "learned", "max_len": hf_get(hf, "max_position_embeddings", 1024), "learned_offset": 2},
        pad_token_id=pad if isinstance(pad, int) and 0 <= pad < vocab else None,
    )


matches = matcher(MODEL_TYPE, "learned")  # does a config convert to this family (`to_hf`)


def config_to_hf(cfg: ModelConfig) -> tuple[dict[str, Any], str]:
    """(config.json dict, architecture name) of an attnlab config.

    Raises:
        ValueError: listing every field BART cannot express.
    """
    require(FAMILY, flat_config(cfg), {
        **seq2seq_requirements(cfg), "position.scheme": "learned", "position.learned_offset": 2,
        "embedding_norm": True, "share_embeddings": cfg.tie_embeddings, "src_vocab_size": (None, cfg.vocab_size),
    })
    hf = {"model_type": MODEL_TYPE, "architectures": ["BartForConditionalGeneration"], "vocab_size": cfg.vocab_size,
          **seq2seq_hf_fields(cfg)}
    return hf, "BartForConditionalGeneration"


def conversion(cfg: ModelConfig, architecture: str) -> Conversion:
    """Rules between BART's tensor names and attnlab's for this config.

    Untied BART (tie_word_embeddings=False) follows transformers >= 5: encoder, decoder and
    output matrices are three tensors (`share_embeddings=False`); `model.shared` is unused.
    Older checkpoints that store the input matrix once as `model.shared` are read too.
    """
    if cfg.share_embeddings:
        rules = [rename("model.shared.weight", "decoder.embed.token.weight")]
        derived = [copy_of(f"model.{s}.embed_tokens.weight", "model.shared.weight") for s in ("encoder", "decoder")]
    else:
        rules = [Rule((f"model.{s}.embed_tokens.weight",), (f"{s}.embed.token.weight",),
                      fallback=("model.shared.weight",)) for s in ("encoder", "decoder")]
        derived = [Derived("model.shared.weight", make=lambda hf: hf["model.decoder.embed_tokens.weight"].clone())]
    for s in ("encoder", "decoder"):
        rules += [rename(f"model.{s}.embed_positions.weight", f"{s}.embed.positions.weight"),
                  rename(f"model.{s}.layernorm_embedding.weight", f"{s}.embed.norm.weight"),
                  rename(f"model.{s}.layernorm_embedding.bias", f"{s}.embed.norm.bias")]
    rules += seq2seq_layer_rules(cfg, "model.")
    rules.append(reshaped("final_logits_bias", "decoder.head.proj.bias", lambda t: (1, t.numel())))
    if cfg.tie_embeddings:
        derived.append(copy_of("lm_head.weight", "model.shared.weight"))
    else:
        rules.append(rename("lm_head.weight", "decoder.head.proj.weight"))
    return Conversion(rules, derived)
