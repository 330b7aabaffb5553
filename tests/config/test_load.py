"""The one loader: every config dataclass round-trips, and every error names its dotted field."""

import dataclasses
import json
import re
import typing

import pytest

import attnlab.config.model as model_configs
import attnlab.training.config as train_configs
from attnlab import presets
from attnlab.config import (ConfigError, ConfigTypeError, ModelConfig, apply_overrides, from_dict, load_config,
                            load_config_file, to_dict)
from attnlab.training.config import TrainConfig

MODULES = [model_configs, train_configs]


def config_classes():
    """Every config dataclass of the config modules (a new one is covered without a new line here)."""
    found = [v for m in MODULES for v in vars(m).values()
             if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == m.__name__]
    try:  # fine-tuning's recipe, where it is still its own config
        from attnlab.finetune.runner import Recipe
        found.append(Recipe)
    except ImportError:
        pass
    return found


def json_round_trip(cls, config):
    return from_dict(cls, json.loads(json.dumps(to_dict(config))))


@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_every_config_round_trips_through_json(cls):
    config = cls()
    assert json_round_trip(cls, config) == config


@pytest.mark.parametrize("name", presets.names())
def test_presets_round_trip_alone_and_as_a_run_model(name):
    cfg = presets.get(name)
    assert json_round_trip(ModelConfig, cfg) == cfg
    objective = {"encoder": "masked_lm", "decoder": "causal_lm"}.get(cfg.arch, "seq2seq")
    run = TrainConfig.from_dict({"model": {"preset": name}, "data": {"objective": objective}})
    assert json_round_trip(TrainConfig, run) == run
    assert run.model_config() == cfg.replace(**train_configs.objective_fields(objective, False, cfg.arch))


