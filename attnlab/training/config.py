"""Typed training configuration: plain data, validated on load with errors that name the field.

    cfg = TrainConfig.from_dict(load_config_file("examples/shakespeare_char.yaml"))
    cfg = load_config(TrainConfig, "run.yaml", ["model.num_layers=4", "optim.lr=3e-4"])

A config file has five sections: `model`, `data`, `optim`, `schedule` and `train`, and two
optional ones: `lora` (train low-rank adapters instead of the model's weights; LoraConfig) and `parallel`
(tensor, pipeline and data parallel over `--nproc N` processes; ParallelConfig). The `model`
section is a preset name under `preset` plus any `ModelConfig` field (nested fields merge into
the preset's), or `init_from` (a pretrained folder, see attnlab.training.setup.start); on load it becomes
a typed `TrainModelConfig`. What the data decides is filled in two steps:

    on load          arch and head (and BERT's NSP parts) follow data.objective, unless you set
                     them otherwise (refused then); `TrainConfig.resolve` also lists what it set
                     (attnlab.training.config_resolve)
    tokenizer known  vocab_size and pad_token_id are the tokenizer's (`model_config(**changes)`)

What one section asks of another (data.pack and the kernel, data.seq_len and a position table,
the kernel and a tp / pp layout) is checked once the sections are built (`check_run`,
attnlab.training.run_checks).

Unknown keys, wrong types and values out of range are errors naming the dotted field
(`optim.lr: expected a number, got 'fast'`; see attnlab.config.validate).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attnlab import presets
from attnlab.config import ModelConfig
from attnlab.config.families import traits
from attnlab.config.load import apply_overrides, from_dict, load_config, load_config_file, merge, parse_value, to_dict
from attnlab.config.validate import (ConfigError, ConfigTypeError, check_types, choice, in_range, non_negative,
                                     positive, probability)
from attnlab.data.packing import PACKINGS  # plain | document_masked | pad (data.pack)
from attnlab.training.config_resolve import Implied, Resolved, apply_objective, objective_fields, recurrent
from attnlab.training.data.objectives import OBJECTIVES
from attnlab.training.run_checks import TABLE_POSITIONS, check_run, longest_pair_within
from attnlab.training.run.signals import STOP_SIGNALS  # SIGTERM | SIGUSR1 | ... (train.stop_signals)
from attnlab.training.setup.precision import PRECISIONS  # auto | fp32 | bf16 | fp16 (resolved where a run starts)
from attnlab.training.setup.threads import MAX_THREADS

__all__ = ["DataConfig", "LoraConfig", "OptimConfig", "ParallelConfig", "RunConfig", "ScheduleConfig",
           "TokenizerConfig", "TrainConfig", "TrainModelConfig", "absolute_paths", "apply_overrides", "load_config",
           "load_config_file", "objective_fields", "parse_value", "Implied", "Resolved"]

TOKENIZER_KINDS = ("char", "bpe", "wordpiece", "word")
SCHEDULES = ("constant", "cosine", "noam")
OPTIMIZERS = ("adamw", "adam")
DEVICES = ("auto", "cpu", "cuda")
NAN_POLICIES = ("stop", "skip")
DEFAULT_PRESET = "tiny-decoder"
MAX_SEED = 2 ** 63 - 2  # torch seeds are 64-bit; the data generator takes seed + 1


@dataclass
class TrainModelConfig(ModelConfig):
    """The `model` section of a run: the ModelConfig to build, and where its weights start.

    init_from: None (fresh weights), or an attnlab.save folder, an `attnlab train` run folder, a
        Hugging Face folder or a Hugging Face Hub model (`hf:NAME[@REVISION]`, through its cache)
        whose weights and tokenizer the run starts from (the model decides the architecture; see
        attnlab.training.setup.start).
    add_special_tokens: tokens appended to that tokenizer (GPT's `[START]`, `[DELIM]`, ...).
    """

    init_from: str | None = None
    add_special_tokens: list[str] = field(default_factory=list)

    @classmethod
    def expand_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """`{"preset": name, **fields}` -> the preset's fields with `fields` merged in."""
        if "preset" not in data:
            return data
        fields = dict(data)
        name = fields.pop("preset")
        choice("preset", name, presets.names())
        if fields.get("init_from") is not None:
            raise ConfigError("preset", f"{name!r} and init_from={fields['init_from']!r} both say where the model "
                              "comes from; keep one")
        return merge(presets.get(name).to_dict(), fields)


@dataclass
class TokenizerConfig:
    """kind: `char`, `bpe`, `wordpiece` or `word` (trained on the training split), or `path` to a saved one."""

    kind: str = "char"
    vocab_size: int | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        check_types(self, "data.tokenizer")
        choice("data.tokenizer.kind", self.kind, TOKENIZER_KINDS)
        positive("data.tokenizer.vocab_size", self.vocab_size, integer=True, optional=True)


@dataclass
class DataConfig:
    """source: a built-in corpus (`shakespeare`, `de-en`, `python-docs`) or a path; valid: a
    path for validation (built-in corpora bring their own split), or valid_fraction: that share
    of your source held out for validation instead (how: attnlab.training.data.batches.SourceSplit).

    seq_len: tokens per row (window objectives). Left out of a config, 256, or position.max_len
    where the model's learned or binary position table ends sooner (tiny-decoder: 64); a longer
    row than such a table holds is refused at load (attnlab.training.run_checks.check_positions).

    pack (causal_lm): how documents fill the rows of seq_len tokens (attnlab.data.packing).
    `plain` cuts windows anywhere in the stream of documents joined by EOS, each token attending
    to all before it, across documents; `document_masked` cuts the same windows but keeps the
    documents apart (no attention across a boundary, positions from 0 in each, no loss on the
    prediction across a boundary; the decoder takes `document_ids`); `pad` puts one document
    (or a piece of a long one) per row, padded. `run_checks.check_packing` says which models take it.

    batch_tokens (seq2seq): training batches of pairs of similar length, as many as fit this many
    padded source + target tokens (attnlab.data.buckets), in place of batch_size random pairs,
    which on real sentences are half padding; validation batches keep batch_size."""

    source: str = "shakespeare"
    valid: str | None = None
    valid_fraction: float | None = None  # e.g. 0.05; in place of `valid`, for your own data
    objective: str = "causal_lm"  # a key of attnlab.training.data.objectives.OBJECTIVES
    seq_len: int = 256  # left out of a config: at most a learned/binary table's position.max_len
    batch_size: int = 32
    pack: str = "plain"  # causal_lm rows: plain | document_masked | pad (see the docstring)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    mask_prob: float = 0.15  # masked_lm, span_masked_lm
    whole_word_mask: bool = False  # masked_lm (words as attnlab.tokenizers.boundaries finds them)
    span_words_p: float = 0.2  # span_masked_lm: geometric p of a span's length in words (SpanBERT)
    max_span_words: int = 10  # span_masked_lm: the longest span, in words
    span_boundary: bool = False  # span_masked_lm: SpanBERT's span-boundary objective too (loss = MLM + SBO; model.sbo_head)
    nsp: bool = False  # masked_lm: BERT's next-sentence prediction on [CLS] A [SEP] B [SEP] pairs
    noise_density: float = 0.15  # span_corruption
    mean_span_length: float = 3.0  # span_corruption
    max_pair_len: int = 64  # pairs: tokens per side; left out: at most what a learned/binary table holds
    batch_tokens: int | None = None  # seq2seq: batches of pairs of similar length, this many padded tokens each (in place of batch_size)
    text_field: str = "text"  # JSONL text key
    verify: bool = True  # built-in corpora: refuse a package whose sha256 is not a known-good one

    def __post_init__(self) -> None:
        s = "data."
        check_types(self, "data")
        choice(s + "objective", self.objective, OBJECTIVES)
        objective = OBJECTIVES[self.objective]
        for name in ("seq_len", "batch_size", "max_pair_len"):
            positive(s + name, getattr(self, name), integer=True)
        for name in ("mask_prob", "noise_density"):
            in_range(s + name, getattr(self, name), 0, 1, low_open=True, high_open=True)
        in_range(s + "valid_fraction", self.valid_fraction, 0, 1, low_open=True, high_open=True, optional=True)
        if self.valid_fraction is not None and self.valid is not None:
            raise ConfigError(s + "valid_fraction", f"{self.valid_fraction} and data.valid={self.valid!r} both say "
                              "what the validation split is; keep one")
        self._check_bpe_size()
        if self.nsp and not objective.next_sentence:
            kind = traits(objective.arch).kind
            fits = " or ".join(repr(name) for name, spec in OBJECTIVES.items() if spec.next_sentence)
            raise ConfigError(s + "nsp", f"true needs data.objective={fits} (an encoder with a [CLS] token); "
                              f"objective {self.objective!r} trains a {kind} model, which has no next-sentence head")
        if self.nsp and self.seq_len < 5:
            raise ConfigError(s + "seq_len", f"expected an integer >= 5 with data.nsp ([CLS] A [SEP] B [SEP]), "
                              f"got {self.seq_len}")
        in_range(s + "mean_span_length", self.mean_span_length, 1)
        in_range(s + "span_words_p", self.span_words_p, 0, 1, low_open=True)
        positive(s + "max_span_words", self.max_span_words, integer=True)
        if self.span_boundary and not objective.span_boundary:
            fits = " or ".join(repr(name) for name, spec in OBJECTIVES.items() if spec.span_boundary)
            raise ConfigError(s + "span_boundary", f"true needs data.objective={fits} (the SBO predicts a masked "
                              f"span's tokens from its boundaries); objective {self.objective!r} masks no spans")
        positive(s + "batch_tokens", self.batch_tokens, integer=True, optional=True)
        if self.batch_tokens is not None and not objective.length_buckets:
            fits = " or ".join(repr(name) for name, spec in OBJECTIVES.items() if spec.length_buckets)
            raise ConfigError(s + "batch_tokens", f"{self.batch_tokens} batches sentence pairs by length: it needs "
                              f"data.objective={fits}, got {self.objective!r} (use data.batch_size)")
        choice(s + "pack", self.pack, PACKINGS)
        if self.pack != "plain" and self.objective != "causal_lm":
            raise ConfigError(s + "pack", f"{self.pack!r} packs causal-LM rows: it needs data.objective='causal_lm', "
                              f"got {self.objective!r} (other objectives take data.pack='plain')")

    def _check_bpe_size(self) -> None:
        """A byte-level BPE holds the 256 bytes and the objective's special tokens before any
        merge: a smaller vocabulary is refused here, naming the field, not after reading the corpus."""
        size = self.tokenizer.vocab_size
        if self.tokenizer.kind != "bpe" or size is None:
            return
        specials = OBJECTIVES[self.objective].special_tokens("bpe")
        if size < 256 + len(specials):
            raise ConfigError("data.tokenizer.vocab_size", f"expected an integer >= {256 + len(specials)} for a "
                              f"byte-level BPE (256 bytes + {len(specials)} special token(s) of objective "
                              f"{self.objective!r}), got {size}")


@dataclass
class OptimConfig:
    """AdamW (decoupled weight decay, Loshchilov & Hutter 2019) or Adam; no decay on norms,
    biases and embeddings."""

    name: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        s = "optim."
        check_types(self, "optim")
        choice(s + "name", self.name, OPTIMIZERS)
        positive(s + "lr", self.lr)
        for i, beta in enumerate(self.betas):
            in_range(f"{s}betas[{i}]", beta, 0, 1, high_open=True)
        positive(s + "eps", self.eps)
        non_negative(s + "weight_decay", self.weight_decay)
        positive(s + "grad_clip", self.grad_clip, optional=True)
        in_range(s + "label_smoothing", self.label_smoothing, 0, 1, high_open=True)


@dataclass
class ScheduleConfig:
    """name: `constant`, `cosine` (linear warmup, cosine to min_lr_ratio * lr) or `noam`
    (d_model^-0.5 * min(s^-0.5, s * warmup^-1.5), scaled by optim.lr)."""

    name: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        s = "schedule."
        check_types(self, "schedule")
        choice(s + "name", self.name, SCHEDULES)
        non_negative(s + "warmup_steps", self.warmup_steps, integer=True)
        if self.name == "noam" and self.warmup_steps == 0:  # noam peaks at warmup_steps: 0 divides by zero
            raise ConfigError(s + "warmup_steps", "expected an integer > 0 with schedule.name='noam', got 0")
        in_range(s + "min_lr_ratio", self.min_lr_ratio, 0, 1)


@dataclass
class LoraConfig:
    """The `lora` section: low-rank adapters train instead of the model's weights (Hu et al. 2021,
    https://arxiv.org/abs/2106.09685; attnlab.nn.lora). The model is wrapped once it is built or
    loaded (model.init_from) and before the optimizer is made; every base weight is frozen except
    those of train_modules. The run folder gets OUT/adapter/ (the adapters alone) and OUT/merged/
    (the model with the adapters merged in, an attnlab.save folder) (attnlab.training.setup.adapters).

    rank: r of each adapter; alpha: its update is scaled by alpha / rank; dropout: on the adapters'
    input while training. target_modules: the Linears to adapt, each a name matched at its end
    (`q`, `k`, `v`: an attention's projections inside its fused qkv_proj; `out_proj`, `w1`, `w2`,
    or the whole fused `qkv_proj`) or a regular expression over the whole name (`layers\\.[01]\\..*\\.q`).
    train_modules: modules trained in full beside the adapters (a new task head: `head`; fine-tuning
    adds it itself).
    """

    SECTION: ClassVar[str] = "lora"  # where its errors are reported from (moved under `recipe.lora` there)
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q", "v"])
    train_modules: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = "lora."
        try:
            check_types(self, "lora")
        except ConfigTypeError as err:  # as a plain ConfigError: `lora: LoraConfig | None` would hide the field
            raise ConfigError(err.path, err.problem) from None
        positive(s + "rank", self.rank, integer=True)
        positive(s + "alpha", self.alpha)
        probability(s + "dropout", self.dropout)
        if not self.target_modules:
            raise ConfigError(s + "target_modules", "expected at least one module name (e.g. [q, v]), got []")
        for name in ("target_modules", "train_modules"):
            for i, pattern in enumerate(getattr(self, name)):
                _check_pattern(f"{s}{name}[{i}]", pattern)


def _check_pattern(path: str, pattern: str) -> None:
    """A module name (letters, digits, `_`, `.`) or a regular expression that compiles."""
    if not pattern:
        raise ConfigError(path, "expected a module name or a regular expression, got ''")
    if re.fullmatch(r"[\w.]+", pattern) is None:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(path, f"{pattern!r} is not a valid regular expression ({err})") from None


@dataclass
class RunConfig:
    """The loop: steps, precision, evaluation, checkpoints, stopping; speed and memory switches
    (`compile`, `activation_checkpointing`) and TensorBoard logging (see attnlab.training.trainer).
    `check_memory`: before the first batch the run's peak memory is estimated and a run that
    cannot fit is refused, naming the largest data.batch_size that does (attnlab.training.setup.memory);
    false skips the check. `threads`: at most 4096, capped to the CPUs with a warning."""

    out_dir: str = "runs/run"
    max_steps: int = 1000
    max_minutes: float | None = None  # stop (and checkpoint) after this wall-clock time
    grad_accum: int = 1
    precision: str = "auto"  # bf16 where native, else fp32; or bf16 | fp16 (loss-scaled) | fp32 (training.precision)
    device: str = "auto"
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 20
    checkpoint_every: int = 200
    keep_last: int = 2
    early_stopping_patience: int | None = None  # evaluations without improvement
    nan_policy: str = "stop"
    bleu_samples: int = 200  # seq2seq: sentences decoded for BLEU/chrF at each evaluation
    threads: int | None = None  # torch.set_num_threads, at most the CPUs (training.threads); None = leave as is
    compile: bool = False  # torch.compile each transformer layer (compile time in the log and summary)
    activation_checkpointing: bool = False  # keep each layer's input only; recompute it in backward
    tensorboard: bool = False  # event files in OUT/tensorboard/ (pip install 'attnlab[tensorboard]')
    # besides Ctrl-C: signals that finish the step, checkpoint and stop (training.signals); [] for none
    stop_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    check_memory: bool = True  # refuse a run whose estimated peak memory exceeds what is free (training.memory)

    def __post_init__(self) -> None:
        s = "train."
        check_types(self, "train")  # compile, activation_checkpointing, tensorboard: bools
        for name in ("max_steps", "grad_accum", "log_every", "eval_every", "eval_batches", "checkpoint_every",
                     "keep_last"):
            positive(s + name, getattr(self, name), integer=True)
        positive(s + "early_stopping_patience", self.early_stopping_patience, integer=True, optional=True)
        in_range(s + "threads", self.threads, 1, MAX_THREADS, integer=True, optional=True)
        positive(s + "max_minutes", self.max_minutes, optional=True)
        non_negative(s + "bleu_samples", self.bleu_samples, integer=True)
        in_range(s + "seed", self.seed, 0, MAX_SEED, integer=True)
        choice(s + "precision", self.precision, PRECISIONS)
        choice(s + "device", self.device, DEVICES)
        choice(s + "nan_policy", self.nan_policy, NAN_POLICIES)
        for i, name in enumerate(self.stop_signals):
            choice(f"{s}stop_signals[{i}]", name, STOP_SIGNALS)


PIPELINE_SCHEDULES = ("gpipe", "1f1b")  # attnlab.parallel.pipeline.SCHEDULES (a test checks that they agree)


@dataclass
class ParallelConfig:
    """The `parallel` section: how `attnlab train --nproc N` lays the model over N processes
    (attnlab.parallel.mesh). tp: tensor-parallel ranks (heads, d_ff and vocabulary split,
    Megatron-LM); pp: pipeline stages (the layer stack cut in order); dp: data-parallel replicas,
    None = what N leaves, N / (tp pp); micro_batches: m, the pieces a pipeline cuts each step's
    batch_size x grad_accum rows into (read when pp > 1); schedule: `gpipe` or `1f1b`.

    tp x pp x dp must be N; what the layout asks of the model and the data (heads divisible by tp,
    at least pp layers, unpadded batches under pp, ...) is checked where N is known
    (attnlab.parallel.layout.check_layout: the command line before it starts the processes)."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    micro_batches: int = 1
    schedule: str = "gpipe"

    def __post_init__(self) -> None:
        s = "parallel."
        check_types(self, "parallel")
        for name in ("tp", "pp", "micro_batches"):
            positive(s + name, getattr(self, name), integer=True)
        positive(s + "dp", self.dp, integer=True, optional=True)
        choice(s + "schedule", self.schedule, PIPELINE_SCHEDULES)

    @property
    def sharded(self) -> bool:
        """Whether the model is split over processes (tp or pp > 1), not only replicated (dp)."""
        return self.tp > 1 or self.pp > 1


def _seq_len_within_table(section: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """data.seq_len left out follows the model: its default (256) where the positions allow it,
    position.max_len where a learned or binary table ends sooner (tiny-decoder's 64), so that the
    default run trains instead of failing at its first step. data.max_pair_len left out likewise:
    its default (64), or the longest pair whose rows fit such a table (63 for seq2seq there: a side
    is max_pair_len + 1 tokens)."""
    position = model.get("position")
    if not isinstance(position, dict) or position.get("scheme") not in TABLE_POSITIONS:
        return section
    max_len = position.get("max_len")
    if not isinstance(max_len, int) or max_len < 1:
        return section  # the model's check names it
    if "seq_len" not in section and max_len < DataConfig.seq_len:
        section = {**section, "seq_len": max_len}
    objective = section.get("objective", DataConfig.objective)
    if "max_pair_len" not in section and isinstance(objective, str) and objective in OBJECTIVES \
            and OBJECTIVES[objective].pairs:
        longest = longest_pair_within(objective, max_len, DataConfig.max_pair_len)
        if longest < DataConfig.max_pair_len:
            section = {**section, "max_pair_len": longest}
    return section


def expand_run(data: dict[str, Any]) -> tuple[dict[str, Any], list[Implied]]:
    """A run config as plain data with the model section's preset merged in, data.seq_len (and
    max_pair_len) left out fitted to a position table, and the model fields data.objective, nsp and
    span_boundary imply applied: (that config, the implied fields that changed a value).

    A field the user wrote in the model section (not a preset's) is never replaced: a different
    implied value is a ConfigError naming both fields (`config_resolve.apply_objective`).
    """
    raw = data.get("model", {"preset": DEFAULT_PRESET})
    section = data.get("data", {})
    if not isinstance(raw, dict) or not isinstance(section, dict):
        return data, []  # the type check names the section
    try:
        model = TrainModelConfig.expand_dict(raw)
    except ConfigError as err:
        raise err.moved("", "model") from None
    section = _seq_len_within_table(section, model)
    objective, nsp = section.get("objective", DataConfig.objective), section.get("nsp", DataConfig.nsp)
    sbo = section.get("span_boundary", DataConfig.span_boundary)
    known = isinstance(objective, str) and objective in OBJECTIVES  # a list is unhashable: the type check says so
    implied: list[Implied] = []
    if known and isinstance(nsp, bool) and isinstance(sbo, bool) and not recurrent(model.get("arch")):
        user_set = {name for name, value in raw.items() if value is not None} - {"preset"}  # null: the default
        model, implied = apply_objective(model, user_set, objective, nsp, sbo)  # anything else: __post_init__ says why
    return {**data, "model": model, "data": section}, implied  # a data section left out: DataConfig's own defaults


def _default_data() -> DataConfig:
    """The data section of TrainConfig() as a config file without one gets it (`expand_dict`)."""
    return DataConfig(**_seq_len_within_table({}, TrainModelConfig.expand_dict({"preset": DEFAULT_PRESET})))


@dataclass
class TrainConfig:
    """A whole run; `model` is resolved on load (see the module docstring)."""

    model: TrainModelConfig = field(default_factory=lambda: TrainModelConfig.from_dict({"preset": DEFAULT_PRESET}))
    data: DataConfig = field(default_factory=lambda: _default_data())  # seq_len within the preset's table
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: RunConfig = field(default_factory=RunConfig)
    lora: LoraConfig | None = None  # train low-rank adapters instead of the weights (LoraConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # tp x pp x dp (ParallelConfig)

    def __post_init__(self) -> None:
        check_types(self)
        self._apply_objective()
        check_run(self)  # what one section asks of another (attnlab.training.run_checks)
        if self.model.add_special_tokens and not self.model.init_from:
            raise ConfigError("model.add_special_tokens", "needs model.init_from (tokens are added to a pretrained "
                              "model's tokenizer); a tokenizer trained by the run takes its tokens from the data")
        warmup, steps = self.schedule.warmup_steps, self.train.max_steps
        if warmup >= steps:  # allowed (a short trial run of a long recipe), but never what a full run means
            warnings.warn(f"schedule.warmup_steps={warmup} >= train.max_steps={steps}: the whole run is warm-up "
                          f"(the learning rate peaks at step {warmup}, the run ends at step {steps}); lower "
                          "schedule.warmup_steps or raise train.max_steps", UserWarning, stacklevel=3)

    def _apply_objective(self) -> None:
        """A model built in Python (a preset's ModelConfig) gets the fields data.objective implies,
        with a warning listing them; read from plain data (`from_dict`) it has them already, applied
        and listed by `expand_run` (`resolve`)."""
        data = self.data
        fields = objective_fields(data.objective, data.nsp, self.model.arch, data.span_boundary)
        current = {name: getattr(self.model, name) for name in fields}
        if current == fields:
            return
        _, implied = apply_objective(current, (), data.objective, data.nsp, data.span_boundary)
        try:
            self.model = self.model.replace(**fields)
        except ConfigError as err:
            raise err.moved("", "model") from None
        warnings.warn("; ".join(map(str, implied)) + " (the model given to TrainConfig is changed to fit its data "
                      "section)", UserWarning, stacklevel=4)

    @classmethod
    def expand_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Resolve the model section's preset, then apply what the data section implies before
        the model is validated (`expand_run`)."""
        return expand_run(data)[0]

    @classmethod
    def resolve(cls, data: dict[str, Any], overrides: list[tuple[str, Any]] | tuple = ()) -> Resolved:
        """A run config from plain data (a config file's) with dotted `overrides`, validated once,
        and the model fields its data section implied (attnlab.training.config_resolve):

            resolved = TrainConfig.resolve({"model": {"preset": "tiny-decoder"}, "data": {"objective": "masked_lm"}})
            [str(i) for i in resolved.implied]   # ["model.arch: encoder (data.objective='masked_lm' implies it)",
                                                 #  "model.head: mlm (data.objective='masked_lm' implies it)"]

        Raises:
            ConfigError (a ValueError): a bad value, or a model field you set against what the data
                implies, naming the fields.
            ConfigTypeError (a TypeError): a value of the wrong type, named likewise.
        """
        expanded, implied = expand_run(apply_overrides(data, list(overrides)))
        return Resolved(from_dict(cls, expanded), tuple(implied))  # expanded: nothing is implied a second time

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build and validate from plain data (a run config file, or a run folder's config.json).

        Raises:
            ConfigError (a ValueError): an unknown key or a value out of range, naming the dotted field.
            ConfigTypeError (a TypeError): a value of the wrong type, named likewise.
        """
        return from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def model_config(self, **changes: Any) -> ModelConfig:
        """The ModelConfig to build: the model section without its run fields (init_from, ...),
        with `changes` (the tokenizer's vocab_size and pad_token_id) applied.

        The section was validated when this config was built, so without changes it is copied as
        it is; with changes the result is validated once, as the config the model is built from.

        Raises:
            ConfigError: a change the model does not take (a pad_token_id outside the vocabulary ...).
        """
        values = {f.name: getattr(self.model, f.name) for f in dataclasses.fields(ModelConfig)}
        if changes:
            return ModelConfig.from_dict({**values, **changes})
        plain = object.__new__(ModelConfig)  # validated already: no second __post_init__
        for name, value in copy.deepcopy(values).items():
            setattr(plain, name, value)
        return plain


# the fields of a run config that name a file or folder
PATH_FIELDS = ("data.source", "data.valid", "data.tokenizer.path", "model.init_from", "train.out_dir")


def absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """A run config as plain data (`TrainConfig.to_dict()`) with every path field (`PATH_FIELDS`)
    made absolute against the working folder: what a run records in OUT/config.json, so that
    `attnlab eval`, `generate` and `train --resume` find its data, tokenizer and starting
    weights from any folder, and after the run folder is moved or copied (the folder's own
    files are found through where its config.json is, not through train.out_dir). A built-in
    corpus name in data.source stays a name, a Hub model (`hf:gpt2`) in model.init_from too;
    unset fields stay unset; `data` is not changed.

        absolute_paths({"data": {"source": "train.txt"}})   # {"data": {"source": "/home/me/train.txt"}}
    """
    from attnlab.data.sources import is_builtin
    from attnlab.interop.hub import is_hub_name

    data = copy.deepcopy(data)
    for dotted in PATH_FIELDS:
        *sections, name = dotted.split(".")
        section: Any = data
        for key in sections:
            section = section.get(key) if isinstance(section, dict) else None
        value = section.get(name) if isinstance(section, dict) else None
        if (not isinstance(value, str) or not value or (dotted == "data.source" and is_builtin(value))
                or (dotted == "model.init_from" and is_hub_name(value))):
            continue
        section[name] = os.path.abspath(value)
    return data
