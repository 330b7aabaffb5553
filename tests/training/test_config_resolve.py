"""What data.objective implies for the model is applied once, reported, and never overwrites a
field the user set (attnlab.training.config_resolve, TrainConfig.resolve)."""

import json
import warnings

import pytest

from attnlab import presets
from attnlab.config import ConfigError, ModelConfig
from attnlab.training.config import TrainConfig, apply_overrides
from attnlab.training.config_resolve import Implied

MLM = {"model": {"preset": "tiny-decoder"}, "data": {"objective": "masked_lm"}}


def _fields(resolved):
    return {i.field: i.value for i in resolved.implied}


def test_what_the_objective_implies_is_applied_and_reported():
    resolved = TrainConfig.resolve(MLM, [("data.nsp", True)])
    m = resolved.config.model
    assert (m.arch, m.head, m.type_vocab_size, m.pooler, m.nsp_head) == ("encoder", "mlm", 2, True, True)
    assert _fields(resolved) == {"model.arch": "encoder", "model.head": "mlm", "model.type_vocab_size": 2,
                                 "model.pooler": True, "model.nsp_head": True}
    causes = {i.field: i.cause for i in resolved.implied}
    assert causes["model.arch"] == "data.objective='masked_lm'" and causes["model.pooler"] == "data.nsp=true"
    assert str(Implied("model.arch", "encoder", "data.objective='masked_lm'")) == \
        "model.arch: encoder (data.objective='masked_lm' implies it)"
    assert str(Implied("model.pooler", True, "data.nsp=true")) == "model.pooler: true (data.nsp=true implies it)"
    # the same config as from_dict builds: one path, the report beside it
    assert resolved.config == TrainConfig.from_dict({**MLM, "data": {"objective": "masked_lm", "nsp": True}})


def test_only_values_that_change_are_reported():
    assert TrainConfig.resolve({"model": {"preset": "tiny-decoder"}}).implied == ()  # a decoder already
    sbo = TrainConfig.resolve({"model": {"preset": "tiny-encoder"},
                               "data": {"objective": "span_masked_lm", "span_boundary": True}})
    assert _fields(sbo) == {"model.head": "mlm", "model.sbo_head": True}
    # a value the user wrote that agrees with the objective: kept, nothing to report for it
    agreed = TrainConfig.resolve({"model": {"preset": "tiny-decoder", "arch": "encoder"},
                                  "data": {"objective": "masked_lm"}})
    assert _fields(agreed) == {"model.head": "mlm"}
    # a saved run's config.json holds the resolved section: nothing implied a second time
    assert TrainConfig.resolve(agreed.config.to_dict()).implied == ()


