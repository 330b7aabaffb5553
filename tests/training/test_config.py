import json

import pytest

from attnlab.training.config import TrainConfig, apply_overrides, load_config_file


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
])
def test_errors_name_the_field(data, error, match):
    with pytest.raises(error, match=match.replace(".", r"\.")):
        TrainConfig.from_dict(data)


def test_ints_are_accepted_for_floats_and_lists_for_tuples():
    cfg = TrainConfig.from_dict({"optim": {"lr": 1, "betas": [0.9, 0.95]}})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float) and cfg.optim.betas == (0.9, 0.95)


def test_overrides_and_model_config(tmp_path):
    data = apply_overrides({"model": {"preset": "tiny-decoder"}}, [("model.num_layers", 3), ("model.position.scheme", "rotary"),
                                                                   ("optim.lr", 0.5)])
    cfg = TrainConfig.from_dict(data)
    model = cfg.model_config()
    assert model.num_layers == 3 and model.position.scheme == "rotary" and model.position.max_len == 64
    assert cfg.optim.lr == 0.5
    with pytest.raises(ValueError, match="SECTION.FIELD"):
        apply_overrides({}, [("lr", 1)])


def test_yaml_and_json_files(tmp_path):
    (tmp_path / "c.json").write_text('{"optim": {"lr": 0.01}}')
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 0.01\n")
    assert load_config_file(tmp_path / "c.json") == load_config_file(tmp_path / "c.yaml") == {"optim": {"lr": 0.01}}
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        load_config_file(tmp_path / "bad.json")
