"""Typed model configuration: plain data, validated on construction, JSON round-trippable.

A `ModelConfig` describes any model attnlab builds. Variants are chosen by strings at a
few named seams (attention score and kernel, position scheme, norm and its placement,
activation, head); each string is checked against the keys of the seam's registry (a dict in
attnlab.nn from the name to the implementation), and what a kernel supports against the rest of
the config, so a config that constructs is a config that builds.

    cfg = ModelConfig(arch="decoder", vocab_size=1000, d_model=128, num_heads=4)
    cfg = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))   # round trip
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attnlab.config.families import FAMILY_TRAITS, FamilyTraits
from attnlab.config.load import from_dict, to_dict
from attnlab.config.validate import (ConfigError, ConfigTypeError, check_types, choice, in_range, int_list,
                                     non_negative, positive, probability, sub_config)

ARCHS = tuple(FAMILY_TRAITS)  # the built-in families (attnlab.config.families); a registered one joins the table
RNN_CELLS = ("rnn", "lstm", "gru", "conv")
RNN_ATTENTIONS = ("none", "additive", "dot", "general")
PLACEMENTS = ("post", "pre", "both")
SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
POSITION_COMBINES = ("add", "concat")
# the builder's head registry (attnlab.models.build.HEADS) sits above this package; a test checks they agree
HEADS = ("none", "lm", "mlm", "classification", "token_classification", "regression")
POOLINGS = ("first", "last", "mean")

# The names allowed at the variant seams are the keys of their registries in attnlab.nn, imported
# when a config is checked (not when this module is imported, so it stays plain data without torch).
_REGISTRIES = {
    "kernel": ("attnlab.nn.kernels", "KERNELS"),
    "score": ("attnlab.nn.scores", "SCORES"),
    "position": ("attnlab.nn.positions", "POSITION_SCHEMES"),
    "activation": ("attnlab.nn.activations", "ACTIVATIONS"),
    "norm": ("attnlab.nn.norms", "NORMS"),
}


# the prefix of the names a student's lab pieces are registered under (attnlab.labs: `lab-sdpa`),
# present only in a process that loaded the student's labs folder
LAB_PREFIX = "lab-"


def _seam_choice(path: str, value: Any, seam: str) -> None:
    """`choice` among a seam's registered names; a lab piece's name that is not registered says
    how to register it (a model saved with a student's kernel, loaded without the labs folder)."""
    registry = _registry(seam)
    if isinstance(value, str) and value.startswith(LAB_PREFIX) and value not in registry:
        raise ConfigError(path, f"{value!r} is the piece of lab {value[len(LAB_PREFIX):]!r} (attnlab lab), not "
                          "registered here: load the labs folder that holds it, `attnlab --lab DIR COMMAND ...` "
                          "(or ATTNLAB_LABS=DIR), or attnlab.labs.use(DIR) in Python")
    choice(path, value, registry)


def _registry(seam: str) -> dict[str, Any]:
    """The registry of a variant seam: `kernel`, `score`, `position`, `activation` or `norm`."""
    import importlib

    module, name = _REGISTRIES[seam]
    return getattr(importlib.import_module(module), name)


@dataclass
class AttentionConfig:
    """How queries meet keys.

    score: the score function f(q, k) — `scaled_dot` (q.k / sqrt(d_head), Vaswani et al. 2017),
        `dot` (q.k, Luong et al. 2015), `cosine` (cos(q, k) / cosine_temperature),
        `additive` (v^T tanh(W_q q + W_k k), Bahdanau et al. 2015), `general` (q W k^T, Luong),
        `gaussian` (-||q - k||^2 / (2 gaussian_sigma^2); sigma None = d_head^(1/4), so its q.k part
        is scaled as in scaled_dot; the fused kernels take it, the long-input ones do not).
    kernel: `auto` uses PyTorch's fused scaled_dot_product_attention whenever the variant
        allows it and falls back to `eager`; `eager` always materialises the weights;
        `sdpa` insists on the fused kernel (an error for variants it cannot express).
        Long-input kernels (self-attention; cross-attention keeps `auto`; attnlab.nn.kernels):
        `sliding_window` (Beltagy et al. 2020), `longformer` (the window plus global tokens, same
        paper), `bigbird` (window, global and random blocks, Zaheer et al. 2020), `linformer`
        (keys and values projected along the sequence; encoders only, Wang et al. 2020),
        `local_block` (attention within blocks) and `memory_compressed` (keys and values
        compressed by a strided convolution, alternating with local blocks: the DMCA decoder;
        Liu et al. 2018).
    kernel_options: the kernel's own options (its `Options` dataclass), as a mapping:
        sliding_window: `window` (256) — query i sees keys j with |i - j| <= window
            (decoders: 0 <= i - j <= window);
        longformer: `window` (256), `global_positions` ([]), `global_token_id` (None) — global
            tokens by position and/or by id (e.g. [CLS]) see and are seen by every position;
        bigbird: `block_size` (64), `window_blocks` (1) per side, `global_blocks` (1),
            `random_blocks` (3) per query block, drawn with seed `random_seed` (0) + layer index;
        linformer: `k` (256) projected rows, `max_len` (4096) positions covered, `sharing`
            (`layer`: one projection pair for a layer's heads, or `head`);
        local_block: `block_size` (256) — query i sees keys j in its block, j // b == i // b
            (decoders: and j <= i);
        memory_compressed: `compression` (3) — the convolution's kernel size and stride c (a
            decoder's query i sees compressed block j when c j + c - 1 <= i), `block_size` (256)
            of the local layers, `alternate` (True: even layers local, odd compressed; False:
            every layer compressed).
        Configs written before the options were grouped (flat `attention.window`,
        `attention.linformer_k`, ...) are read into kernel_options.
    num_kv_heads: key/value heads for grouped-query (1 = multi-query) attention; None = num_heads.
    """

    score: str = "scaled_dot"
    kernel: str = "auto"
    kernel_options: Any = field(default_factory=dict)  # becomes the kernel's Options on construction
    num_kv_heads: int | None = None
    bias: bool = True
    dropout: float = 0.0
    cosine_temperature: float = 0.1
    additive_dim: int | None = None  # hidden size of the additive scorer; None = head_dim
    gaussian_sigma: float | None = None  # width of the gaussian score; None = head_dim ** 0.25

    def __post_init__(self) -> None:
        s = "attention."
        check_types(self, "attention")
        choice(s + "score", self.score, _registry("score"))
        _seam_choice(s + "kernel", self.kernel, "kernel")
        kernel = _registry("kernel")[self.kernel]
        self.kernel_options = _kernel_options(kernel, self.kernel_options, s + "kernel_options")
        positive(s + "num_kv_heads", self.num_kv_heads, integer=True, optional=True)
        positive(s + "additive_dim", self.additive_dim, integer=True, optional=True)
        probability(s + "dropout", self.dropout)
        positive(s + "cosine_temperature", self.cosine_temperature)
        positive(s + "gaussian_sigma", self.gaussian_sigma, optional=True)
        score = _registry("score")[self.score]
        if not kernel.supports.any_score and not score.fused:
            raise ConfigError(s + "kernel", f"{self.kernel!r} needs a dot-product-shaped score; "
                              f"score={self.score!r} works with kernel='auto' or 'eager'")
        if score.widens and not kernel.supports.wide_qk:
            raise ConfigError(s + "kernel", f"{self.kernel!r} needs queries and keys as wide as the values; "
                              f"score={self.score!r} appends a feature: use kernel 'auto', 'sdpa' or 'eager'")

    @classmethod
    def expand_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Read the flat kernel fields of older configs (`window`, `linformer_k`, ...) into
        `kernel_options`: the chosen kernel's are moved there (its `Options.legacy` names them;
        options given in `kernel_options` win), the other kernels' are dropped, as those configs
        ignored them."""
        legacy = {name for k in _registry("kernel").values() for name in k.Options.legacy}
        flat = [key for key in data if key in legacy and key not in _ATTENTION_FIELDS]
        if not flat:
            return data
        data = dict(data)
        kernel = _registry("kernel").get(data.get("kernel", "auto"))
        own = kernel.Options.legacy if kernel is not None else {}
        given = data.get("kernel_options") or {}
        moved = {own[key]: data[key] for key in flat if key in own}
        if isinstance(given, dict):
            data["kernel_options"] = {**moved, **given}
        for key in flat:
            del data[key]
        return data


_ATTENTION_FIELDS = {f.name for f in dataclasses.fields(AttentionConfig)}


def _kernel_options(kernel: type, value: Any, path: str) -> Any:
    """The kernel's `Options` from a mapping (or an `Options`), each field checked against its
    annotation and its `metadata` (`min`: the smallest value, of every item of a list;
    `choices`: the allowed values).

    Raises:
        ConfigError: an unknown option or a value out of range, naming `path`.option.
        ConfigTypeError: not a mapping, or an option of the wrong type.
    """
    options_cls = kernel.Options
    if isinstance(value, options_cls):
        value = to_dict(value)
    if not isinstance(value, dict):
        raise ConfigTypeError(path, f"expected a mapping of the options of kernel {kernel.name!r}, got {value!r}")
    options = sub_config(options_cls, path, value)
    check_types(options, path)
    for f in dataclasses.fields(options):
        v, meta, where = getattr(options, f.name), f.metadata, f"{path}.{f.name}"
        if "min" in meta and isinstance(v, list):
            int_list(where, v, low=meta["min"])
        elif "min" in meta:
            in_range(where, v, meta["min"], integer=isinstance(v, int), optional=True)
        if "choices" in meta:
            choice(where, v, meta["choices"])
    return options


@dataclass
class PositionConfig:
    """Where order comes from.

    scheme: `none`; absolute, added to the embeddings — `sinusoidal` (Vaswani et al. 2017),
        `learned`, `binary` (bits of the index as +-1); inside attention — `relative`
        (Shaw et al. 2018: learned embeddings of the clipped distance on keys, and on values
        when relative_values), `rotary` (Su et al. 2021), `alibi` (Press et al. 2022),
        `t5_bias` (Raffel et al. 2020: learned per-head bias of the bucketed distance,
        one table shared by all layers of a stack).
    rotary_scaling: rotary frequencies stretched for contexts longer than the model was trained on:
        `{"type": "linear", "factor": f}` (position interpolation, Chen et al. 2023: every frequency
        / f) or `{"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
        "original_max_position_embeddings": 8192}` (Llama 3.1: only the low frequencies / f, a blend
        between); None = unscaled.
    max_len: positions available to `learned` and `binary` (their tables; past them the model
        raises); sinusoidal, rotary, alibi, t5_bias and none compute any position and ignore it.
    sinusoidal_layout: `interleaved` (sin, cos, sin, cos, ... per frequency, the paper's
        PE(t, 2i), PE(t, 2i+1)) or `halves` ([sin of every frequency | cos of every frequency],
        the layout of Marian / fairseq checkpoints); the same features, permuted.
    learned_offset: rows of the `learned` table before position 0 (BART reserves 2: position t
        reads row t + 2); the table has max_len + learned_offset rows.
    combine: how an absolute scheme meets the token embeddings: `add` (x + p, width d_model) or
        `concat` ([x; p]: token vectors of d_model - concat_dim features, then concat_dim position
        features, so neither is written over the other; the token table is then narrower than
        the output layer, which cannot share it: set tie_embeddings false).
    concat_dim: position features under `concat`; None = d_model // 4.
    """

    scheme: str = "sinusoidal"
    max_len: int = 512
    relative_max_distance: int = 16
    relative_values: bool = True
    rotary_base: float = 10000.0
    rotary_dim: int | None = None  # rotate only the first rotary_dim features of a head; None = all
    rotary_scaling: dict[str, Any] | None = None  # longer contexts: {"type": "linear"|"llama3", options}; None = off
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    sinusoidal_layout: str = "interleaved"
    learned_offset: int = 0
    combine: str = "add"
    concat_dim: int | None = None

    def __post_init__(self) -> None:
        s = "position."
        check_types(self, "position")
        _seam_choice(s + "scheme", self.scheme, "position")
        choice(s + "sinusoidal_layout", self.sinusoidal_layout, SINUSOIDAL_LAYOUTS)
        choice(s + "combine", self.combine, POSITION_COMBINES)
        positive(s + "concat_dim", self.concat_dim, integer=True, optional=True)
        non_negative(s + "learned_offset", self.learned_offset, integer=True)
        for name in ("max_len", "relative_max_distance", "t5_num_buckets", "t5_max_distance"):
            positive(s + name, getattr(self, name), integer=True)
        positive(s + "rotary_dim", self.rotary_dim, integer=True, optional=True)
        if self.rotary_dim is not None and self.rotary_dim % 2:
            raise ConfigError(s + "rotary_dim", f"expected an even number (features rotate in pairs), got {self.rotary_dim}")
        positive(s + "rotary_base", self.rotary_base)
        if self.rotary_scaling is not None:  # the check lives beside the scalings, in attnlab.nn (as the registries)
            import importlib

            problem = importlib.import_module("attnlab.nn.positions").rotary_scaling_problem(self.rotary_scaling)
            if problem:
                raise ConfigError(s + "rotary_scaling", problem)


@dataclass
class RNNConfig:
    """The recurrent encoder-decoder of arch='rnn_encoder_decoder' (see attnlab.models.rnn).

    cell: the encoder — `rnn` (Elman), `lstm`, `gru`, or `conv` (word-window 1-D convolutions,
        decoded by a GRU). attention: `none` (fixed-size bottleneck), `additive` (Bahdanau et al.
        2015), `dot` or `general` (Luong et al. 2015). Embeddings have width d_model.
    """

    cell: str = "lstm"
    attention: str = "additive"
    hidden_size: int = 256
    num_layers: int = 1
    bidirectional: bool = False
    conv_window: int = 3
    attention_hidden: int | None = None  # width of the additive scorer; None = hidden_size

    def __post_init__(self) -> None:
        s = "rnn."
        check_types(self, "rnn")
        choice(s + "cell", self.cell, RNN_CELLS)
        choice(s + "attention", self.attention, RNN_ATTENTIONS)
        for name in ("hidden_size", "num_layers", "conv_window"):
            positive(s + name, getattr(self, name), integer=True)
        positive(s + "attention_hidden", self.attention_hidden, integer=True, optional=True)
        if self.conv_window % 2 == 0:
            raise ConfigError(s + "conv_window", f"expected an odd number (a window centred on its word), "
                              f"got {self.conv_window}")
        if self.bidirectional and self.cell == "conv":
            raise ConfigError(s + "bidirectional", "true needs a recurrent cell (rnn, lstm, gru), not conv")


@dataclass
class MoEConfig:
    """Mixture-of-experts feed-forward (attnlab.nn.moe; Shazeer et al. 2017): off while
    num_experts is 0.

    num_experts: E feed-forward experts per MoE layer (0 = a plain feed-forward everywhere).
    top_k: experts per token; the gates are the softmax of the router's k largest logits.
    capacity_factor: in training, an expert takes at most ceil(factor * tokens * top_k / E)
        assignments and drops the rest (counted); None = no limit. Inference never drops.
    noisy: learned input-dependent gating noise in training (noisy top-k gating).
    balance_weight: weight of the load-balancing term (Switch: E * sum_e f_e P_e) in the loss.
    every: layer i (from 0) is MoE when (i + 1) % every == 0: 1 = every layer, 2 = every second.
    """

    num_experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = 1.25
    noisy: bool = True
    balance_weight: float = 0.01
    every: int = 1

    def __post_init__(self) -> None:
        s = "moe."
        check_types(self, "moe")
        non_negative(s + "num_experts", self.num_experts, integer=True)
        positive(s + "top_k", self.top_k, integer=True)
        positive(s + "every", self.every, integer=True)
        positive(s + "capacity_factor", self.capacity_factor, optional=True)
        non_negative(s + "balance_weight", self.balance_weight)
        if self.num_experts == 1:
            raise ConfigError(s + "num_experts", "1 expert is a plain feed-forward: use 0, or 2 or more")
        if self.num_experts and self.top_k > self.num_experts:
            raise ConfigError(s + "top_k", f"{self.top_k} is more than num_experts={self.num_experts}")


@dataclass
class ModelConfig:
    """Everything needed to build a model; see the field comments and `presets`.

    arch: `decoder` (GPT), `encoder` (BERT) or `encoder_decoder` (the original Transformer, T5).
    num_layers: layers of the (only, or encoder) stack; num_decoder_layers: the decoder
        stack of an encoder-decoder (None = num_layers).
    d_ff: the feed-forward's hidden width; 0 = no feed-forward sublayer, an attention-only
        Transformer (each layer is its attention sublayers only: Elhage et al. 2021).
    head: what `forward` returns on top of the last hidden state — `lm` (next-token logits),
        `mlm` (BERT's transform + tied decoder), `classification` (num_labels logits),
        `token_classification` (num_labels logits per token, (B, T, num_labels)),
        `regression` (one number per sequence, (B,), pooled like classification),
        `none` (hidden states). None picks `lm` for decoders and encoder-decoders, `none`
        for encoders.

    The Llama family (Llama, Mistral, Qwen2; docs/how-to/llama.md) is a `decoder` with
    `norm: rmsnorm`, `norm_placement: pre`, `activation: swiglu`, `ffn_bias: false`,
    `position.scheme: rotary` (`rotary_base`, `rotary_scaling`), `attention.num_kv_heads` for
    grouped-query attention and `tie_embeddings` as the checkpoint has it; Mistral adds
    `attention.kernel: sliding_window`, Qwen2 `attention.bias: true`.
    """

    arch: str = "decoder"
    vocab_size: int = 32000
    d_model: int = 512
    num_layers: int = 6
    num_decoder_layers: int | None = None
    num_heads: int = 8
    head_dim: int | None = None  # None = d_model // num_heads
    d_ff: int = 2048
    activation: str = "relu"
    ffn_bias: bool = True
    dropout: float = 0.1
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_bias: bool = True
    norm_placement: str = "post"
    final_norm: bool | None = None  # None = True for pre/both placements, False for post
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    rnn: RNNConfig = field(default_factory=RNNConfig)  # used by arch="rnn_encoder_decoder" only
    moe: MoEConfig = field(default_factory=MoEConfig)  # mixture-of-experts feed-forward layers (off by default)
    memory_len: int = 0  # Transformer-XL segment memory: positions of earlier segments kept per layer; 0 = off
    embedding_scale: bool = False  # multiply token embeddings by sqrt(d_model)
    embedding_norm: bool = False  # a norm after summing the embeddings (BERT)
    type_vocab_size: int = 0  # segment embeddings (BERT's token_type_ids); 0 = none
    tie_embeddings: bool = True  # output projection shares the input embedding matrix
    share_embeddings: bool = True  # encoder and decoder share one vocabulary and matrix
    src_vocab_size: int | None = None  # encoder vocabulary when not shared; None = vocab_size
    lm_head_bias: bool = False  # a bias on the LM logits (BART's and Marian's final_logits_bias)
    lm_head_scale: float = 1.0  # multiply the hidden state by this before the LM projection (T5: d_model^-0.5)
    head: str | None = None
    num_labels: int = 2
    pooler: bool = False  # BERT's dense + tanh over the first token
    nsp_head: bool = False  # BERT's next-sentence classifier on the pooled [CLS], beside head='mlm'
    sbo_head: bool = False  # SpanBERT's span-boundary head (attnlab.models.heads.SpanBoundaryHead), beside head='mlm'
    sbo_max_span: int = 32  # positions within a span the SBO head embeds; a token further in takes the last
    classifier_pooling: str | None = None  # None = `first` ([CLS]) for encoders, `last` for decoders
    pad_token_id: int | None = 0
    init_std: float = 0.02

    SECTION: ClassVar[str] = ""  # its errors name fields from the root (`attention.kernel`), moved under
    # `model.` when it is TrainConfig's model section (see attnlab.config.validate.sub_config)

    def __post_init__(self) -> None:
        check_types(self)
        choice("arch", self.arch, FAMILY_TRAITS)
        family = FAMILY_TRAITS[self.arch]
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_labels"):
            positive(name, getattr(self, name), integer=True)
        non_negative("d_ff", self.d_ff, integer=True)
        for name in ("num_decoder_layers", "head_dim", "src_vocab_size"):
            positive(name, getattr(self, name), integer=True, optional=True)
        choice("activation", self.activation, _registry("activation"))
        choice("norm", self.norm, _registry("norm"))
        choice("norm_placement", self.norm_placement, PLACEMENTS)
        if self.classifier_pooling is None:
            self.classifier_pooling = family.pooling
        choice("classifier_pooling", self.classifier_pooling, POOLINGS)
        probability("dropout", self.dropout)
        for name in ("norm_eps", "lm_head_scale", "init_std"):
            positive(name, getattr(self, name))
        non_negative("type_vocab_size", self.type_vocab_size, integer=True)
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ConfigError("num_heads", f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                              "change one of them or set head_dim explicitly")
        kv = self.attention.num_kv_heads
        if kv is not None and self.num_heads % kv:
            raise ConfigError("attention.num_kv_heads", f"{kv} must divide num_heads={self.num_heads}")
        if self.head is None:
            self.head = family.heads[0]
        choice("head", self.head, HEADS)
        if self.head not in family.heads:
            raise ConfigError("head", self._head_refusal(family))
        if self.nsp_head and self.head != "mlm":
            raise ConfigError("nsp_head", f"true sits beside the MLM head: it needs arch='encoder' and head='mlm', "
                              f"got arch={self.arch!r}, head={self.head!r}")
        if self.sbo_head and self.head != "mlm":
            raise ConfigError("sbo_head", f"true sits beside the MLM head (sharing its output matrix): it needs "
                              f"arch='encoder' and head='mlm', got arch={self.arch!r}, head={self.head!r}")
        positive("sbo_max_span", self.sbo_max_span, integer=True)
        if self.pooler and not family.bidirectional:
            raise ConfigError("pooler", f"true needs arch='encoder', got arch={self.arch!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError("pad_token_id", f"{self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.final_norm is None:
            self.final_norm = self.norm_placement != "post"
        self._check_positions()
        self._check_kernel()
        self._check_rnn()
        non_negative("memory_len", self.memory_len, integer=True)
        self._check_memory()
        if self.moe.num_experts and family.recurrent:
            raise ConfigError("moe.num_experts", "experts replace a Transformer layer's feed-forward; "
                              f"arch={self.arch!r} has none")
        if self.moe.num_experts and not self.d_ff:
            raise ConfigError("moe.num_experts", "experts replace a layer's feed-forward, and d_ff=0 asks for "
                              "attention-only layers: set d_ff > 0 or moe.num_experts 0")

    def _head_refusal(self, family: FamilyTraits) -> str:
        """Why `head` does not fit the arch (whose traits are `family`), saying what does."""
        if self.head == "mlm":
            return f"'mlm' needs arch='encoder', got arch={self.arch!r}"
        if len(family.heads) == 1:
            return f"arch={self.arch!r} takes head={family.heads[0]!r}, got head={self.head!r}"
        if self.head == "lm":
            return "'lm' is for decoders; an encoder takes head='mlm', 'classification' or 'none'"
        return f"{self.head!r} is for arch='encoder' or 'decoder', got arch={self.arch!r}"

    def _check_memory(self) -> None:
        """memory_len > 0 (Transformer-XL's segment recurrence, attnlab.models.recurrence): a decoder
        whose positions are relative (or none), since absolute ones restart at every segment."""
        if not self.memory_len:
            return
        if not FAMILY_TRAITS[self.arch].memory:
            raise ConfigError("memory_len", f"segment memory is for arch='decoder' (a causal stack reading a "
                              f"stream), got arch={self.arch!r}; set memory_len 0")
        if _registry("position")[self.position.scheme].where == "embeddings":
            relative = ", ".join(name for name, s in _registry("position").items() if s.where != "embeddings")
            raise ConfigError("memory_len", f"{self.memory_len} needs positions that stay consistent across "
                              f"segments; position.scheme={self.position.scheme!r} is absolute (it would number "
                              f"every segment from 0 again): use one of {relative}")

    def _check_rnn(self) -> None:
        if not FAMILY_TRAITS[self.arch].recurrent:
            return
        rnn = self.rnn
        memory = self.d_model if rnn.cell == "conv" else rnn.hidden_size * (2 if rnn.bidirectional else 1)
        if rnn.attention == "dot" and memory != rnn.hidden_size:
            raise ConfigError("rnn.attention", f"'dot' needs encoder states as wide as the decoder's "
                              f"(rnn.hidden_size={rnn.hidden_size}), got {memory}; use 'general' or change "
                              "rnn.bidirectional / d_model")

    def _check_positions(self) -> None:
        pos = self.position
        if pos.combine == "concat":
            self._check_concat()
        if pos.scheme == "rotary":
            rotary_dim = pos.rotary_dim or self.resolved_head_dim
            if rotary_dim > self.resolved_head_dim or rotary_dim % 2:
                raise ConfigError("position.rotary_dim", f"{rotary_dim} must be even and <= head_dim="
                                  f"{self.resolved_head_dim}")

    def _check_concat(self) -> None:
        """position.combine='concat': an absolute scheme, a width that leaves token features, no tied head."""
        pos, where = self.position, _registry("position")[self.position.scheme].where
        if where != "embeddings" or FAMILY_TRAITS[self.arch].recurrent:
            raise ConfigError("position.combine", f"'concat' joins absolute positions to the token embeddings; "
                              f"position.scheme={pos.scheme!r} with arch={self.arch!r} has none to join (use 'add')")
        if not 0 < self.position_dim < self.d_model:
            raise ConfigError("position.concat_dim", f"{self.position_dim} must leave token features: between 1 and "
                              f"d_model - 1 = {self.d_model - 1}")
        if pos.scheme == "sinusoidal" and self.position_dim % 2:
            raise ConfigError("position.concat_dim", f"sinusoidal positions come in sin/cos pairs: expected an even "
                              f"number, got {self.position_dim}")
        if self.tie_embeddings and self.head in ("lm", "mlm"):
            raise ConfigError("tie_embeddings", f"position.combine='concat' narrows the token table to d_model - "
                              f"concat_dim = {self.token_dim} features, which the {self.head} head's d_model-wide "
                              "output layer cannot share: set tie_embeddings false")

    def _check_kernel(self) -> None:
        """What the attention kernel supports (attnlab.nn.kernels.Supports) against the arch, the
        position scheme and the vocabulary; never the kernel's name."""
        att, pos = self.attention, self.position
        supports = _registry("kernel")[att.kernel].supports
        schemes = _registry("position")
        scheme = schemes[pos.scheme]
        if scheme.value_term(pos) and not supports.value_term:
            raise ConfigError("attention.kernel", f"{att.kernel!r} cannot add position.scheme={pos.scheme!r}'s term "
                              f"on the values (Shaw et al.); set position.{scheme.value_option}=False or "
                              "attention.kernel='auto'")
        if not supports.causal and not FAMILY_TRAITS[self.arch].bidirectional:
            raise ConfigError("attention.kernel", f"{att.kernel!r} is bidirectional only: it needs arch='encoder', "
                              f"got arch={self.arch!r}")
        if scheme.score_bias and not supports.score_bias:
            plain = ", ".join(name for name, other in schemes.items() if not other.score_bias)
            raise ConfigError("attention.kernel", f"{att.kernel!r} cannot use position.scheme={pos.scheme!r} (it "
                              f"adds a bias per (query, key) pair, which this kernel has no place for); use {plain}")
        for f in dataclasses.fields(att.kernel_options):
            token = getattr(att.kernel_options, f.name)
            if f.metadata.get("token_id") and token is not None and token >= self.vocab_size:
                raise ConfigError(f"attention.kernel_options.{f.name}", f"{token} is outside the vocabulary "
                                  f"[0, {self.vocab_size})")

    # ---- derived values -------------------------------------------------------------------
    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    @property
    def resolved_num_kv_heads(self) -> int:
        return self.attention.num_kv_heads or self.num_heads

    @property
    def resolved_decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers

    @property
    def position_dim(self) -> int:
        """Features of the absolute positions: d_model when added, concat_dim when concatenated."""
        if self.position.combine == "add":
            return self.d_model
        return self.position.concat_dim or self.d_model // 4

    @property
    def token_dim(self) -> int:
        """Features of a token embedding: d_model, less the position features when concatenated."""
        return self.d_model if self.position.combine == "add" else self.d_model - self.position_dim

    @property
    def resolved_src_vocab_size(self) -> int:
        return self.vocab_size if self.share_embeddings else (self.src_vocab_size or self.vocab_size)

    # ---- plain data ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """Raises ConfigError (a ValueError) naming the dotted field: unknown, wrong type or out of range."""
        return from_dict(cls, data)

    def to_json(self, path: str | None = None) -> str:
        from attnlab.io.files import atomic_write_text, json_text

        text = json_text(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:

            atomic_write_text(path, text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str) -> "ModelConfig":
        text = text_or_path
        if not text_or_path.lstrip().startswith("{"):
            with open(text_or_path, encoding="utf-8") as f:
                text = f.read()
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return type(self).from_dict({**self.to_dict(), **changes})
