import json
import re

import pytest

from attnlab import AttentionConfig, ModelConfig, PositionConfig, presets
from attnlab.models.build import HEADS
from attnlab.nn.activations import ACTIVATIONS
from attnlab.nn.kernels import KERNELS
from attnlab.nn.norms import NORMS
from attnlab.nn.positions import POSITION_SCHEMES
from attnlab.nn.scores import SCORES


@pytest.mark.parametrize("name", presets.names())
def test_json_round_trip(name, tmp_path):
    cfg = presets.get(name)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    path = tmp_path / "config.json"
    cfg.to_json(str(path))
    assert ModelConfig.from_dict(json.loads(path.read_text())) == cfg
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


@pytest.mark.parametrize("kwargs, field", [
    (dict(d_model=100, num_heads=3), "num_heads"),
    (dict(position={"scheme": "fourier"}), "position.scheme"),
    (dict(dropout=-0.1), "dropout"),
    (dict(dropout=1.0), "dropout"),
    (dict(arch="rnn"), "arch"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(num_layers=-2), "num_layers"),
    (dict(activation="tanh"), "activation"),
    (dict(norm="batchnorm"), "norm"),
    (dict(norm_placement="middle"), "norm_placement"),
    (dict(attention={"score": "bilinear"}), "attention.score"),
    (dict(attention={"kernel": "flash"}), "attention.kernel"),
    (dict(attention={"num_kv_heads": 3}), "num_kv_heads"),
    (dict(attention={"score": "additive", "kernel": "sdpa"}), "attention.kernel"),
    (dict(attention={"dropout": 2}), "attention.dropout"),
    (dict(position={"scheme": "rotary", "rotary_dim": 7}), "rotary_dim"),
    (dict(position={"scheme": "relative", "relative_max_distance": 0}), "relative_max_distance"),
    (dict(head="mlm"), "head"),
    (dict(pad_token_id=10_000, vocab_size=100), "pad_token_id"),
    (dict(classifier_pooling="max"), "classifier_pooling"),
    (dict(type_vocab_size=-1), "type_vocab_size"),
    (dict(bogus_field=1), "bogus_field"),
    (dict(attention={"heads": 2}), "heads"),
    (dict(position={"sinusoidal_layout": "blocks"}), "position.sinusoidal_layout"),
    (dict(position={"learned_offset": -2}), "position.learned_offset"),
    (dict(lm_head_scale=0.0), "lm_head_scale"),
])
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ModelConfig.from_dict(kwargs)


def test_derived_values():
    cfg = ModelConfig(d_model=64, num_heads=4, norm_placement="pre", attention=AttentionConfig(num_kv_heads=2))
    assert cfg.resolved_head_dim == 16 and cfg.resolved_num_kv_heads == 2
    assert cfg.final_norm is True and cfg.head == "lm"
    assert ModelConfig(arch="encoder").head == "none"
    assert ModelConfig(arch="encoder", head="classification").classifier_pooling == "first"
    assert ModelConfig(arch="decoder", head="classification").classifier_pooling == "last"
    assert ModelConfig(norm_placement="post").final_norm is False


def test_replace_validates_again():
    cfg = presets.get("tiny-decoder")
    assert cfg.replace(d_model=64).d_model == 64
    with pytest.raises(ValueError, match="num_heads"):
        cfg.replace(d_model=30)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'gpt5'"):
        presets.get("gpt5")


def test_position_config_checks_itself():
    with pytest.raises(ValueError, match="position.max_len"):
        PositionConfig(max_len=0)


@pytest.mark.parametrize("kwargs, registry", [
    (dict(attention={"kernel": "?"}), KERNELS),
    (dict(attention={"score": "?"}), SCORES),
    (dict(position={"scheme": "?"}), POSITION_SCHEMES),
    (dict(activation="?"), ACTIVATIONS),
    (dict(norm="?"), NORMS),
    (dict(head="?"), HEADS),
], ids=["kernel", "score", "position", "activation", "norm", "head"])
def test_config_allows_exactly_the_registry_names(kwargs, registry):
    with pytest.raises(ValueError, match="is not one of") as err:
        ModelConfig.from_dict(kwargs)
    assert re.search(r"is not one of (.*)$", str(err.value)).group(1).split(", ") == list(registry)
