"""`attnlab finetune` and `attnlab predict` end to end on a tiny saved model."""

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch

import attnlab
from attnlab.cli.main import main
from attnlab.tokenizers import Tokenizer
from tests.finetune.helpers import WORDS, colour_rows, tiny, write_csv


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    torch.manual_seed(0)
    tok = Tokenizer.train([WORDS] * 3, kind="wordpiece", vocab_size=60)
    model = tiny("encoder", num_layers=2, vocab_size=tok.vocab_size, type_vocab_size=2)
    attnlab.save(model, root / "base", tokenizer=tok)
    rows = colour_rows(120)
    write_csv(root / "train.csv", ["sentence", "label"], rows[:80])
    write_csv(root / "valid.csv", ["sentence", "label"], rows[80:100])
    write_csv(root / "test.csv", ["sentence", "label"], rows[100:])
    config = {"model": str(root / "base"), "pooling": "mean",
              "data": {"train": str(root / "train.csv"), "valid": str(root / "valid.csv"),
                       "test": str(root / "test.csv"), "text_column": "sentence"},
              "recipe": {"lr": 3e-3, "max_steps": 40, "batch_size": 16, "warmup_ratio": 0.0, "layer_decay": 0.9},
              "seeds": [0, 1], "probe_steps": 5, "keep": 1, "out_dir": str(root / "out")}
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert main(["finetune", str(root / "config.json")]) == 0
    return root, config


