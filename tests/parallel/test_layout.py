"""Layouts that do not fit are refused at config time (attnlab.parallel.layout.check_layout), each
with one error naming the field, the value and the axis; `attnlab train --nproc N` refuses them
before it starts any process."""

import copy
import json

import pytest

from attnlab.config.validate import ConfigError
from attnlab.parallel.layout import check_layout
from attnlab.training import TrainConfig
from tests.training.helpers import tiny_config


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    cfg = tiny_config(tmp_path_factory.mktemp("layout"))
    cfg["model"]["num_layers"] = 2
    return cfg


def _config(base: dict, parallel: dict, **sections) -> TrainConfig:
    cfg = copy.deepcopy(base)
    cfg["parallel"] = parallel
    for section, fields in sections.items():
        cfg[section] = fields if cfg.get(section) is None else {**cfg[section], **fields}
    return TrainConfig.from_dict(cfg)


def test_sizes_follow_the_number_of_processes(base):
    assert check_layout(_config(base, {}), 4) == (1, 1, 4)
    assert check_layout(_config(base, {"tp": 2}), 4) == (2, 1, 2)
    assert check_layout(_config(base, {"tp": 2, "pp": 2}), 8) == (2, 2, 2)
    assert check_layout(_config(base, {"pp": 2, "dp": 2}), 4) == (1, 2, 2)


@pytest.mark.parametrize("parallel, nproc, message", [
    ({"tp": 2}, 1, "parallel: tp=2 must divide the number of processes, 1"),
    ({"tp": 2, "pp": 2}, 6, "tp=2 x pp=2 = 4 must divide the number of processes, 6"),
    ({"tp": 2, "dp": 2}, 2, "the layout tp=2 x pp=1 x dp=2 needs 4 processes, this run has 2"),
    ({"dp": 3}, 2, "needs 3 processes, this run has 2"),
])
def test_sizes_that_do_not_fit_are_refused(base, parallel, nproc, message):
    with pytest.raises(ConfigError, match="^parallel: ") as info:
        check_layout(_config(base, parallel), nproc)
    assert message in str(info.value)


@pytest.mark.parametrize("parallel, sections, message", [
    ({"tp": 2}, {"model": {"num_heads": 1}}, "parallel.tp: 2: num_heads=1 is not divisible by the tensor-parallel "
                                             "size 2"),
    ({"tp": 2}, {"model": {"moe": {"num_experts": 2}}}, "parallel.tp: 2: tensor parallel does not support "
                                                        "moe.num_experts=2"),
    ({"pp": 4}, {}, "parallel.pp: 4: pipeline parallel: pp=4 stages is deeper than the model's num_layers=2"),
    ({"pp": 2}, {"model": {"arch": "rnn_encoder_decoder"}, "data": {"objective": "seq2seq", "source": "de-en"}},
     "parallel.pp: 2: pipeline parallel (pp=2) supports arch decoder, encoder, encoder_decoder, not "
     "arch='rnn_encoder_decoder'"),
    ({"pp": 4}, {"data": {"objective": "seq2seq", "source": "de-en"}, "model": {"num_decoder_layers": 1}},
     "parallel.pp: 4: pipeline parallel: pp=4 stages is deeper than the model's 3 layers"),
    ({"tp": 2}, {"train": {"precision": "fp16"}}, "train.precision: 'fp16' (a loss scaler per rank) is not supported "
                                                  "with parallel.tp=2"),
    ({"pp": 2}, {"lora": {"rank": 2}}, "lora: adapters are not supported with parallel.pp=2"),
    ({"tp": 2, "pp": 2}, {"train": {"compile": True}},
     "train.compile: true is not supported with parallel.tp=2 x pp=2"),
    ({"tp": 2}, {"data": {"objective": "masked_lm", "nsp": True}}, "data.nsp: true is not supported with "
                                                                    "parallel.tp=2"),
    ({"pp": 2}, {"train": {"activation_checkpointing": True}}, "train.activation_checkpointing: true is not "
                                                               "supported with parallel.pp=2"),
    ({"pp": 2}, {"data": {"objective": "seq2seq", "source": "de-en", "batch_tokens": 64}},
     "data.batch_tokens: 64 is not supported with parallel.pp=2: its batches hold a varying number of rows"),
    ({"pp": 2, "micro_batches": 3}, {"train": {"grad_accum": 2}}, "parallel.micro_batches: 3 does not divide the 8 "
                                                                  "rows of a step (data.batch_size=4 x "
                                                                  "train.grad_accum=2)"),
])
def test_what_a_layout_cannot_split_is_refused_by_field_and_axis(base, parallel, sections, message):
    world = parallel.get("tp", 1) * parallel.get("pp", 1)
    with pytest.raises(ConfigError) as info:
        check_layout(_config(base, parallel, **sections), world)
    assert message in str(info.value)


@pytest.mark.parametrize("data", [{"objective": "prefix_lm"}, {"pack": "pad"}, {"pack": "document_masked"},
                                  {"objective": "seq2seq", "source": "de-en"}, {"objective": "encoder_decoder_lm"},
                                  {"objective": "span_corruption"}, {"objective": "pairs_lm", "source": "de-en"}])
def test_every_objective_and_packing_fits_a_pipeline(base, data):
    """Their masks, prefix lengths, document ids and target ids go to every stage."""
    assert check_layout(_config(base, {"pp": 2}, data=data), 4) == (1, 2, 2)
    assert check_layout(_config(base, {"tp": 2, "pp": 2}, data=data), 4) == (2, 2, 1)


def test_a_vocabulary_tp_does_not_divide_is_no_error(base):
    """Tensor parallel pads it (the tokenizer's vocabulary is whatever the data gives)."""
    config = _config(base, {"tp": 4}, model={"vocab_size": 65, "num_heads": 4})
    assert check_layout(config, 4) == (4, 1, 1)


def test_the_config_names_the_schedules_torch_runs():
    from attnlab.parallel.pipeline import SCHEDULES
    from attnlab.training.config import PIPELINE_SCHEDULES

    assert PIPELINE_SCHEDULES == SCHEDULES
    with pytest.raises(ConfigError, match="parallel.schedule: 'zigzag' is not one of gpipe, 1f1b"):
        TrainConfig.from_dict({"parallel": {"schedule": "zigzag"}})


def test_attnlab_train_refuses_a_layout_before_starting_processes(base, tmp_path, capsys):
    from attnlab.cli.main import main

    cfg = copy.deepcopy(base)
    cfg["train"]["out_dir"] = str(tmp_path / "run")
    cfg["parallel"] = {"tp": 2}
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    assert main(["train", str(tmp_path / "run.json"), "--nproc", "3"]) != 0
    out, err = capsys.readouterr()
    assert "parallel: tp=2 must divide the number of processes, 3" in err
    assert "launching" not in out and not (tmp_path / "run").exists()
