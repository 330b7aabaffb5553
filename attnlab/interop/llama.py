"""Llama (Touvron et al. 2023) and the configurations that share its layout <-> attnlab:
`LlamaForCausalLM`/`LlamaModel`, `MistralForCausalLM`/`MistralModel` (Jiang et al. 2023: a
sliding window), `Qwen2ForCausalLM`/`Qwen2Model` (Bai et al. 2023: biases on q, k, v).

All three are pre-norm decoders: RMSNorm (epsilon `rms_norm_eps`), rotary positions on the
halves of each head (`rotate_half`, the pairing attnlab's rotary uses: no permutation of q/k
rows), grouped-query attention (`num_key_value_heads`), a gated feed-forward
`down(act(gate(x)) * up(x))` (SwiGLU for `hidden_act="silu"`), a final RMSNorm and an output
matrix tied to the embedding or not (`tie_word_embeddings`).

    model.embed_tokens                      embed.token
    model.layers.{i}.input_layernorm        layers.{i}.self_attn_block.norm
    model.layers.{i}.self_attn.q|k|v_proj   layers.{i}.self_attn.qkv_proj     (joined q | k | v)
    model.layers.{i}.self_attn.o_proj       layers.{i}.self_attn.out_proj
    model.layers.{i}.post_attention_layernorm  layers.{i}.ffn_block.norm
    model.layers.{i}.mlp.gate|up_proj       layers.{i}.ffn.w13                (joined gate | up)
    model.layers.{i}.mlp.down_proj          layers.{i}.ffn.w2
    model.norm                              final_norm
    lm_head                                 head.proj (or tied to embed_tokens)

Mistral's `sliding_window` W lets query i see keys j with i - j < W: attnlab's kernel
`sliding_window` with window W - 1 (0 <= i - j <= window). Qwen2 has biases on q, k, v and
none on o_proj: attnlab's `attention.bias` puts one on all four, so the converted out_proj bias
is zero, and exporting refuses a model whose out_proj bias has moved from zero.

Rotary scaling (`rope_parameters.rope_type`, or the older `rope_scaling`): `linear` and `llama3`
map to attnlab's `position.rotary_scaling`. Refused by the name of the Hugging Face field: other
rope types (dynamic, yarn, longrope, ...), `partial_rotary_factor` below 1
(these three classes rotate the whole head), Qwen2's sliding-window layers
(`use_sliding_window`, `layer_types`), `pretraining_tp` above 1, an unknown `hidden_act`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.interop.common import (Conversion, Derived, Rule, flat_config, hf_get, joined, lm_head, rename,
                                    require)
from attnlab.models.families import family

_ACT_FROM_HF = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh",
                "gelu_new": "geglu_tanh", "relu": "reglu"}
_ACT_TO_HF = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh", "reglu": "relu"}


class LlamaLayout:
    """The converter of one Hugging Face `model_type` with Llama's layout (the interface of the
    modules of attnlab.interop.families: MODEL_TYPE, ARCHITECTURES, SPECIAL_TOKENS,
    config_from_hf, matches, config_to_hf, conversion)."""

    def __init__(self, family_name: str, model_type: str, prefix: str, *, qkv_bias: bool, sliding_window: bool,
                 mlp_bias: bool, special_tokens: dict[str, tuple[str, int | None]]):
        self.FAMILY = family_name
        self.MODEL_TYPE = model_type
        self.ARCHITECTURES = {f"{prefix}ForCausalLM": "lm", f"{prefix}Model": "none"}
        # {config.json field: (tokenizer role, the config class's default)}; see attnlab/interop/special.py
        self.SPECIAL_TOKENS = special_tokens
        self.qkv_bias = qkv_bias  # Qwen2: biases on q, k, v only (none on o_proj)
        self.sliding_window = sliding_window  # Mistral
        self.mlp_bias = mlp_bias  # Llama's attention_bias / mlp_bias options

    def __repr__(self) -> str:
        return f"<converter {self.MODEL_TYPE}>"

    # ---- config.json -> ModelConfig ---------------------------------------------------------

    def config_from_hf(self, hf: dict[str, Any], architecture: str) -> ModelConfig:
        """ModelConfig of a config.json dict.

        Raises:
            ValueError: an option attnlab does not compute, naming the Hugging Face field.
        """
        name = f"{self.FAMILY} config"
        act = hf_get(hf, "hidden_act", "silu")
        if act not in _ACT_FROM_HF:
            raise ValueError(f"{name}: hidden_act={act!r} is not one of {', '.join(_ACT_FROM_HF)}")
        if hf_get(hf, "pretraining_tp", 1) != 1:
            raise ValueError(f"{name}: pretraining_tp={hf['pretraining_tp']!r} is not supported (needs 1)")
        theta, scaling = _rope(hf, name)
        d_model, heads = hf_get(hf, "hidden_size", 4096), hf_get(hf, "num_attention_heads", 32)
        head_dim = hf.get("head_dim") or d_model // heads
        vocab, pad = hf_get(hf, "vocab_size", 32000), hf.get("pad_token_id")
        attention: dict[str, Any] = {"score": "scaled_dot", "num_kv_heads": hf.get("num_key_value_heads") or heads,
                                     "dropout": float(hf_get(hf, "attention_dropout", 0.0))}
        if self.qkv_bias:
            attention["bias"] = True
        else:
            attention["bias"] = bool(hf_get(hf, "attention_bias", False))
        window = self._window(hf, name)
        if window is not None:
            attention.update(kernel="sliding_window", kernel_options={"window": window - 1})
        return ModelConfig(
            arch="decoder", vocab_size=vocab, d_model=d_model, num_layers=hf_get(hf, "num_hidden_layers", 32),
            num_heads=heads, head_dim=head_dim if head_dim != d_model // heads else None,
            d_ff=hf_get(hf, "intermediate_size", 11008), activation=_ACT_FROM_HF[act],
            ffn_bias=bool(hf_get(hf, "mlp_bias", False)), dropout=0.0, norm="rmsnorm", norm_bias=False,
            norm_eps=float(hf_get(hf, "rms_norm_eps", 1e-6)), norm_placement="pre", final_norm=True,
            attention=attention,
            position={"scheme": "rotary", "rotary_base": theta, "rotary_scaling": scaling,
                      "max_len": hf_get(hf, "max_position_embeddings", 2048)},
            tie_embeddings=bool(hf_get(hf, "tie_word_embeddings", False)), head=self.ARCHITECTURES[architecture],
            pad_token_id=pad if isinstance(pad, int) and 0 <= pad < vocab else None,
            init_std=float(hf_get(hf, "initializer_range", 0.02)),
        )

    def _window(self, hf: dict[str, Any], name: str) -> int | None:
        """Mistral's sliding window (None: full attention); Qwen2's per-layer windows are refused."""
        if self.sliding_window:
            window = hf.get("sliding_window")
            if window is not None and (not isinstance(window, int) or window < 1):
                raise ValueError(f"{name}: sliding_window={window!r} is not a positive integer or null")
            return window
        if self.MODEL_TYPE == "qwen2":
            types = hf.get("layer_types") or []
            if hf.get("use_sliding_window") or any(t != "full_attention" for t in types):
                raise ValueError(f"{name}: use_sliding_window / layer_types with sliding_attention layers are not "
                                 "supported (attnlab uses one kernel for every layer): needs full_attention")
        return None

    # ---- ModelConfig -> config.json ---------------------------------------------------------

    def matches(self, cfg: ModelConfig) -> bool:
        """Whether `cfg` looks like this family (picks the family in `to_hf`): a decoder with
        rotary positions, RMSNorm and a gated feed-forward; Mistral when it uses the sliding
        window, Qwen2 when its attention has biases and its feed-forward none, Llama otherwise
        (`family="llama"` exports a Qwen2-like config with its out_proj bias)."""
        if self.MODEL_TYPE not in family(cfg).hf_model_types:
            return False
        if cfg.position.scheme != "rotary" or cfg.norm != "rmsnorm" or cfg.activation not in _ACT_TO_HF:
            return False  # another decoder: GPT-2's, whose refusal lists what it cannot express
        if cfg.attention.kernel == "sliding_window" or self.sliding_window:
            return self.sliding_window and cfg.attention.kernel == "sliding_window"
        qwen2_like = cfg.attention.bias and not cfg.ffn_bias
        return qwen2_like == self.qkv_bias

    def config_to_hf(self, cfg: ModelConfig) -> tuple[dict[str, Any], str]:
        """(config.json dict, architecture name) of an attnlab config.

        Raises:
            ValueError: listing every field this family cannot express.
        """
        flat = flat_config(cfg)
        head_dim = cfg.resolved_head_dim
        wanted = {
            "arch": "decoder", "norm": "rmsnorm", "norm_placement": "pre", "final_norm": True,
            "attention.score": "scaled_dot", "position.scheme": "rotary", "position.rotary_dim": (None, head_dim),
            "embedding_scale": False, "embedding_norm": False, "type_vocab_size": 0, "lm_head_bias": False,
            "lm_head_scale": 1.0, "head": ("lm", "none"), "activation": tuple(_ACT_TO_HF), "moe.num_experts": 0,
            "memory_len": 0,
            "attention.kernel": ("auto", "sdpa", "eager") + (("sliding_window",) if self.sliding_window else ()),
        }
        if self.qkv_bias:
            wanted.update({"attention.bias": True, "ffn_bias": False})
        elif not self.mlp_bias:
            wanted.update({"attention.bias": False, "ffn_bias": False})
        require(self.FAMILY, flat, wanted)
        architecture = next(a for a, h in self.ARCHITECTURES.items() if h == cfg.head)
        hf: dict[str, Any] = {
            "model_type": self.MODEL_TYPE, "architectures": [architecture], "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.attention.num_kv_heads or cfg.num_heads,
            "head_dim": head_dim, "hidden_act": _ACT_TO_HF[cfg.activation], "rms_norm_eps": cfg.norm_eps,
            "max_position_embeddings": cfg.position.max_len, "initializer_range": cfg.init_std,
            "rope_parameters": _rope_to_hf(cfg.position),
            "attention_dropout": cfg.attention.dropout, "tie_word_embeddings": cfg.tie_embeddings,
            "pad_token_id": cfg.pad_token_id,
        }
        if self.mlp_bias:  # Llama's switches
            hf.update(attention_bias=cfg.attention.bias, mlp_bias=cfg.ffn_bias)
        if self.sliding_window:
            windowed = cfg.attention.kernel == "sliding_window"
            hf["sliding_window"] = cfg.attention.kernel_options.window + 1 if windowed else None
        if self.MODEL_TYPE == "qwen2":
            hf.update(use_sliding_window=False, layer_types=["full_attention"] * cfg.num_layers)
        return hf, architecture

    # ---- tensors ----------------------------------------------------------------------------

    def conversion(self, cfg: ModelConfig, architecture: str) -> Conversion:
        """Rules between this family's tensor names and attnlab's for this config."""
        p = "model." if self.ARCHITECTURES[architecture] == "lm" else ""
        dh, kv = cfg.resolved_head_dim, cfg.attention.num_kv_heads or cfg.num_heads
        sizes = (cfg.num_heads * dh, kv * dh, kv * dh)
        rules = [rename(f"{p}embed_tokens.weight", "embed.token.weight")]
        derived: list[Derived] = []
        for i in range(cfg.num_layers):
            h, o = f"{p}layers.{i}.", f"layers.{i}."
            a = f"{h}self_attn."
            rules += [
                rename(f"{h}input_layernorm.weight", f"{o}self_attn_block.norm.weight"),
                joined((f"{a}q_proj.weight", f"{a}k_proj.weight", f"{a}v_proj.weight"),
                       f"{o}self_attn.qkv_proj.weight", sizes),
                rename(f"{a}o_proj.weight", f"{o}self_attn.out_proj.weight"),
                rename(f"{h}post_attention_layernorm.weight", f"{o}ffn_block.norm.weight"),
                joined((f"{h}mlp.gate_proj.weight", f"{h}mlp.up_proj.weight"), f"{o}ffn.w13.weight", (cfg.d_ff,) * 2),
                rename(f"{h}mlp.down_proj.weight", f"{o}ffn.w2.weight"),
            ]
            if cfg.attention.bias:
                rules.append(joined((f"{a}q_proj.bias", f"{a}k_proj.bias", f"{a}v_proj.bias"),
                                    f"{o}self_attn.qkv_proj.bias", sizes))
                rules.append(_zero(f"{o}self_attn.out_proj.bias", cfg.d_model) if self.qkv_bias
                             else rename(f"{a}o_proj.bias", f"{o}self_attn.out_proj.bias"))
            if cfg.ffn_bias:
                rules += [joined((f"{h}mlp.gate_proj.bias", f"{h}mlp.up_proj.bias"), f"{o}ffn.w13.bias",
                                 (cfg.d_ff,) * 2),
                          rename(f"{h}mlp.down_proj.bias", f"{o}ffn.w2.bias")]
            derived.append(Derived(f"{a}rotary_emb.inv_freq"))  # older checkpoints' fixed table
        rules.append(rename(f"{p}norm.weight", "final_norm.weight"))
        derived.append(Derived(f"{p}rotary_emb.inv_freq"))
        lm_head(cfg, f"{p}embed_tokens.weight", rules, derived)
        return Conversion(rules, derived)


def _zero(ours: str, width: int) -> Rule:
    """An attnlab bias that the Hugging Face model does not have: zero on the way in; on the way
    out it must still be zero (else the exported model would compute something else)."""

    def to_hf(ts: list[Tensor]) -> list[Tensor]:
        if torch.count_nonzero(ts[0]):
            raise ValueError(f"{ours} is not zero, and Qwen2's o_proj has no bias: freeze it (e.g. LoRA) or "
                             "export with family='llama' (attention_bias puts a bias on o_proj too)")
        return []

    return Rule((), (ours,), lambda ts: [torch.zeros(width)], to_hf)


_SCALING_OPTIONS = {"linear": ("factor",),
                    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _rope(hf: dict[str, Any], name: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, attnlab's position.rotary_scaling) of a config.json (`rope_parameters` of
    transformers 5, or the older top-level `rope_theta` / `rope_scaling`), refusing what attnlab's
    rotary does not compute."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ValueError(f"{name}: rope_parameters / rope_scaling must be a mapping, got "
                         f"{params!r} / {scaling!r}")
    source = params if params.get("rope_type") else scaling
    kind = source.get("rope_type") or source.get("type") or "default"
    field = "rope_parameters.rope_type" if source is params else "rope_scaling"
    if kind != "default" and kind not in _SCALING_OPTIONS:
        raise ValueError(f"{name}: {field}={kind!r} is not supported: attnlab's rotary computes the angles of "
                         f"rope_type 'default', {', '.join(map(repr, _SCALING_OPTIONS))}")
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if factor not in (None, 1, 1.0):
        raise ValueError(f"{name}: partial_rotary_factor={factor!r} is not supported (transformers' {name[:-7]} "
                         "rotates the whole head): needs 1.0")
    theta = float(params.get("rope_theta") or hf.get("rope_theta") or 10000.0)
    if kind == "default":
        return theta, None
    missing = [k for k in _SCALING_OPTIONS[kind] if source.get(k) is None]
    if missing:
        raise ValueError(f"{name}: {field}={kind!r} needs {', '.join(missing)}")
    return theta, {"type": kind, **{k: source[k] for k in _SCALING_OPTIONS[kind]}}


def _rope_to_hf(position: Any) -> dict[str, Any]:
    """config.json's rope_parameters of attnlab's position section."""
    scaling = position.rotary_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": position.rotary_base}
    from attnlab.nn.positions import ROTARY_SCALINGS

    options = {**ROTARY_SCALINGS[scaling["type"]], **scaling}
    if scaling["type"] == "llama3":
        options["original_max_position_embeddings"] = int(options["original_max_position_embeddings"])
    return {"rope_type": scaling["type"], "rope_theta": position.rotary_base,
            **{k: options[k] for k in _SCALING_OPTIONS[scaling["type"]]}}


LLAMA = LlamaLayout("Llama", "llama", "Llama", qkv_bias=False, sliding_window=False, mlp_bias=True,
                    special_tokens={"bos_token_id": ("bos", 1), "eos_token_id": ("eos", 2)})
MISTRAL = LlamaLayout("Mistral", "mistral", "Mistral", qkv_bias=False, sliding_window=True, mlp_bias=False,
                      special_tokens={"bos_token_id": ("bos", 1), "eos_token_id": ("eos", 2)})
QWEN2 = LlamaLayout("Qwen2", "qwen2", "Qwen2", qkv_bias=True, sliding_window=False, mlp_bias=False,
                    special_tokens={"bos_token_id": ("bos", None), "eos_token_id": ("eos", None)})
CONVERTERS = (MISTRAL, QWEN2, LLAMA)  # the order `to_hf` asks them in: the most specific first
