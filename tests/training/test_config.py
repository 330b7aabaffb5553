import dataclasses
import json
import warnings

import pytest

from attnlab import presets
from attnlab.config import ModelConfig
from attnlab.training.config import TrainConfig, TrainModelConfig, apply_overrides, load_config_file


def test_defaults_validate_and_round_trip():
    cfg = TrainConfig()
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.mark.parametrize("data,error,match", [
    ({"optim": {"lrr": 1}}, ValueError, "optim.lrr"),
    ({"optimizer": {}}, ValueError, "optimizer"),
    ({"data": {"tokenizer": {"size": 3}}}, ValueError, "data.tokenizer.size"),
    ({"optim": {"lr": "fast"}}, TypeError, "optim.lr"),
    ({"train": {"max_steps": 2.5}}, TypeError, "train.max_steps"),
    ({"train": {"max_steps": True}}, TypeError, "train.max_steps"),
    ({"optim": {"betas": [0.9]}}, TypeError, "optim.betas"),
    ({"data": {"objective": "gan"}}, ValueError, "data.objective"),
    ({"schedule": {"name": "noam", "warmup_steps": 0}}, ValueError, "schedule.warmup_steps"),
    ({"train": {"precision": "fp8"}}, ValueError, "train.precision"),
    ({"data": "shakespeare"}, TypeError, "data"),
    ({"model": {"preset": "tiny-decoder", "position": {"scheme": "fourier"}}}, ValueError, "model.position.scheme"),
    ({"model": {"preset": "tiny-decoder", "dropout": "high"}}, TypeError, "model.dropout"),
    ({"model": {"preset": "tiny-decoder", "init_from": "runs/x"}}, ValueError, "model.preset"),
])
def test_errors_name_the_field(data, error, match):
    with pytest.raises(error, match=match.replace(".", r"\.")):
        TrainConfig.from_dict(data)


def test_ints_are_accepted_for_floats_and_lists_for_tuples():
    cfg = TrainConfig.from_dict({"optim": {"lr": 1, "betas": [0.9, 0.95]}})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float) and cfg.optim.betas == (0.9, 0.95)


def test_overrides_and_the_typed_model_section(tmp_path):
    data = apply_overrides({"model": {"preset": "tiny-decoder"}}, [("model.num_layers", 3), ("model.position.scheme", "rotary"),
                                                                   ("optim.lr", 0.5)])
    cfg = TrainConfig.from_dict(data)
    assert isinstance(cfg.model, TrainModelConfig) and isinstance(cfg.model, ModelConfig)
    assert cfg.model.num_layers == 3 and cfg.model.position.scheme == "rotary" and cfg.model.position.max_len == 64
    model = cfg.model_config()
    base = presets.get("tiny-decoder")
    assert type(model) is ModelConfig
    assert model == base.replace(num_layers=3, position=dataclasses.replace(base.position, scheme="rotary"))
    assert cfg.optim.lr == 0.5
    with pytest.raises(ValueError, match="lr: unknown TrainConfig field"):  # a key outside every section
        TrainConfig.from_dict(apply_overrides({}, [("lr", 1)]))


def test_the_objective_decides_arch_and_head_on_load():
    # a decoder preset under masked_lm is an encoder before the model is validated (linformer needs one)
    cfg = TrainConfig.from_dict({"model": {"preset": "tiny-decoder", "attention": {"kernel": "linformer"}},
                                 "data": {"objective": "masked_lm", "nsp": True}})
    m = cfg.model
    assert (m.arch, m.head, m.nsp_head, m.pooler, m.type_vocab_size) == ("encoder", "mlm", True, True, 2)
    assert TrainConfig.from_dict({"data": {"objective": "seq2seq"}}).model.arch == "encoder_decoder"
    # built in Python from a plain ModelConfig, likewise
    typed = TrainConfig(model=presets.get("tiny-encoder"))
    assert isinstance(typed.model, TrainModelConfig) and typed.model.arch == "decoder"


def test_run_folder_configs_of_both_forms_load():
    # before the typed section, a run folder's config.json held the model section as written
    old = TrainConfig.from_dict({"model": {"preset": "tiny-decoder", "num_layers": 1}, "train": {"max_steps": 5}})
    assert old.model.num_layers == 1 and old.model.d_model == 32
    # now it holds the resolved section
    assert TrainConfig.from_dict(json.loads(json.dumps(old.to_dict()))) == old


def test_init_from_and_special_tokens():
    cfg = TrainConfig.from_dict({"model": {"init_from": "runs/gpt2", "add_special_tokens": ["[START]", "[DELIM]"]}})
    assert cfg.model.init_from == "runs/gpt2" and cfg.model.add_special_tokens == ["[START]", "[DELIM]"]
    assert "init_from" not in cfg.model_config().to_dict()
    with pytest.raises(ValueError, match=r"model\.add_special_tokens: needs model\.init_from"):
        TrainConfig.from_dict({"model": {"add_special_tokens": ["[START]"]}})