def test_finetune_writes_model_labels_summary_and_confusion(setup):
    root, _ = setup
    out = root / "out"
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["labels"] == ["blue", "green", "red"]
    assert summary["test"]["accuracy"] >= 0.9 and summary["test"]["n"] == 20
    assert len(summary["kept"]) == 1 and set(summary["probe"]) == {"0", "1"}
    assert (out / "confusion.png").is_file() and "gold" in (out / "confusion.txt").read_text(encoding="utf-8")
    model, tok = attnlab.load(out / "model", with_tokenizer=True)
    assert model.config.head == "classification" and model.config.num_labels == 3 and tok is not None
    assert json.loads((out / "model" / "labels.json").read_text(encoding="utf-8"))["labels"] == summary["labels"]
    assert len((out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()) == 40


def test_predict_labels_a_file_atomically(setup, tmp_path):
    root, _ = setup
    write_csv(tmp_path / "in.csv", ["sentence"], [["the red cat"], ["a blue dog"], ["sun green moon"]])
    for name in ("out.jsonl", "out.csv"):
        assert main(["predict", str(root / "out" / "model"), "--input", str(tmp_path / "in.csv"),
                     "--text-column", "sentence", "--output", str(tmp_path / name)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["prediction"] for r in rows] == ["red", "blue", "green"]
    assert all(0 < r["score"] <= 1 for r in rows)
    with open(tmp_path / "out.csv", encoding="utf-8") as f:
        assert [r["prediction"] for r in csv.DictReader(f)] == ["red", "blue", "green"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_cli_errors_name_the_column_and_label(setup, tmp_path, capsys):
    root, config = setup
    bad = dict(config, data=dict(config["data"], text_column="text"), out_dir=str(tmp_path / "o"))
    (tmp_path / "bad.json").write_text(json.dumps(bad), encoding="utf-8")
    assert main(["finetune", str(tmp_path / "bad.json")]) == 2
    assert "text_column='text' is not a column" in capsys.readouterr().err
    write_csv(tmp_path / "v.csv", ["sentence", "label"], [["red cat", "red"], ["blue sun", "purple"]])
    bad = dict(config, data=dict(config["data"], valid=str(tmp_path / "v.csv")), out_dir=str(tmp_path / "o"))
    (tmp_path / "bad2.json").write_text(json.dumps(bad), encoding="utf-8")
    assert main(["finetune", str(tmp_path / "bad2.json")]) == 2
    assert "row 3 has label 'purple'" in capsys.readouterr().err
    assert main(["predict", str(root / "out" / "model"), "--input", str(tmp_path / "v.csv"),
                 "--output", str(tmp_path / "p.jsonl")]) == 2
    assert "text_column='text'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def pair_model(setup):
    """A model fine-tuned (two steps) on text pairs: is `text_pair` the colour word of `text`?"""
    root, config = setup
    rows = [(t, t.split()[1] if i % 2 else "moon", "same" if i % 2 else "other") for i, (t, _) in
            enumerate(colour_rows(24))]
    write_csv(root / "pairs_train.csv", ["premise", "hypothesis", "label"], rows[:16])
    write_csv(root / "pairs_valid.csv", ["premise", "hypothesis", "label"], rows[16:])
    pairs = dict(config, data={"train": str(root / "pairs_train.csv"), "valid": str(root / "pairs_valid.csv"),
                               "text_column": "premise", "text_pair_column": "hypothesis"},
                 recipe=dict(config["recipe"], max_steps=2), seeds=[0], probe_steps=0, out_dir=str(root / "pairs"))
    (root / "pairs.json").write_text(json.dumps(pairs), encoding="utf-8")
    assert main(["finetune", str(root / "pairs.json")]) == 0
    return root / "pairs" / "model", rows


def test_predict_refuses_a_pair_model_given_one_text_and_a_text_model_given_pairs(setup, pair_model, tmp_path,
                                                                                   capsys):
    model, rows = pair_model
    write_csv(tmp_path / "in.csv", ["premise", "hypothesis"], [r[:2] for r in rows[:4]])
    predict = ["predict", "--input", str(tmp_path / "in.csv"), "--text-column", "premise"]
    assert main([*predict[:1], str(model), *predict[1:], "--output", str(tmp_path / "one.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab predict: error: {model} was fine-tuned on text pairs (columns 'premise' and "
                          "'hypothesis')") and "--text-pair-column hypothesis" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "one.jsonl").exists()
    assert main([*predict[:1], str(model), *predict[1:], "--text-pair-column", "hypothesis",
                 "--output", str(tmp_path / "two.jsonl")]) == 0
    assert [json.loads(line)["hypothesis"] for line in (tmp_path / "two.jsonl").read_text().splitlines()] == \
        [r[1] for r in rows[:4]]
    single = setup[0] / "out" / "model"  # fine-tuned on the `sentence` column alone
    assert main([*predict[:1], str(single), *predict[1:], "--text-pair-column", "hypothesis",
                 "--output", str(tmp_path / "three.jsonl")]) == 2
    assert "was fine-tuned on single texts (column 'sentence')" in capsys.readouterr().err


def test_intermediate_task_transfer_from_a_finetuned_folder(setup, tmp_path):
    root, config = setup
    rows = [(t, "yes" if "red" in t else "no") for t, _ in colour_rows(40, seed=5)]
    write_csv(tmp_path / "b.csv", ["sentence", "label"], rows)
    b = dict(config, model=str(root / "out" / "model"), seeds=[0], probe_steps=0, keep=1,
             data={"train": str(tmp_path / "b.csv"), "valid": str(tmp_path / "b.csv"), "text_column": "sentence"},
             recipe=dict(config["recipe"], max_steps=2), out_dir=str(tmp_path / "b"))
    (tmp_path / "b.json").write_text(json.dumps(b), encoding="utf-8")
    assert main(["finetune", str(tmp_path / "b.json")]) == 0
    model = attnlab.load(tmp_path / "b" / "model")
    assert model.config.num_labels == 2
    assert json.loads((tmp_path / "b" / "model" / "labels.json").read_text(encoding="utf-8"))["labels"] == ["no", "yes"]


# ---------------------------------------------------------------- the output folder's lifecycle

def _sha(path):
    from attnlab.io.cache import sha256_file

    return sha256_file(path)


def test_a_finished_jobs_folder_is_refused_unless_overwrite(setup, tmp_path, capsys):
    root, _ = setup
    out = tmp_path / "out"
    shutil.copytree(root / "out", out)
    before = _sha(out / "model" / "model.safetensors")
    assert main(["finetune", str(root / "config.json"), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds a fine-tuned model" in err and "--overwrite" in err and "--resume" in err
    assert _sha(out / "model" / "model.safetensors") == before
    assert main(["finetune", str(root / "config.json"), "--out-dir", str(out), "--overwrite", "--resume"]) == 2
    assert "pick one" in capsys.readouterr().err
    assert main(["finetune", str(root / "config.json"), "--out-dir", str(out), "--overwrite", "--max-steps", "6"]) == 0
    assert _sha(out / "model" / "model.safetensors") != before
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["config"]["recipe"]["max_steps"] == 6
    steps = sorted(p.name for p in out.glob("runs/seed-*/checkpoints/step-*"))
    assert steps and all(int(name.split("-")[1]) <= 6 for name in steps)  # the earlier job's step-40 is gone


def test_finetune_into_a_folder_a_live_job_holds_is_refused(setup, tmp_path, capsys):
    root, _ = setup
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / ".attnlab.lock").write_text(json.dumps(
            {"pid": holder.pid, "host": socket.gethostname(), "started": "now", "command": "attnlab finetune a.json"}))
        assert main(["finetune", str(root / "config.json"), "--out-dir", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert f"out_dir='{tmp_path / 'o'}' is in use by another run: PID {holder.pid}" in err
        assert [p.name for p in (tmp_path / "o").iterdir()] == [".attnlab.lock"]
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture(scope="module")
def uninterrupted(setup):
    """The setup job in fp32 (the tests' precision, whatever the CPU), uninterrupted: the reference."""
    root, config = setup
    fp32 = dict(config, recipe=dict(config["recipe"], precision="fp32"), out_dir=str(root / "full"))
    (root / "fp32.json").write_text(json.dumps(fp32), encoding="utf-8")
    assert main(["finetune", str(root / "fp32.json")]) == 0
    return root / "fp32.json", root / "full"


# seed 1 inside its probe (5 steps); seed 0 on its probe's last step, a pause of the sweep: the
# job must stop there, not go on to seed 1
@pytest.mark.parametrize("seed,step", [("seed-1", 3), ("seed-0", 5)])
def test_ctrl_c_exits_130_and_the_resumed_job_equals_the_uninterrupted_one(uninterrupted, tmp_path, capsys,
                                                                          monkeypatch, seed, step):
    from attnlab.training.trainer import Trainer

    config, full = uninterrupted
    plain_step = Trainer._train_step

    def step_then_ctrl_c(self):
        result = plain_step(self)
        if self.step == step - 1 and self.out.parent.parent == tmp_path / "out" and self.out.name == seed:
            os.kill(os.getpid(), signal.SIGINT)  # the real signal, during the step
        return result

    monkeypatch.setattr(Trainer, "_train_step", step_then_ctrl_c)
    command = ["finetune", str(config), "--out-dir", str(tmp_path / "out")]
    assert main(command) == 130
    err = capsys.readouterr().err
    assert f"interrupted after step {step}" in err and f"resume with: attnlab {' '.join(command)} --resume" in err
    runs = tmp_path / "out" / "runs"
    assert (runs / seed / "checkpoints" / f"step-{step:08d}").is_dir()
    assert not (runs / seed / "checkpoints" / f"step-{step + 1:08d}").exists()
    if seed == "seed-0":  # the sweep stopped with it
        assert not any(runs.glob("seed-1/checkpoints/step-*"))
    assert not (tmp_path / "out" / "model").exists() and not (tmp_path / "out" / ".attnlab.lock").exists()
    assert main([*command, "--resume"]) == 0
    b = tmp_path / "out"
    assert _sha(full / "model" / "model.safetensors") == _sha(b / "model" / "model.safetensors")
    assert (full / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    summaries = [json.loads((x / "summary.json").read_text(encoding="utf-8")) for x in (full, b)]
    for key in ("best_seed", "kept", "probe", "final", "valid", "test"):
        assert summaries[0][key] == summaries[1][key], key


def test_resume_without_checkpoints_warns_and_runs_the_job(setup, tmp_path, capsys):
    root, config = setup
    small = dict(config, seeds=[0], probe_steps=0, recipe=dict(config["recipe"], max_steps=2),
                 out_dir=str(tmp_path / "o"))
    (tmp_path / "small.json").write_text(json.dumps(small), encoding="utf-8")
    assert main(["finetune", str(tmp_path / "small.json"), "--resume"]) == 0
    assert "warning: resume:" in capsys.readouterr().err and (tmp_path / "o" / "model").is_dir()
    shutil.rmtree(tmp_path / "o" / "runs")  # a model and nothing to resume: --resume is a fresh job, refused here
    assert main(["finetune", str(tmp_path / "small.json"), "--resume"]) == 2
    assert "already holds a fine-tuned model" in capsys.readouterr().err


def test_finetune_prints_one_setup_line_and_the_config_on_request(setup, tmp_path, capsys):
    root, config = setup
    small = dict(config, recipe=dict(config["recipe"], max_steps=2), seeds=[0], probe_steps=0,
                 out_dir=str(tmp_path / "o"))
    (tmp_path / "c.json").write_text(json.dumps(small), encoding="utf-8")
    assert main(["finetune", str(tmp_path / "c.json"), "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["recipe"]["max_steps"] == 2 and "layer_decay" in printed["recipe"] and printed["head"] == "classification"
    assert not (tmp_path / "o").exists()  # --print-config writes nothing
    assert main(["finetune", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "{" not in out and not any(line.startswith('  "') for line in out), out  # no config dump
    assert out[0] == f"finetune: {root / 'base'} | classification | train {root / 'train.csv'} | 2 steps x 1 seed(s) | out {tmp_path / 'o'}"
