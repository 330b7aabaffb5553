"""T5 (Raffel et al. 2020, https://arxiv.org/abs/1910.10683) <-> attnlab: `T5ForConditionalGeneration`.

T5 is a pre-norm encoder-decoder with RMSNorm (no bias, no mean), no biases anywhere,
unscaled dot-product attention (`attention.score="dot"`), no absolute positions but a learned
per-head bias of the bucketed distance, one table per stack stored in its first layer
(`position.scheme="t5_bias"`), and one shared vocabulary. v1.0 uses a ReLU feed-forward
(`wi`, `wo`); v1.1 a gated tanh-GELU one (`wi_0` gate, `wi_1`, `wo`: `activation="geglu_tanh"`).
With the output tied to the embedding, the last hidden state is scaled by d_model^-0.5
before the projection (`lm_head_scale`).

    shared                                              decoder.embed.token (= encoder.embed.token)
    {enc,dec}oder.block.0.layer.0.SelfAttention.relative_attention_bias   {enc,dec}oder.position_bias
    *.block.{i}.layer.0.SelfAttention.{q,k,v} / o      *.layers.{i}.self_attn.qkv_proj (joined) / out_proj
    *.block.{i}.layer.0.layer_norm                      *.layers.{i}.self_attn_block.norm
    decoder.block.{i}.layer.1.EncDecAttention.{q, {k,v}, o}  decoder.layers.{i}.cross_attn.{q_proj, kv_proj, out_proj}
    decoder.block.{i}.layer.1.layer_norm                decoder.layers.{i}.cross_attn_block.norm
    *.block.{i}.layer.{-1}.DenseReluDense.{wi, wo}      *.layers.{i}.ffn.{w1, w2}
    *.block.{i}.layer.{-1}.DenseReluDense.{wi_0, wi_1}  *.layers.{i}.ffn.w13 (joined: gate | linear)
    *.block.{i}.layer.{-1}.layer_norm                   *.layers.{i}.ffn_block.norm
    {enc,dec}oder.final_layer_norm                      {enc,dec}oder.final_norm
    lm_head                                             decoder.head.proj (tied unless untied)

Configs: transformers >= 5 always ties `lm_head` to `shared` and records the scaling as
`scale_decoder_outputs`; older configs say `tie_word_embeddings` (True: tied and scaled).
"""

from __future__ import annotations

from typing import Any

from attnlab.config import ModelConfig
from attnlab.interop.common import Conversion, Derived, copy_of, flat_config, hf_get, joined, rename, require, matcher

FAMILY = "T5"
MODEL_TYPE = "t5"
ARCHITECTURES = {"T5ForConditionalGeneration": "lm"}
# {config.json field: (tokenizer role, T5Config's default)}; the decoder starts with pad (written by
# config_to_hf); see attnlab/interop/special.py
SPECIAL_TOKENS = {"eos_token_id": ("eos", 1)}

_FF_FROM_HF = {"relu": "relu", "gelu": "gelu", "gated-gelu": "geglu_tanh", "gated-relu": "reglu",
               "gated-silu": "swiglu"}
_FF_TO_HF = {v: k for k, v in _FF_FROM_HF.items()}


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    """ModelConfig of a T5 config.json dict.

    Raises:
        ValueError: an unknown feed_forward_proj.
    """
    ff = hf_get(hf, "feed_forward_proj", "relu")
    if ff not in _FF_FROM_HF:
        raise ValueError(f"T5 config: feed_forward_proj={ff!r} is not one of {', '.join(_FF_FROM_HF)}")
    d_model, heads, d_kv = hf_get(hf, "d_model", 512), hf_get(hf, "num_heads", 8), hf_get(hf, "d_kv", 64)
    tied = bool(hf_get(hf, "tie_word_embeddings", True))
    scaled = bool(hf.get("scale_decoder_outputs", tied))
    vocab = hf_get(hf, "vocab_size", 32128)
    pad = hf.get("pad_token_id", 0)
    return ModelConfig(
        arch="encoder_decoder", vocab_size=vocab, d_model=d_model, num_layers=hf_get(hf, "num_layers", 6),
        num_decoder_layers=hf.get("num_decoder_layers") or hf_get(hf, "num_layers", 6), num_heads=heads,
        head_dim=None if d_kv * heads == d_model else d_kv, d_ff=hf_get(hf, "d_ff", 2048), activation=_FF_FROM_HF[ff],
        ffn_bias=False, dropout=float(hf_get(hf, "dropout_rate", 0.1)), norm="rmsnorm",
        norm_eps=float(hf_get(hf, "layer_norm_epsilon", 1e-6)), norm_placement="pre", final_norm=True,
        attention={"score": "dot", "bias": False, "dropout": float(hf_get(hf, "dropout_rate", 0.1))},
        position={"scheme": "t5_bias", "t5_num_buckets": hf_get(hf, "relative_attention_num_buckets", 32),
                  "t5_max_distance": hf_get(hf, "relative_attention_max_distance", 128)},
        tie_embeddings=tied, share_embeddings=True, lm_head_scale=d_model**-0.5 if scaled else 1.0, head="lm",
        pad_token_id=pad if isinstance(pad, int) and 0 <= pad < vocab else None,
    )


