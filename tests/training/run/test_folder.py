"""The run folder: one writer, metrics trimmed on resume, a fresh run refuses another's checkpoints."""

import json
import math

import pytest
import torch

from attnlab.training.run.folder import RunFolder


def test_a_rank_that_does_not_write_leaves_nothing(tmp_path):
    folder = RunFolder(tmp_path / "run", writes=False)
    folder.write_config({"train": {"out_dir": "x"}}, {"arch": "decoder"}, seed=0, precision="fp32")
    folder.record({"step": 1, "train_loss": 1.0})
    folder.history["train"].append((1, 1.0))
    folder.plot()
    assert not (tmp_path / "run").exists()


def test_a_resume_drops_the_records_of_later_steps_and_reads_the_kept_losses_back(tmp_path):
    folder = RunFolder(tmp_path, writes=True)
    for step in (1, 2, 3):
        folder.record({"step": step, "train_loss": float(step)})
    folder.record({"step": 2, "val_loss": math.nan})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "train_')  # a line cut by a crash
    again = RunFolder(tmp_path, writes=True)
    again.trim_metrics(2)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 2] and lines[2]["val_loss"] is None
    assert again.history["train"] == [(1, 1.0), (2, 2.0)]
    assert len(again.history["valid"]) == 1 and math.isnan(again.history["valid"][0][1])


def test_a_fresh_start_refuses_checkpoints_and_starts_the_metrics_anew(tmp_path):
    folder = RunFolder(tmp_path, writes=True)
    folder.record({"step": 1, "train_loss": 1.0})
    folder.start(resumed=False)
    assert not (tmp_path / "metrics.jsonl").exists()
    model = torch.nn.Linear(2, 2)
    folder.save(step=1, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), schedule_state={}, data_generator=torch.Generator(), extra={},
                metric=0.5, keep_last=1)
    assert folder.latest() == tmp_path / "checkpoints" / folder.best()
    with pytest.raises(ValueError, match="already holds checkpoints"):
        folder.start(resumed=False)
    folder.start(resumed=True)  # a resume keeps them
