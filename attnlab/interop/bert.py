"""BERT (Devlin et al. 2019, https://arxiv.org/abs/1810.04805) <-> attnlab: `BertModel`,
`BertForMaskedLM`, `BertForSequenceClassification`.

BERT is a post-LN encoder with learned positions, segment embeddings and a LayerNorm on the
summed embeddings. `BertModel` and the classifier carry the pooler (dense + tanh over
[CLS]); the masked-LM head is dense + activation + LayerNorm + a decoder tied to the word
embeddings, with its own bias.

    [bert.]embeddings.{word,position,token_type}_embeddings   embed.{token,positions,segment}
    [bert.]embeddings.LayerNorm                               embed.norm
    [bert.]encoder.layer.{i}.attention.self.{query,key,value} layers.{i}.self_attn.qkv_proj (joined)
    [bert.]encoder.layer.{i}.attention.output.dense           layers.{i}.self_attn.out_proj
    [bert.]encoder.layer.{i}.attention.output.LayerNorm       layers.{i}.self_attn_block.norm
    [bert.]encoder.layer.{i}.intermediate.dense / output.dense layers.{i}.ffn.w1 / w2
    [bert.]encoder.layer.{i}.output.LayerNorm                 layers.{i}.ffn_block.norm
    [bert.]pooler.dense                                       pooler.dense
    cls.predictions.transform.{dense,LayerNorm}, .bias        head.{dense,norm}, head.decoder.bias
    classifier                                                head.proj
"""

from __future__ import annotations

from typing import Any

from attnlab.config import ModelConfig
from attnlab.interop.common import (Conversion, Derived, copy_of, flat_config, hf_get, joined, pick_label_count,
                                    rename, require, matcher)

FAMILY = "BERT"
MODEL_TYPE = "bert"
ARCHITECTURES = {"BertModel": "none", "BertForMaskedLM": "mlm", "BertForSequenceClassification": "classification"}
# {config.json field: (tokenizer role, BertConfig's default)}; see attnlab/interop/special.py
SPECIAL_TOKENS: dict[str, tuple[str, int | None]] = {"bos_token_id": ("bos", None), "eos_token_id": ("eos", None)}

_ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def config_from_hf(hf: dict[str, Any], architecture: str) -> ModelConfig:
    """ModelConfig of a BERT config.json dict.

    Raises:
        ValueError: relative position embeddings, a decoder BERT, or an unknown activation.
    """
    kind = hf_get(hf, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"BERT config: position_embedding_type={kind!r} is not supported (only 'absolute')")
    if hf_get(hf, "is_decoder", False) or hf_get(hf, "add_cross_attention", False):
        raise ValueError("BERT config: is_decoder / add_cross_attention BERT models are not supported")
    act = hf_get(hf, "hidden_act", "gelu")
    if act not in _ACT_FROM_HF:
        raise ValueError(f"BERT config: hidden_act={act!r} is not one of {', '.join(_ACT_FROM_HF)}")
    vocab, head = hf_get(hf, "vocab_size", 30522), ARCHITECTURES[architecture]
    pad = hf.get("pad_token_id", 0)
    return ModelConfig(
        arch="encoder", vocab_size=vocab, d_model=hf_get(hf, "hidden_size", 768),
        num_layers=hf_get(hf, "num_hidden_layers", 12), num_heads=hf_get(hf, "num_attention_heads", 12),
        d_ff=hf_get(hf, "intermediate_size", 3072), activation=_ACT_FROM_HF[act],
        dropout=float(hf_get(hf, "hidden_dropout_prob", 0.1)), norm="layernorm",
        norm_eps=float(hf_get(hf, "layer_norm_eps", 1e-12)), norm_placement="post", final_norm=False,
        attention={"score": "scaled_dot", "bias": True, "dropout": float(hf_get(hf, "attention_probs_dropout_prob", 0.1))},
        position={"scheme": "learned", "max_len": hf_get(hf, "max_position_embeddings", 512)},
        embedding_norm=True, type_vocab_size=hf_get(hf, "type_vocab_size", 2),
        tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", True)), head=head,
        num_labels=pick_label_count(hf) if head == "classification" else 2,
        pooler=head != "mlm", classifier_pooling="first",
        pad_token_id=pad if isinstance(pad, int) and 0 <= pad < vocab else None,
        init_std=float(hf_get(hf, "initializer_range", 0.02)),
    )


matches = matcher(MODEL_TYPE)  # does a config convert to this family (`to_hf`)


