import json
import math

import pytest
import torch
from safetensors.torch import load_file

import attnlab

from attnlab.cli.main import main
from attnlab.cli.train import parse_overrides
from tests.training.helpers import tiny_config


pytestmark = pytest.mark.usefixtures("isolated_cache")


def _config_file(tmp_path, **train):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(tiny_config(tmp_path, **train)))
    return path


def test_parse_overrides():
    overrides, flags = parse_overrides(["--model.num_layers", "4", "--optim.lr=3e-4", "--resume", "--data.source", "x.txt"])
    assert overrides == [("model.num_layers", 4), ("optim.lr", 3e-4), ("data.source", "x.txt")] and flags["resume"]
    with pytest.raises(ValueError, match="overrides look like"):
        parse_overrides(["extra"])
    with pytest.raises(ValueError, match="needs a value"):
        parse_overrides(["--optim.lr"])


def test_train_prints_the_resolved_config_with_overrides(tmp_path, capsys):
    assert main(["train", str(_config_file(tmp_path)), "--model.num_layers", "3", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["model"]["num_layers"] == 3


@pytest.mark.parametrize("override,message", [(["--optim.lrr", "1"], "optim.lrr"),
                                              (["--train.max_steps", "many"], "train.max_steps")])
def test_bad_config_is_a_one_line_error_naming_the_field(tmp_path, capsys, override, message):
    assert main(["train", str(_config_file(tmp_path)), *override]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("attnlab train: error:")


def test_train_then_eval_then_resume_past_the_end(tmp_path, capsys):
    cfg = _config_file(tmp_path, max_steps=6, eval_every=3)
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.split("summary: ")[1])
    assert summary["steps"] == 6
    run = tmp_path / "run"
    assert main(["eval", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert math.isclose(result["val_loss"], summary["best_val_loss"], rel_tol=1e-5)
    assert math.isclose(result["val_ppl"], math.exp(result["val_loss"]), rel_tol=1e-9)
    assert main(["train", str(cfg), "--train.max_steps", "8", "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out
    model, tokenizer = attnlab.load(run, with_tokenizer=True)  # a run folder loads as its best checkpoint
    best = json.loads((run / "checkpoints" / "index.json").read_text())["best"]
    saved = load_file(run / "checkpoints" / best / "model.safetensors")
    assert not model.training and tokenizer is not None
    shared = [name for name in model.state_dict() if name in saved]
    assert len(shared) > 10 and all(torch.equal(saved[n], model.state_dict()[n]) for n in shared)
    (run / "checkpoints" / "step-00000008" / "model.safetensors").write_bytes(b"garbage")
    assert main(["eval", str(run), "--which", "latest"]) == 2
    assert "corrupted" in capsys.readouterr().err


def test_data_list_and_info(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "shakespeare" in out and "de-en" in out and "python-docs" in out
    assert main(["data", "info", "shakespeare"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sha256"] == "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
    assert main(["data", "info", "wikipedia"]) == 2
