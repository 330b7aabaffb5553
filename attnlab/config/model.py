"""Typed model configuration: plain data, validated on construction, JSON round-trippable.

A `ModelConfig` describes any model attnlab builds. Variants are chosen by strings at a
few named seams (attention score and kernel, position scheme, norm and its placement,
activation); each string is checked against the registry of allowed names here, so a
config that constructs is a config that builds.

    cfg = ModelConfig(arch="decoder", vocab_size=1000, d_model=128, num_heads=4)
    cfg = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))   # round trip
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

ARCHS = ("decoder", "encoder", "encoder_decoder", "rnn_encoder_decoder")
RNN_CELLS = ("rnn", "lstm", "gru", "conv")
RNN_ATTENTIONS = ("none", "additive", "dot", "general")
SCORES = ("scaled_dot", "dot", "cosine", "additive", "general")
KERNELS = ("auto", "eager", "sdpa", "sliding_window", "longformer", "bigbird", "linformer")
LONG_KERNELS = ("sliding_window", "longformer", "bigbird", "linformer")  # self-attention only, see attnlab.nn.sparse
LINFORMER_SHARINGS = ("layer", "head")
POSITION_SCHEMES = ("none", "sinusoidal", "learned", "binary", "relative", "rotary", "alibi", "t5_bias")
ABSOLUTE_SCHEMES = ("sinusoidal", "learned", "binary")
NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("post", "pre", "both")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "reglu", "geglu", "geglu_tanh", "swiglu")
SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
HEADS = ("none", "lm", "mlm", "classification", "token_classification", "regression")
POOLINGS = ("first", "last", "mean")


def _choice(section: str, name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{section}{name}={value!r} is not one of {', '.join(allowed)}")


def _positive(section: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{section}{name} must be a positive integer, got {value!r}")


def _probability(section: str, name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{section}{name} must be a probability in [0, 1), got {value!r}")


def _sub_config(cls: type, name: str, value: Any) -> Any:
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a {cls.__name__} or a dict, got {type(value).__name__}")
    unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {name} field(s): {', '.join(unknown)}")
    return cls(**value)


@dataclass
class AttentionConfig:
    """How queries meet keys.

    score: the score function f(q, k) — `scaled_dot` (q.k / sqrt(d_head), Vaswani et al. 2017),
        `dot` (q.k, Luong et al. 2015), `cosine` (cos(q, k) / cosine_temperature),
        `additive` (v^T tanh(W_q q + W_k k), Bahdanau et al. 2015), `general` (q W k^T, Luong).
    kernel: `auto` uses PyTorch's fused scaled_dot_product_attention whenever the variant
        allows it and falls back to `eager`; `eager` always materialises the weights;
        `sdpa` insists on the fused kernel (an error for variants it cannot express).
    num_kv_heads: key/value heads for grouped-query (1 = multi-query) attention; None = num_heads.

    Long-input kernels (self-attention; cross-attention keeps `auto`; see attnlab.nn.sparse):
    `sliding_window` — query i sees keys j with |i - j| <= window (decoders: 0 <= i - j <= window);
    `longformer` — the window plus global tokens (`global_positions` and/or every token whose id
        is `global_token_id`), which see and are seen by every position (Beltagy et al. 2020);
    `bigbird` — blocks of `block_size`: `window_blocks` per side, the first `global_blocks`
        blocks (global), `random_blocks` random blocks per query block, drawn with seed
        `random_seed + layer index` (Zaheer et al. 2020);
    `linformer` — keys and values projected along the sequence to `linformer_k` rows by learned
        (linformer_k, linformer_max_len) matrices, shared by a layer's heads or per head
        (`linformer_sharing`); encoders only (Wang et al. 2020).
    """

    score: str = "scaled_dot"
    kernel: str = "auto"
    num_kv_heads: int | None = None
    bias: bool = True
    dropout: float = 0.0
    cosine_temperature: float = 0.1
    additive_dim: int | None = None  # hidden size of the additive scorer; None = head_dim
    window: int = 256  # sliding_window, longformer: keys within this distance on each allowed side
    global_positions: list[int] = field(default_factory=list)  # longformer: global tokens by position
    global_token_id: int | None = None  # longformer: tokens with this id are global (e.g. [CLS])
    block_size: int = 64  # bigbird
    window_blocks: int = 1  # bigbird: neighbouring blocks on each allowed side
    global_blocks: int = 1  # bigbird: the first blocks, global both ways
    random_blocks: int = 3  # bigbird: random blocks per query block
    random_seed: int = 0  # bigbird: layer l draws its random blocks with random_seed + l
    linformer_k: int = 256
    linformer_max_len: int = 4096
    linformer_sharing: str = "layer"

    def __post_init__(self) -> None:
        s = "attention."
        self._check_long_kernels(s)
        _choice(s, "score", self.score, SCORES)
        _choice(s, "kernel", self.kernel, KERNELS)
        _positive(s, "num_kv_heads", self.num_kv_heads, allow_none=True)
        _positive(s, "additive_dim", self.additive_dim, allow_none=True)
        _probability(s, "dropout", self.dropout)
        if not self.cosine_temperature > 0:
            raise ValueError(f"attention.cosine_temperature must be > 0, got {self.cosine_temperature!r}")
        if self.kernel == "sdpa" and self.score == "additive":
            raise ValueError("attention.kernel='sdpa' cannot compute score='additive'; use kernel='auto' or 'eager'")

    def _check_long_kernels(self, s: str) -> None:
        for name in ("window", "window_blocks", "global_blocks", "random_blocks", "random_seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{s}{name} must be an integer >= 0, got {value!r}")
        for name in ("block_size", "linformer_k", "linformer_max_len"):
            _positive(s, name, getattr(self, name))
        _choice(s, "linformer_sharing", self.linformer_sharing, LINFORMER_SHARINGS)
        if isinstance(self.global_positions, tuple):
            self.global_positions = list(self.global_positions)
        if not isinstance(self.global_positions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in self.global_positions):
            raise ValueError(f"{s}global_positions must be a list of integers >= 0, got {self.global_positions!r}")
        if self.global_token_id is not None and (not isinstance(self.global_token_id, int)
                                                 or isinstance(self.global_token_id, bool) or self.global_token_id < 0):
            raise ValueError(f"{s}global_token_id must be None or an integer >= 0, got {self.global_token_id!r}")
        if self.kernel in LONG_KERNELS and self.score == "additive":
            raise ValueError(f"{s}kernel={self.kernel!r} needs a dot-product-shaped score; "
                             "score='additive' works with kernel='auto' or 'eager'")


@dataclass
class PositionConfig:
    """Where order comes from.

    scheme: `none`; absolute, added to the embeddings — `sinusoidal` (Vaswani et al. 2017),
        `learned`, `binary` (bits of the index as +-1); inside attention — `relative`
        (Shaw et al. 2018: learned embeddings of the clipped distance on keys, and on values
        when relative_values), `rotary` (Su et al. 2021), `alibi` (Press et al. 2022),
        `t5_bias` (Raffel et al. 2020: learned per-head bias of the bucketed distance,
        one table shared by all layers of a stack).
    max_len: positions available to `learned` (and the table size of the fixed schemes).
    sinusoidal_layout: `interleaved` (sin, cos, sin, cos, ... per frequency, the paper's
        PE(t, 2i), PE(t, 2i+1)) or `halves` ([sin of every frequency | cos of every frequency],
        the layout of Marian / fairseq checkpoints); the same features, permuted.
    learned_offset: rows of the `learned` table before position 0 (BART reserves 2: position t
        reads row t + 2); the table has max_len + learned_offset rows.
    """

    scheme: str = "sinusoidal"
    max_len: int = 512
    relative_max_distance: int = 16
    relative_values: bool = True
    rotary_base: float = 10000.0
    rotary_dim: int | None = None  # rotate only the first rotary_dim features of a head; None = all
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    sinusoidal_layout: str = "interleaved"
    learned_offset: int = 0

    def __post_init__(self) -> None:
        s = "position."
        _choice(s, "scheme", self.scheme, POSITION_SCHEMES)
        _choice(s, "sinusoidal_layout", self.sinusoidal_layout, SINUSOIDAL_LAYOUTS)
        if type(self.learned_offset) is not int or self.learned_offset < 0:
            raise ValueError(f"position.learned_offset must be an integer >= 0, got {self.learned_offset!r}")
        _positive(s, "max_len", self.max_len)
        _positive(s, "relative_max_distance", self.relative_max_distance)
        _positive(s, "rotary_dim", self.rotary_dim, allow_none=True)
        _positive(s, "t5_num_buckets", self.t5_num_buckets)
        _positive(s, "t5_max_distance", self.t5_max_distance)
        if self.rotary_dim is not None and self.rotary_dim % 2:
            raise ValueError(f"position.rotary_dim must be even, got {self.rotary_dim}")
        if not self.rotary_base > 0:
            raise ValueError(f"position.rotary_base must be > 0, got {self.rotary_base!r}")


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
        _choice(s, "cell", self.cell, RNN_CELLS)
        _choice(s, "attention", self.attention, RNN_ATTENTIONS)
        _positive(s, "hidden_size", self.hidden_size)
        _positive(s, "num_layers", self.num_layers)
        _positive(s, "attention_hidden", self.attention_hidden, allow_none=True)
        _positive(s, "conv_window", self.conv_window)
        if self.conv_window % 2 == 0:
            raise ValueError(f"rnn.conv_window must be odd, got {self.conv_window}")
        if not isinstance(self.bidirectional, bool):
            raise ValueError(f"rnn.bidirectional must be true or false, got {self.bidirectional!r}")
        if self.bidirectional and self.cell == "conv":
            raise ValueError("rnn.bidirectional=True needs a recurrent cell (rnn, lstm, gru), not conv")


@dataclass
class ModelConfig:
    """Everything needed to build a model; see the field comments and `presets`.

    arch: `decoder` (GPT), `encoder` (BERT) or `encoder_decoder` (the original Transformer, T5).
    num_layers: layers of the (only, or encoder) stack; num_decoder_layers: the decoder
        stack of an encoder-decoder (None = num_layers).
    head: what `forward` returns on top of the last hidden state — `lm` (next-token logits),
        `mlm` (BERT's transform + tied decoder), `classification` (num_labels logits),
        `token_classification` (num_labels logits per token, (B, T, num_labels)),
        `regression` (one number per sequence, (B,), pooled like classification),
        `none` (hidden states). None picks `lm` for decoders and encoder-decoders, `none`
        for encoders.
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
    classifier_pooling: str | None = None  # None = `first` ([CLS]) for encoders, `last` for decoders
    pad_token_id: int | None = 0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        self.attention = _sub_config(AttentionConfig, "attention", self.attention)
        self.position = _sub_config(PositionConfig, "position", self.position)
        self.rnn = _sub_config(RNNConfig, "rnn", self.rnn)
        _choice("", "arch", self.arch, ARCHS)
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "num_labels"):
            _positive("", name, getattr(self, name))
        for name in ("num_decoder_layers", "head_dim", "src_vocab_size"):
            _positive("", name, getattr(self, name), allow_none=True)
        _choice("", "activation", self.activation, ACTIVATIONS)
        _choice("", "norm", self.norm, NORMS)
        _choice("", "norm_placement", self.norm_placement, PLACEMENTS)
        if self.classifier_pooling is None:
            self.classifier_pooling = "last" if self.arch == "decoder" else "first"
        _choice("", "classifier_pooling", self.classifier_pooling, POOLINGS)
        _probability("", "dropout", self.dropout)
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps!r}")
        if isinstance(self.lm_head_scale, bool) or not isinstance(self.lm_head_scale, (int, float)) \
                or not self.lm_head_scale > 0:
            raise ValueError(f"lm_head_scale must be a number > 0, got {self.lm_head_scale!r}")
        if not self.init_std > 0:
            raise ValueError(f"init_std must be > 0, got {self.init_std!r}")
        if type(self.type_vocab_size) is not int or self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be an integer >= 0, got {self.type_vocab_size!r}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "change one of them or set head_dim explicitly"
            )
        kv = self.attention.num_kv_heads
        if kv is not None and self.num_heads % kv:
            raise ValueError(f"attention.num_kv_heads={kv} must divide num_heads={self.num_heads}")
        if self.head is None:
            self.head = "none" if self.arch == "encoder" else "lm"
        _choice("", "head", self.head, HEADS)
        if self.head == "mlm" and self.arch != "encoder":
            raise ValueError(f"head='mlm' needs arch='encoder', got arch={self.arch!r}")
        if self.head in ("classification", "token_classification", "regression") and self.arch == "encoder_decoder":
            raise ValueError(f"head={self.head!r} is for arch='encoder' or 'decoder'")
        if self.head == "lm" and self.arch == "encoder":
            raise ValueError("head='lm' is for decoders; an encoder takes head='mlm', 'classification' or 'none'")
        if self.nsp_head and self.head != "mlm":
            raise ValueError(f"nsp_head=True sits beside the MLM head: it needs arch='encoder' and head='mlm', "
                             f"got arch={self.arch!r}, head={self.head!r}")
        if self.pooler and self.arch != "encoder":
            raise ValueError(f"pooler=True needs arch='encoder', got arch={self.arch!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.final_norm is None:
            self.final_norm = self.norm_placement != "post"
        self._check_positions()
        self._check_rnn()

    def _check_rnn(self) -> None:
        if self.arch != "rnn_encoder_decoder":
            return
        rnn = self.rnn
        if self.head != "lm":
            raise ValueError(f"arch='rnn_encoder_decoder' takes head='lm', got head={self.head!r}")
        memory = self.d_model if rnn.cell == "conv" else rnn.hidden_size * (2 if rnn.bidirectional else 1)
        if rnn.attention == "dot" and memory != rnn.hidden_size:
            raise ValueError(f"rnn.attention='dot' needs encoder states as wide as the decoder's "
                             f"(rnn.hidden_size={rnn.hidden_size}), got {memory}; use 'general' or change "
                             "rnn.bidirectional / d_model")

    def _check_positions(self) -> None:
        pos = self.position
        if pos.scheme == "rotary":
            rotary_dim = pos.rotary_dim or self.resolved_head_dim
            if rotary_dim > self.resolved_head_dim or rotary_dim % 2:
                raise ValueError(
                    f"position.rotary_dim={rotary_dim} must be even and <= head_dim={self.resolved_head_dim}"
                )
        if self.attention.kernel in LONG_KERNELS and pos.scheme == "relative" and pos.relative_values:
            raise ValueError(f"attention.kernel={self.attention.kernel!r} cannot add Shaw relative embeddings to the "
                             "values; set position.relative_values=False or pick another position scheme")
        if self.attention.kernel == "linformer":
            if self.arch != "encoder":
                raise ValueError(f"attention.kernel='linformer' is bidirectional only: it needs arch='encoder', "
                                 f"got arch={self.arch!r}")
            if pos.scheme in ("relative", "alibi", "t5_bias"):
                raise ValueError(f"attention.kernel='linformer' cannot use position.scheme={pos.scheme!r} (a bias "
                                 "per key pair has no meaning over projected keys); use none, sinusoidal, learned, "
                                 "binary or rotary")
        if self.attention.global_token_id is not None and self.attention.global_token_id >= self.vocab_size:
            raise ValueError(f"attention.global_token_id={self.attention.global_token_id} is outside the vocabulary "
                             f"[0, {self.vocab_size})")
        if self.attention.kernel == "sdpa" and pos.scheme == "relative" and pos.relative_values:
            raise ValueError(
                "attention.kernel='sdpa' cannot add Shaw relative embeddings to the values; "
                "set position.relative_values=False or attention.kernel='auto'"
            )

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
    def resolved_src_vocab_size(self) -> int:
        return self.vocab_size if self.share_embeddings else (self.src_vocab_size or self.vocab_size)

    # ---- plain data ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s): {', '.join(unknown)}")
        return cls(**data)

    def to_json(self, path: str | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            from attnlab.utils import atomic_write_text

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
        return ModelConfig.from_dict({**self.to_dict(), **changes})