def _mapping_paths(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from _mapping_paths(value, path)


@pytest.mark.parametrize("cls", [TrainConfig, ModelConfig], ids=lambda c: c.__name__)
def test_an_unknown_key_anywhere_is_refused_with_its_dotted_path(cls):
    plain = to_dict(cls())
    for path in ["", *_mapping_paths(plain)]:
        bad = apply_overrides(plain, [(f"{path}.zz_unknown" if path else "zz_unknown", 1)])
        with pytest.raises(ConfigError) as err:
            from_dict(cls, bad)
        where = f"{path}.zz_unknown" if path else "zz_unknown"
        assert str(err.value).startswith(f"{where}: unknown "), str(err.value)


def _leaf_paths(cls, prefix=""):
    """(dotted path, annotation) of every non-section field of `cls` and its sub-configs."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaf_paths(hints[f.name], path)
        else:
            yield path


class _Wrong:
    """A value of no type a config field takes."""

    def __repr__(self):
        return "<wrong>"


@pytest.mark.parametrize("cls", [TrainConfig, ModelConfig], ids=lambda c: c.__name__)
def test_every_field_is_type_checked_from_its_annotation(cls):
    plain = to_dict(cls())
    decided = {"model.arch", "model.head"} if cls is TrainConfig else set()  # data.objective sets these on load
    for path in [p for p in _leaf_paths(cls) if p not in decided]:
        bad = apply_overrides(plain, [(path, _Wrong())])
        with pytest.raises(ConfigError) as err:  # ConfigTypeError where the annotation says the type
            from_dict(cls, bad)
        assert str(err.value).startswith(f"{path}: ") and "<wrong>" in str(err.value), str(err.value)


@pytest.mark.parametrize("data, error, message", [
    ({"optim": {"lr": "fast"}}, ConfigTypeError, "optim.lr: expected a number, got 'fast'"),
    ({"optim": {"lr": -1}}, ConfigError, "optim.lr: expected a number > 0, got -1.0"),
    ({"model": {"preset": "tiny-decoder", "attention": {"kernel": "flash"}}}, ConfigError,
     "model.attention.kernel: 'flash' is not one of "),
    ({"model": {"preset": "tiny-decoder", "num_heads": 3}}, ConfigError, "model.num_heads: d_model=32 is not divisible"),
    ({"model": {"preset": "gpt5"}}, ConfigError, "model.preset: 'gpt5' is not one of "),
    ({"train": {"max_steps": 0}}, ConfigError, "train.max_steps: expected an integer > 0, got 0"),
    ({"data": {"tokenizer": {"kind": "sentencepiece"}}}, ConfigError, "data.tokenizer.kind: 'sentencepiece' is not"),
])
def test_errors_read_section_field_then_what_is_allowed(data, error, message):
    with pytest.raises(error) as err:
        TrainConfig.from_dict(data)
    assert str(err.value).startswith(message), str(err.value)


def test_load_config_reads_a_file_and_applies_overrides(tmp_path):
    (tmp_path / "run.yaml").write_text("model:\n  preset: tiny-decoder\noptim:\n  lr: 0.01\n")
    cfg = load_config(TrainConfig, tmp_path / "run.yaml", ["optim.lr=3e-4", ("model.position.scheme", "rotary")])
    assert cfg.optim.lr == 3e-4 and cfg.model.position.scheme == "rotary" and cfg.model.position.max_len == 64
    with pytest.raises(ValueError, match=r"optim\.lr is a value \(0\.01\), not a section"):
        apply_overrides({"optim": {"lr": 0.01}}, ["optim.lr.x=1"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_overrides({}, ["optim.lr"])


# ---------------------------------------------------------------- NaN and infinity

def _run_classes():
    """Every top-level config a user writes, with the least data it needs (fine-tuning's job has
    required fields; a ViT's is its own file)."""
    from attnlab.finetune.job import FinetuneJobConfig
    from attnlab.models.vision import VisionConfig

    job = {"model": "m", "data": {"train": "t.csv", "valid": "v.csv"}, "out_dir": "o"}
    return [(TrainConfig, {}), (ModelConfig, {}), (FinetuneJobConfig, job), (VisionConfig, {})]


def _takes_float(tp):
    return tp is float or any(_takes_float(a) for a in typing.get_args(tp))


def _float_paths(cls, prefix=""):
    """(dotted path, place) of every field of `cls` (and of its sub-configs, optional ones too)
    whose annotation takes a number: `place(x)` is the value x as that field holds it (a list for
    `betas` and `labels`, whose error names the item, `[0]`)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        options = [a for a in (typing.get_args(hints[f.name]) or (hints[f.name],)) if a is not type(None)]
        if typing.get_origin(hints[f.name]) in (tuple, list):
            options = [hints[f.name]]
        nested = [a for a in options if dataclasses.is_dataclass(a)]
        sequences = [a for a in options if typing.get_origin(a) in (tuple, list) and _takes_float(a)]
        if nested:
            yield from _float_paths(nested[0], path)
        elif sequences:
            args = typing.get_args(sequences[0])
            size = len(args) if typing.get_origin(sequences[0]) is tuple and ... not in args else 1
            yield f"{path}[0]", lambda x, size=size: [x] * size
        elif float in options:
            yield path, lambda x: x


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("cls, base", _run_classes(), ids=lambda c: getattr(c, "__name__", ""))
def test_every_number_field_refuses_nan_and_infinity_by_name(cls, base, bad):
    paths = list(_float_paths(cls))
    assert len(paths) >= 4, paths  # the walk found the fields (a class without numbers would say nothing)
    for path, place in paths:
        data = apply_overrides(base, [(path.removesuffix("[0]"), place(bad))])
        with pytest.raises(ConfigError) as err:
            from_dict(cls, data)
        assert str(err.value) == f"{path}: expected a finite number, got {bad!r}", str(err.value)


@pytest.mark.parametrize("name, text, overrides, path", [
    ("run.yaml", "optim:\n  lr: .nan\n", [], "optim.lr"),
    ("run.yaml", "optim:\n  grad_clip: .inf\n", [], "optim.grad_clip"),
    ("run.yaml", "data:\n  mask_prob: -.inf\n", [], "data.mask_prob"),
    ("run.json", '{"optim": {"weight_decay": NaN}}', [], "optim.weight_decay"),
    ("run.json", '{"optim": {"betas": [Infinity, 0.9]}}', [], "optim.betas[0]"),
    ("run.json", '{"model": {"preset": "tiny-decoder", "dropout": 1e999}}', [], "model.dropout"),
    ("run.yaml", "optim:\n  lr: 0.01\n", ["optim.lr=NaN"], "optim.lr"),
    ("run.json", "{}", ["model.attention.dropout=-Infinity"], "model.attention.dropout"),
])
def test_nan_and_infinity_are_refused_from_yaml_json_and_overrides(tmp_path, name, text, overrides, path):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=rf"^{re.escape(path)}: expected a finite number, got (nan|-?inf)$"):
        load_config(TrainConfig, tmp_path / name, overrides)


@pytest.mark.parametrize("name, text, key, line, first", [
    ("run.yaml", "optim:\n  lr: 0.01\n  eps: 1.0e-8\n  lr: 0.02\n", "lr", 4, 2),
    ("run.yml", "train:\n  max_steps: 2\ntrain:\n  max_steps: 3\n", "train", 3, 1),
    ("run.json", '{"optim": {"lr": 0.01,\n  "betas": [0.9, 0.99],\n  "nested": {"lr": 1},\n  "lr": 0.02}}', "lr", 4, 1),
    ("run.json", '{\n  "data": {"source": "a.txt"},\n  "model": {},\n  "data": {"source": "b.txt"}\n}', "data", 4, 2),
])
def test_a_key_given_twice_is_refused_with_the_file_and_line(tmp_path, name, text, key, line, first):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as err:
        load_config_file(tmp_path / name)
    assert str(err.value).startswith(f"{tmp_path / name}, line {line}: key {key!r} is given twice in the same "
                                     f"mapping (first at line {first})"), str(err.value)


def test_the_same_key_in_different_mappings_and_yaml_merge_keys_are_fine(tmp_path):
    (tmp_path / "a.yaml").write_text("base: &b\n  lr: 1\n  eps: 2\noptim:\n  <<: *b\n  lr: 3\ntrain:\n  lr: 4\n")
    assert load_config_file(tmp_path / "a.yaml") == {"base": {"lr": 1, "eps": 2}, "optim": {"lr": 3, "eps": 2},
                                                   "train": {"lr": 4}}
    (tmp_path / "a.json").write_text('{"optim": {"lr": 1, "x": {"lr": 2}}, "lr": [{"lr": 3}, {"lr": 4}]}')
    assert load_config_file(tmp_path / "a.json") == {"optim": {"lr": 1, "x": {"lr": 2}}, "lr": [{"lr": 3}, {"lr": 4}]}
