"""Typed training configuration: plain data, validated with errors that name the field.

    cfg = TrainConfig.from_dict(load_config_file("examples/shakespeare_char.yaml"))
    cfg = apply_overrides(cfg_dict, ["model.num_layers=4", "optim.lr=3e-4"])

A config file has five sections: `model` (a preset name under `preset` plus any
`ModelConfig` field), `data`, `optim`, `schedule` and `train`. Unknown keys and wrong types are
errors naming the dotted field (e.g. `optim.lr: expected a number, got 'fast'`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

OBJECTIVES = ("causal_lm", "prefix_lm", "masked_lm", "span_corruption", "seq2seq")
SCHEDULES = ("constant", "cosine", "noam")
OPTIMIZERS = ("adamw", "adam")
PRECISIONS = ("fp32", "bf16")
NAN_POLICIES = ("stop", "skip")


@dataclass
class TokenizerConfig:
    """kind: `char`, `bpe` or `wordpiece` (trained on the training split), or `path` to a saved one."""

    kind: str = "char"
    vocab_size: int | None = None
    path: str | None = None

    def validate(self, where: str) -> None:
        _one_of(f"{where}.kind", self.kind, ("char", "bpe", "wordpiece"))


@dataclass
class DataConfig:
    """source: a built-in corpus (`shakespeare`, `de-en`, `python-docs`) or a path; valid: a
    path for validation (built-in corpora bring their own split)."""

    source: str = "shakespeare"
    valid: str | None = None
    objective: str = "causal_lm"
    seq_len: int = 256
    batch_size: int = 32
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    mask_prob: float = 0.15  # masked_lm
    whole_word_mask: bool = False  # masked_lm (WordPiece tokenizers)
    nsp: bool = False  # masked_lm: BERT's next-sentence prediction on [CLS] A [SEP] B [SEP] pairs
    noise_density: float = 0.15  # span_corruption
    mean_span_length: float = 3.0  # span_corruption
    max_pair_len: int = 64  # seq2seq: tokens per side
    text_field: str = "text"  # JSONL text key

    def validate(self, where: str) -> None:
        _one_of(f"{where}.objective", self.objective, OBJECTIVES)
        _positive(f"{where}.seq_len", self.seq_len)
        _positive(f"{where}.batch_size", self.batch_size)
        _positive(f"{where}.max_pair_len", self.max_pair_len)
        for name in ("mask_prob", "noise_density"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{where}.{name} must be in (0, 1), got {getattr(self, name)!r}")
        if self.nsp and self.objective != "masked_lm":
            raise ValueError(f"{where}.nsp=true needs {where}.objective='masked_lm' (an encoder with a [CLS] "
                             f"token); objective {self.objective!r} trains a "
                             f"{'decoder-only' if self.objective in ('causal_lm', 'prefix_lm') else 'encoder-decoder'} "
                             "model, which has no next-sentence head")
        if self.nsp and self.seq_len < 5:
            raise ValueError(f"{where}.seq_len must be >= 5 with {where}.nsp ([CLS] A [SEP] B [SEP]), got {self.seq_len}")
        if self.mean_span_length < 1:
            raise ValueError(f"{where}.mean_span_length must be >= 1, got {self.mean_span_length!r}")
        self.tokenizer.validate(f"{where}.tokenizer")


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

    def validate(self, where: str) -> None:
        _one_of(f"{where}.name", self.name, OPTIMIZERS)
        if not self.lr > 0:
            raise ValueError(f"{where}.lr must be > 0, got {self.lr!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"{where}.betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.weight_decay < 0:
            raise ValueError(f"{where}.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"{where}.grad_clip must be > 0 or null, got {self.grad_clip!r}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"{where}.label_smoothing must be in [0, 1), got {self.label_smoothing!r}")


@dataclass
class ScheduleConfig:
    """name: `constant`, `cosine` (linear warmup, cosine to min_lr_ratio * lr) or `noam`
    (d_model^-0.5 * min(s^-0.5, s * warmup^-1.5), scaled by optim.lr)."""

    name: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1

    def validate(self, where: str) -> None:
        _one_of(f"{where}.name", self.name, SCHEDULES)
        if self.warmup_steps < 0 or (self.name == "noam" and self.warmup_steps == 0):
            raise ValueError(f"{where}.warmup_steps must be >= 0 (> 0 for noam), got {self.warmup_steps!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"{where}.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")


@dataclass
class RunConfig:
    """The loop: steps, precision, evaluation, checkpoints, stopping."""

    out_dir: str = "runs/run"
    max_steps: int = 1000
    max_minutes: float | None = None  # stop (and checkpoint) after this wall-clock time
    grad_accum: int = 1
    precision: str = "fp32"
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
    threads: int | None = None  # torch.set_num_threads; None = leave as is

    def validate(self, where: str) -> None:
        for name in ("max_steps", "grad_accum", "log_every", "eval_every", "eval_batches", "checkpoint_every",
                     "keep_last"):
            _positive(f"{where}.{name}", getattr(self, name))
        _one_of(f"{where}.precision", self.precision, PRECISIONS)
        _one_of(f"{where}.device", self.device, ("auto", "cpu", "cuda"))
        _one_of(f"{where}.nan_policy", self.nan_policy, NAN_POLICIES)
        if self.early_stopping_patience is not None:
            _positive(f"{where}.early_stopping_patience", self.early_stopping_patience)


@dataclass
class TrainConfig:
    """A whole run. `model` is a dict: `preset` (optional) plus ModelConfig fields."""

    model: dict = field(default_factory=lambda: {"preset": "tiny-decoder"})
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(f.name) if f.name != "model" else None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build and validate from plain data.

        Raises:
            ValueError: an unknown key, or a value out of range (the message names the dotted field).
            TypeError: a value of the wrong type (named likewise).
        """
        return _build(cls, data, "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_config(self):
        """The ModelConfig: the preset (if any) with the other `model` keys applied."""
        from attnlab import presets
        from attnlab.config import ModelConfig

        fields = dict(self.model)
        preset = fields.pop("preset", None)
        if preset is None:
            return ModelConfig.from_dict(fields)
        base = presets.get(preset).to_dict()
        for key, value in fields.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        return ModelConfig.from_dict(base)


# ---------------------------------------------------------------- validation helpers
def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _convert(tp: Any, value: Any, name: str) -> Any:
    """Check `value` against annotation `tp` (ints are accepted for floats; lists for tuples)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, name)
            except TypeError as err:
                errors.append(str(err))
        raise TypeError(errors[0] if errors else f"{name}: unexpected value {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise TypeError(f"{name}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_convert(a, v, f"{name}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, name)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool, dict):
        if not isinstance(value, tp):
            raise TypeError(f"{name}: expected {tp.__name__ if tp is not dict else 'a mapping'}, got {value!r}")
        return value
    return value


def _build(cls: type, data: Any, where: str) -> Any:
    label = where or "config"
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise TypeError(f"{label}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{where}.{k}' if where else k for k in unknown)}; "
                         f"{label} takes {', '.join(sorted(known))}")
    values = {k: _convert(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    obj = cls.__new__(cls)
    for f in dataclasses.fields(cls):  # defaults first, then given values, then validation
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        setattr(obj, f.name, values.get(f.name, default))
    if hasattr(obj, "validate") and where:
        obj.validate(where)
    elif hasattr(obj, "__post_init__"):
        obj.__post_init__()
    return obj


# ---------------------------------------------------------------- files and overrides
def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML (`.yaml`/`.yml`, needs pyyaml) or JSON config file into plain data.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unparseable content or a YAML file without pyyaml installed.
    """
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: reading YAML needs pyyaml (pip install pyyaml), or write the config as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not valid YAML ({err})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def parse_value(raw: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false/null, lists), else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[tuple[str, Any]]) -> dict[str, Any]:
    """Set dotted keys (`model.num_layers`, `optim.lr`) in a copy of plain config data."""
    out = json.loads(json.dumps(data))
    for key, value in overrides:
        *parents, leaf = key.split(".")
        if not parents or not leaf:
            raise ValueError(f"override {key!r}: expected SECTION.FIELD, e.g. --model.num_layers 4")
        target = out
        for part in parents:
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"override {key!r}: {part!r} is not a section")
            target = nxt
        target[leaf] = value
    return out
