import dataclasses
import json

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