def config_to_hf(cfg: ModelConfig) -> tuple[dict[str, Any], str]:
    """(config.json dict, architecture name) of an attnlab config.

    Raises:
        ValueError: listing every field BERT cannot express.
    """
    flat = flat_config(cfg)
    require(FAMILY, flat, {
        "arch": "encoder", "norm": "layernorm", "norm_bias": True, "norm_placement": "post", "final_norm": False,
        "ffn_bias": True, "attention.bias": True, "attention.score": "scaled_dot",
        "attention.num_kv_heads": (None, cfg.num_heads), "head_dim": (None, cfg.d_model // cfg.num_heads),
        "position.scheme": "learned", "position.learned_offset": 0, "embedding_scale": False,
        "embedding_norm": True, "activation": tuple(_ACT_TO_HF), "pooler": cfg.head != "mlm",
        "classifier_pooling": "first", "sbo_head": False,  # SpanBERT's span-boundary head has no BERT counterpart
    })
    if cfg.type_vocab_size < 1:
        raise ValueError("this config cannot be expressed as a BERT model: type_vocab_size=0 (needs >= 1)")
    architecture = {v: k for k, v in ARCHITECTURES.items()}[cfg.head]
    hf = {
        "model_type": MODEL_TYPE, "architectures": [architecture], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.d_ff, "hidden_act": _ACT_TO_HF[cfg.activation],
        "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.attention.dropout,
        "max_position_embeddings": cfg.position.max_len, "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": cfg.norm_eps, "initializer_range": cfg.init_std, "pad_token_id": cfg.pad_token_id,
        "position_embedding_type": "absolute", "tie_word_embeddings": cfg.tie_embeddings,
    }
    if cfg.head == "classification":
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_labels)}
    return hf, architecture


def conversion(cfg: ModelConfig, architecture: str) -> Conversion:
    """Rules between BERT's tensor names and attnlab's for this config."""
    p = "" if architecture == "BertModel" else "bert."
    e = f"{p}embeddings."
    rules = [
        rename(f"{e}word_embeddings.weight", "embed.token.weight"),
        rename(f"{e}position_embeddings.weight", "embed.positions.weight"),
        rename(f"{e}token_type_embeddings.weight", "embed.segment.weight"),
        rename(f"{e}LayerNorm.weight", "embed.norm.weight"),
        rename(f"{e}LayerNorm.bias", "embed.norm.bias"),
    ]
    # buffers older checkpoints store (MiniLM's has position_ids): bookkeeping, not weights
    derived = [Derived(f"{e}position_ids"), Derived(f"{e}token_type_ids")]
    pairs = [("attention.output.dense", "self_attn.out_proj"), ("attention.output.LayerNorm", "self_attn_block.norm"),
             ("intermediate.dense", "ffn.w1"), ("output.dense", "ffn.w2"), ("output.LayerNorm", "ffn_block.norm")]
    D = cfg.d_model
    for i in range(cfg.num_layers):
        h = f"{p}encoder.layer.{i}."
        for t in ("weight", "bias"):
            rules.append(joined(tuple(f"{h}attention.self.{n}.{t}" for n in ("query", "key", "value")),
                                f"layers.{i}.self_attn.qkv_proj.{t}", (D, D, D)))
            rules += [rename(f"{h}{a}.{t}", f"layers.{i}.{o}.{t}") for a, o in pairs]
    if cfg.pooler:
        rules += [rename(f"{p}pooler.dense.weight", "pooler.dense.weight"),
                  rename(f"{p}pooler.dense.bias", "pooler.dense.bias")]
    if cfg.head == "mlm":
        c = "cls.predictions."
        rules += [rename(f"{c}transform.dense.weight", "head.dense.weight"),
                  rename(f"{c}transform.dense.bias", "head.dense.bias"),
                  rename(f"{c}transform.LayerNorm.weight", "head.norm.weight"),
                  rename(f"{c}transform.LayerNorm.bias", "head.norm.bias")]
        if cfg.tie_embeddings:  # decoder.bias is predictions.bias
            rules.append(rename(f"{c}bias", "head.decoder.bias"))
            derived += [copy_of(f"{c}decoder.bias", f"{c}bias"),
                        copy_of(f"{c}decoder.weight", f"{e}word_embeddings.weight")]
        else:  # transformers >= 5 unties the two biases too and uses decoder.bias
            rules += [rename(f"{c}decoder.weight", "head.decoder.weight"),
                      rename(f"{c}decoder.bias", "head.decoder.bias")]
            derived.append(Derived(f"{c}bias", make=lambda hf: hf[f"{c}decoder.bias"].clone()))
    if cfg.head == "classification":
        rules += [rename("classifier.weight", "head.proj.weight"), rename("classifier.bias", "head.proj.bias")]
    return Conversion(rules, derived)