def test_yaml_and_json_files(tmp_path):
    (tmp_path / "c.json").write_text('{"optim": {"lr": 0.01}}')
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 0.01\n")
    assert load_config_file(tmp_path / "c.json") == load_config_file(tmp_path / "c.yaml") == {"optim": {"lr": 0.01}}
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        load_config_file(tmp_path / "bad.json")


# ---------------------------------------------------------------- numbers that make no sense
SECTIONS = {"data": "DataConfig", "data.tokenizer": "TokenizerConfig", "optim": "OptimConfig",
            "schedule": "ScheduleConfig", "train": "RunConfig"}
ZERO_MEANS_SOMETHING = {"optim.weight_decay", "optim.label_smoothing", "schedule.warmup_steps",
                        "schedule.min_lr_ratio", "train.bleu_samples", "train.seed"}


def _numeric_fields():
    """Every int/float field (optional or not) of the run config's sections, as dotted names."""
    import typing

    import attnlab.training.config as module

    names = []
    for section, cls_name in SECTIONS.items():
        cls = getattr(module, cls_name)
        for name, tp in typing.get_type_hints(cls).items():
            if typing.get_origin(tp) in (tuple, list):  # optim.betas: each item has its own check
                continue
            kinds = set(typing.get_args(tp)) or {tp}
            if kinds & {int, float} and bool not in kinds:
                names.append((f"{section}.{name}", int in kinds and float not in kinds))
    return names


NUMERIC = _numeric_fields()


def _with(path, value):
    data = apply_overrides({}, [(path, value)])
    if path.startswith("schedule."):  # keep the warm-up below the run (that only warns; tested below)
        data.setdefault("train", {})["max_steps"] = 10 ** 6
    return data


def test_the_sweep_sees_the_fields_it_should():
    names = {name for name, _ in NUMERIC}
    assert {"train.threads", "train.max_minutes", "train.seed", "data.valid_fraction", "data.tokenizer.vocab_size",
            "schedule.warmup_steps", "optim.lr"} <= names and len(names) >= 25


@pytest.mark.parametrize("path,integer", NUMERIC, ids=[name for name, _ in NUMERIC])
def test_a_negative_number_is_refused_naming_the_field(path, integer):
    with pytest.raises(ValueError, match=f"^{path.replace('.', '[.]')}: expected"):
        TrainConfig.from_dict(_with(path, -1 if integer else -1.0))


@pytest.mark.parametrize("path,integer", NUMERIC, ids=[name for name, _ in NUMERIC])
def test_zero_is_refused_unless_it_means_something(path, integer):
    data = _with(path, 0 if integer else 0.0)
    if path in ZERO_MEANS_SOMETHING:
        TrainConfig.from_dict(data)
    else:
        with pytest.raises(ValueError, match=f"^{path.replace('.', '[.]')}: expected"):
            TrainConfig.from_dict(data)