matches = matcher(MODEL_TYPE, "t5_bias")  # does a config convert to this family (`to_hf`)


def config_to_hf(cfg: ModelConfig) -> tuple[dict[str, Any], str]:
    """(config.json dict, architecture name) of an attnlab config.

    `tie_word_embeddings` carries the output scaling: True = tied and scaled by
    d_model^-0.5; False = not scaled (and, before transformers 5, untied).

    Raises:
        ValueError: listing every field T5 cannot express.
    """
    scale = cfg.d_model**-0.5
    require(FAMILY, flat_config(cfg), {
        "arch": "encoder_decoder", "norm": "rmsnorm", "norm_placement": "pre", "final_norm": True,
        "ffn_bias": False, "attention.bias": False, "attention.score": "dot",
        "attention.num_kv_heads": (None, cfg.num_heads), "position.scheme": "t5_bias", "embedding_scale": False,
        "embedding_norm": False, "type_vocab_size": 0, "share_embeddings": True, "lm_head_bias": False,
        "lm_head_scale": (scale, 1.0) if cfg.tie_embeddings else 1.0, "head": "lm", "activation": tuple(_FF_TO_HF),
    })
    hf = {
        "model_type": MODEL_TYPE, "architectures": ["T5ForConditionalGeneration"], "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model, "d_kv": cfg.resolved_head_dim, "d_ff": cfg.d_ff, "num_layers": cfg.num_layers,
        "num_decoder_layers": cfg.resolved_decoder_layers, "num_heads": cfg.num_heads,
        "relative_attention_num_buckets": cfg.position.t5_num_buckets,
        "relative_attention_max_distance": cfg.position.t5_max_distance, "dropout_rate": cfg.dropout,
        "layer_norm_epsilon": cfg.norm_eps, "feed_forward_proj": _FF_TO_HF[cfg.activation],
        "tie_word_embeddings": cfg.lm_head_scale != 1.0, "pad_token_id": cfg.pad_token_id,
        "decoder_start_token_id": cfg.pad_token_id, "is_encoder_decoder": True,
    }
    return hf, "T5ForConditionalGeneration"


def conversion(cfg: ModelConfig, architecture: str) -> Conversion:
    """Rules between T5's tensor names and attnlab's for this config."""
    rules = [rename("shared.weight", "decoder.embed.token.weight")]
    derived = [copy_of(f"{s}.embed_tokens.weight", "shared.weight") for s in ("encoder", "decoder")]
    gated = _FF_TO_HF.get(cfg.activation, "").startswith("gated")
    inner = cfg.num_heads * cfg.resolved_head_dim
    for s, n in (("encoder", cfg.num_layers), ("decoder", cfg.resolved_decoder_layers)):
        rules.append(rename(f"{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                            f"{s}.position_bias.weight"))
        for i in range(n):
            h, o = f"{s}.block.{i}.layer.", f"{s}.layers.{i}."
            a = f"{h}0.SelfAttention."
            rules += [joined((f"{a}q.weight", f"{a}k.weight", f"{a}v.weight"), f"{o}self_attn.qkv_proj.weight",
                             (inner, inner, inner)),
                      rename(f"{a}o.weight", f"{o}self_attn.out_proj.weight"),
                      rename(f"{h}0.layer_norm.weight", f"{o}self_attn_block.norm.weight")]
            f = 1
            if s == "decoder":
                a = f"{h}1.EncDecAttention."
                rules += [rename(f"{a}q.weight", f"{o}cross_attn.q_proj.weight"),
                          joined((f"{a}k.weight", f"{a}v.weight"), f"{o}cross_attn.kv_proj.weight", (inner, inner)),
                          rename(f"{a}o.weight", f"{o}cross_attn.out_proj.weight"),
                          rename(f"{h}1.layer_norm.weight", f"{o}cross_attn_block.norm.weight")]
                f = 2
            d = f"{h}{f}.DenseReluDense."
            if gated:
                rules.append(joined((f"{d}wi_0.weight", f"{d}wi_1.weight"), f"{o}ffn.w13.weight", (cfg.d_ff, cfg.d_ff)))
            else:
                rules.append(rename(f"{d}wi.weight", f"{o}ffn.w1.weight"))
            rules += [rename(f"{d}wo.weight", f"{o}ffn.w2.weight"),
                      rename(f"{h}{f}.layer_norm.weight", f"{o}ffn_block.norm.weight")]
        rules.append(rename(f"{s}.final_layer_norm.weight", f"{s}.final_norm.weight"))
    if not cfg.tie_embeddings:
        rules.append(rename("lm_head.weight", "decoder.head.proj.weight"))
    elif cfg.lm_head_scale == 1.0:
        # tied but unscaled: written out as a copy, so readers that untie on
        # tie_word_embeddings=False (transformers < 5) still get the right matrix
        derived.append(Derived("lm_head.weight", copy_of("lm_head.weight", "shared.weight").check,
                               make=lambda hf: hf["shared.weight"].clone()))
    else:
        derived.append(copy_of("lm_head.weight", "shared.weight"))
    return Conversion(rules, derived)
