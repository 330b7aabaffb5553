"""`attnlab finetune` and `attnlab predict` end to end on a tiny saved model."""

import csv
import json

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
