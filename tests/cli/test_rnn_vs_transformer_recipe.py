"""examples/rnn_vs_transformer/run_en_de.py: its four run configs are valid, build the models
they name on the same data settings, and (slow) the whole recipe runs end to end on `de-en`."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from attnlab.models import build_model
from attnlab.training import TrainConfig

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "rnn_vs_transformer" / "run_en_de.py"


def _script():
    spec = importlib.util.spec_from_file_location("run_en_de", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_four_configs_share_data_optimiser_and_budget(tmp_path):
    recipe = _script()
    args = argparse.Namespace(steps=600, minutes=None, warmup=200, eval_every=200, bleu_samples=200, seed=0,
                              threads=1, models=["rnn", "lstm", "lstm+attention", "transformer"])
    configs = recipe.model_configs("additive")
    assert list(configs) == args.models
    runs = {name: TrainConfig.from_dict(recipe.run_config(model, tmp_path / name, tmp_path / "tok.json", args))
            for name, model in configs.items()}
    shared = {name: (c.data, c.optim, c.schedule, c.train.max_steps, c.train.bleu_samples) for name, c in runs.items()}
    assert len({repr(v) for v in shared.values()}) == 1  # identical data, optimiser, schedule, budget
    expected = {"rnn": ("rnn", "none"), "lstm": ("lstm", "none"), "lstm+attention": ("lstm", "additive")}
    for name, cfg in runs.items():
        model_cfg = cfg.model_config().replace(vocab_size=8000)
        with torch.device("meta"):
            params = sum(p.numel() for p in build_model(model_cfg).parameters())
        assert 1e6 < params < 1e7  # "a few M"
        if name == "transformer":
            assert model_cfg.arch == "encoder_decoder"
        else:
            assert model_cfg.arch == "rnn_encoder_decoder"
            assert (model_cfg.rnn.cell, model_cfg.rnn.attention) == expected[name]
    minutes = TrainConfig.from_dict(recipe.run_config(configs["rnn"], tmp_path, tmp_path / "t.json",
                                                      argparse.Namespace(**{**vars(args), "minutes": 20.0})))
    assert minutes.train.max_minutes == 5.0  # equal wall-clock: a quarter each


@pytest.mark.slow
def test_the_recipe_runs_end_to_end_on_de_en(tmp_path, monkeypatch):
    recipe = _script()
    monkeypatch.setattr("sys.argv", ["run_en_de.py", "--steps", "6", "--eval-every", "3", "--bleu-samples", "16",
                                     "--warmup", "2", "--out", str(tmp_path)])
    recipe.main()
    report = json.loads((tmp_path / "results.json").read_text())
    assert [r["model"] for r in report["results"]] == ["rnn", "lstm", "lstm+attention", "transformer"]
    assert all(r["steps"] == 6 and 0 <= r["bleu"] <= 100 for r in report["results"])
    for png in ("val_val_loss.png", "val_bleu.png", "gradient_flow.png", "alignment.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