@pytest.mark.parametrize("data,match", [
    ({"train": {"threads": 0}}, r"train\.threads: expected an integer in \[1, 4096\] or null, got 0"),
    # issue 32: torch.set_num_threads(100000) crashes the process at its first parallel region
    ({"train": {"threads": 100000}}, r"train\.threads: expected an integer in \[1, 4096\] or null, got 100000"),
    ({"train": {"check_memory": "yes"}}, r"train\.check_memory: expected true or false, got 'yes'"),
    ({"train": {"max_minutes": -1}}, r"train\.max_minutes: expected a number > 0 or null, got -1"),
    ({"train": {"seed": 2 ** 64}}, r"train\.seed: expected an integer in \[0, "),
    ({"data": {"tokenizer": {"kind": "bpe", "vocab_size": 200}}},
     r"data\.tokenizer\.vocab_size: expected an integer >= 257 for a byte-level BPE \(256 bytes \+ 1 special"),
    ({"data": {"objective": "span_corruption", "tokenizer": {"kind": "bpe", "vocab_size": 300}}},
     r"data\.tokenizer\.vocab_size: expected an integer >= 359"),
    ({"data": {"valid": "v.txt", "valid_fraction": 0.1}}, r"data\.valid_fraction: 0\.1 and data\.valid='v\.txt'"),
])
def test_what_the_issue_names_is_refused(data, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(data)


def test_null_means_no_limit():
    cfg = TrainConfig.from_dict({"train": {"max_minutes": None, "threads": None}})
    assert cfg.train.max_minutes is None and cfg.train.threads is None


def test_a_warmup_as_long_as_the_run_warns_with_both_numbers():
    with pytest.warns(UserWarning, match=r"schedule\.warmup_steps=2000 >= train\.max_steps=1000"):
        TrainConfig.from_dict({"schedule": {"warmup_steps": 2000}})
    with pytest.warns(UserWarning, match=r"schedule\.warmup_steps=50 >= train\.max_steps=50"):
        TrainConfig.from_dict({"schedule": {"warmup_steps": 50}, "train": {"max_steps": 50}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainConfig.from_dict({"schedule": {"warmup_steps": 49}, "train": {"max_steps": 50}})


# ---------------------------------------------------------------- model.init_from, resolved
def _saved_model(folder):
    import attnlab
    from attnlab.models import build_model

    model = build_model(presets.get("tiny-decoder").replace(num_layers=3, d_model=48, num_heads=3, vocab_size=70))
    attnlab.save(model, folder)
    return model.config


def test_init_from_reads_an_attnlab_folder_without_its_weights(tmp_path):
    from attnlab.training.setup.start import read_init_config, resolve_init_from

    saved = _saved_model(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()  # the config alone is read
    assert read_init_config(tmp_path / "m") == saved
    # seq_len within the saved model's learned table (64): 256 is refused once the folder is read
    cfg = TrainConfig.from_dict({"model": {"init_from": str(tmp_path / "m")}, "data": {"seq_len": 64},
                                 "train": {"max_steps": 500}})
    assert cfg.model.num_layers != 3  # the section holds defaults until resolved
    resolved = resolve_init_from(cfg)
    assert resolved.model_config() == saved and resolved.model.init_from == str(tmp_path / "m")
    assert resolved.train == cfg.train and resolved.data == cfg.data
    assert TrainConfig.from_dict(json.loads(json.dumps(resolved.to_dict()))) == resolved  # config.json round trip
    assert resolve_init_from(TrainConfig()) == TrainConfig()


def test_init_from_a_run_folder_reads_its_model_section(tmp_path):
    from attnlab.training.setup.start import read_init_config

    model = presets.get("tiny-decoder").replace(num_layers=2)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text(json.dumps({"config": {}, "model": model.to_dict(), "seed": 0}))
    assert read_init_config(tmp_path / "run") == model


def test_init_from_a_hugging_face_folder_matches_the_loaded_model(tmp_path):
    import transformers

    import attnlab
    from attnlab.training.setup.start import read_init_config

    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=90, n_positions=40, n_embd=32, n_layer=2,
                                                              n_head=4))
    hf.save_pretrained(tmp_path / "gpt2")
    assert read_init_config(tmp_path / "gpt2") == attnlab.load(tmp_path / "gpt2").config  # the converter's reading


def test_init_from_refuses_a_folder_or_architecture_that_does_not_fit(tmp_path):
    from attnlab.training.setup.start import resolve_init_from

    _saved_model(tmp_path / "m")
    with pytest.raises(ValueError, match=r"data\.objective='masked_lm' trains an encoder but model\.init_from is "
                                         r"a decoder"):
        resolve_init_from(TrainConfig.from_dict({"model": {"init_from": str(tmp_path / "m")},
                                                 "data": {"objective": "masked_lm"}}))
    with pytest.raises(FileNotFoundError, match=r"model\.init_from='.*nothing': expected a folder with config\.json"):
        resolve_init_from(TrainConfig.from_dict({"model": {"init_from": str(tmp_path / "nothing")}}))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"arch": "decoder", "num_layers": -2}')
    with pytest.raises(ValueError, match=r"bad/config\.json: num_layers"):
        resolve_init_from(TrainConfig.from_dict({"model": {"init_from": str(tmp_path / "bad")}}))


@pytest.mark.parametrize("scheme", ["learned", "binary"])
def test_windows_longer_than_a_position_table_are_refused_at_load(scheme):
    """tiny-decoder's table ends at 64: data.seq_len 128 failed at the first step, after the corpus
    was read and tokenised (found following the docs as a new user)."""
    model = {"preset": "tiny-decoder", "position": {"scheme": scheme, "max_len": 64}}
    assert TrainConfig.from_dict({"model": model, "data": {"seq_len": 64}}).data.seq_len == 64
    with pytest.raises(ValueError, match=r"data.seq_len: rows of up to 65 tokens .* model.position.max_len=64"):
        TrainConfig.from_dict({"model": model, "data": {"seq_len": 65}})
    TrainConfig.from_dict({"model": {**model, "position": {"scheme": "rotary"}}, "data": {"seq_len": 4096}})


def test_seq_len_left_out_follows_a_shorter_table():
    """The default run (tiny-decoder: learned positions, 64) trains: seq_len left out is 64 there,
    256 where the positions allow it; written out, the run's config says which."""
    assert TrainConfig().data.seq_len == 64
    assert TrainConfig.from_dict({"data": {"source": "x.txt"}}).data.seq_len == 64
    assert TrainConfig.from_dict({"model": {"preset": "tiny-decoder", "position": {"scheme": "rotary"}}}).data.seq_len \
        == 256
    wide = {"preset": "tiny-decoder", "position": {"scheme": "learned", "max_len": 1024}}
    assert TrainConfig.from_dict({"model": wide}).data.seq_len == 256
    assert TrainConfig.from_dict(TrainConfig().to_dict()).data.seq_len == 64