@pytest.mark.parametrize("data, overrides, match", [
    ({"model": {"preset": "tiny-decoder", "arch": "decoder"}, "data": {"objective": "masked_lm"}}, [],
     r"^model\.arch: 'decoder' conflicts with data\.objective='masked_lm', which needs model\.arch='encoder'"),
    (MLM, [("model.arch", "decoder")], r"^model\.arch: 'decoder' conflicts with data\.objective='masked_lm'"),
    ({"model": {"arch": "encoder"}}, [], r"^model\.arch: 'encoder' conflicts with data\.objective='causal_lm'"),
    (MLM, [("model.head", "classification")], r"^model\.head: 'classification' conflicts with data\.objective"),
    (MLM, [("data.nsp", True), ("model.pooler", False)],
     r"^model\.pooler: false conflicts with data\.nsp=true, which needs model\.pooler=true"),
    ({"model": {"preset": "tiny-encoder", "sbo_head": False},
      "data": {"objective": "span_masked_lm", "span_boundary": True}}, [],
     r"^model\.sbo_head: false conflicts with data\.span_boundary=true"),
])
def test_a_field_the_user_set_is_never_overwritten(data, overrides, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig.resolve(data, overrides)
    with pytest.raises(ConfigError, match=match):  # from_dict is the same path
        TrainConfig.from_dict(apply_overrides(data, overrides))


def test_a_preset_value_is_not_the_users():
    # tiny-decoder's arch is the preset's: under masked_lm it is an encoder, and linformer fits it
    resolved = TrainConfig.resolve({"model": {"preset": "tiny-decoder", "attention": {"kernel": "linformer"}},
                                    "data": {"objective": "masked_lm"}})
    assert resolved.config.model.arch == "encoder" and "model.arch" in _fields(resolved)


def test_a_kernel_that_cannot_run_the_implied_stack_names_the_objective():
    linformer = {"preset": "tiny-decoder", "attention": {"kernel": "linformer"}}
    with pytest.raises(ConfigError, match=r"^model\.attention\.kernel: 'linformer' is bidirectional only, and "
                                          r"data\.objective='causal_lm' trains a decoder-only model"):
        TrainConfig.resolve({"model": linformer})
    with pytest.raises(ConfigError, match=r"data\.objective='seq2seq' trains an encoder-decoder model"):
        TrainConfig.resolve({"model": linformer, "data": {"objective": "seq2seq"}})
    # an arch the user wrote: the model's own check names it
    with pytest.raises(ConfigError, match=r"^model\.attention\.kernel: 'linformer' is bidirectional only: it needs "
                                          r"arch='encoder'"):
        TrainConfig.resolve({"model": {**linformer, "arch": "decoder"}})


def test_a_model_folders_fields_are_not_the_users(tmp_path):
    """init_from: the folder decides the model; the objective's head replaces the folder's, reported."""
    import attnlab
    from attnlab.models import build_model
    from attnlab.tokenizers import Tokenizer
    from attnlab.training.setup.start import read_init_from, resolve_init_from

    encoder = presets.get("tiny-encoder", vocab_size=40)
    assert encoder.head == "none"
    attnlab.save(build_model(encoder), tmp_path / "enc", tokenizer=Tokenizer.train(["ab ba"], kind="char"))
    cfg = TrainConfig.from_dict({"model": {"init_from": str(tmp_path / "enc")}, "data": {"objective": "masked_lm",
                                                                                         "seq_len": 32}})
    resolved = read_init_from(cfg)
    assert _fields(resolved) == {"model.head": "mlm"}
    assert resolved.config.model_config() == encoder.replace(head="mlm")
    assert resolve_init_from(cfg) == resolved.config


def test_the_command_line_prints_what_was_implied(tmp_path, capsys):
    from attnlab.cli.main import main

    (tmp_path / "run.json").write_text(json.dumps({**MLM, "train": {"out_dir": str(tmp_path / "out")}}))
    assert main(["train", str(tmp_path / "run.json"), "--data.nsp", "true", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["model"]["arch"] == "encoder"  # stdout stays the config alone
    assert "implied: model.arch: encoder (data.objective='masked_lm' implies it)" in err.splitlines()
    assert "implied: model.nsp_head: true (data.nsp=true implies it)" in err.splitlines()
    assert main(["train", str(tmp_path / "run.json"), "--model.arch", "decoder", "--print-config"]) == 2
    assert "attnlab train: error: model.arch: 'decoder' conflicts with data.objective='masked_lm'" in \
        capsys.readouterr().err


def test_the_model_section_is_validated_once_on_its_way_to_the_model(monkeypatch):
    """TrainConfig.model_config() copies the section validated on load; with the tokenizer's
    changes it validates the result once (it re-ran ModelConfig.__post_init__ each time)."""
    cfg = TrainConfig.from_dict({"model": {"preset": "tiny-decoder", "num_layers": 3}})
    calls = []
    original = ModelConfig.__post_init__
    monkeypatch.setattr(ModelConfig, "__post_init__", lambda self: (calls.append(1), original(self))[1])
    plain = cfg.model_config()
    assert calls == [] and type(plain) is ModelConfig
    assert plain == ModelConfig.from_dict({k: v for k, v in cfg.model.to_dict().items()
                                           if k not in ("init_from", "add_special_tokens")})
    plain.attention.dropout = 0.5  # a copy: the run's section is left as it was
    assert cfg.model.attention.dropout == 0.0
    calls.clear()
    built = cfg.model_config(vocab_size=90, pad_token_id=3)
    assert len(calls) == 1 and (built.vocab_size, built.pad_token_id, built.num_layers) == (90, 3, 3)
    with pytest.raises(ConfigError, match=r"pad_token_id: 95 is outside the vocabulary \[0, 90\)"):
        cfg.model_config(vocab_size=90, pad_token_id=95)


def test_a_model_built_in_python_is_changed_with_a_warning():
    with pytest.warns(UserWarning, match=r"model\.arch: decoder \(data\.objective='causal_lm' implies it\); "
                                         r"model\.head: lm .*the model given to TrainConfig is changed") as seen:
        typed = TrainConfig(model=presets.get("tiny-encoder"))
    assert typed.model.arch == "decoder" and seen[0].filename == __file__  # the warning points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a model that already fits: nothing to say
        TrainConfig(model=presets.get("tiny-decoder"))


def test_a_field_written_as_null_is_left_to_the_data():
    resolved = TrainConfig.resolve({"model": {"preset": "tiny-decoder", "head": None}, "data": {"objective": "masked_lm"}})
    assert resolved.config.model.head == "mlm" and "model.head" in _fields(resolved)
