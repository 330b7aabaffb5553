"""A run's lifecycle in the Trainer: Ctrl-C saves a checkpoint at a step boundary and the
resumed run ends bitwise equal to one never stopped; a second Ctrl-C stops at once; the run
folder's lock is held while fitting and released on every exit; resume without a checkpoint
warns; a run folder's saved config.json rebuilds the run."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from attnlab.io.cache import sha256_file
from attnlab.io.lock import LOCK_NAME, RunLockedError, read_lock
from attnlab.training import TrainConfig, Trainer
from attnlab.io.checkpoints import saved_run_config
from attnlab.training.run.signals import TrainingInterrupted
from attnlab.training.trainer import NonFiniteLossError
from tests.training.helpers import tiny_config


pytestmark = pytest.mark.usefixtures("isolated_cache")


def _trainer(folder, **train):
    return Trainer(TrainConfig.from_dict(tiny_config(folder, **train)), show_progress=False, log=lambda _: None)


def _ctrl_c_at(step, times=1):
    """An on_step hook that sends this process SIGINT (`times` times) after `step`: the real signal,
    delivered to the handler fit installs."""
    def hook(record):
        if record["step"] == step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
    return hook


def _same_checkpoint(a, b):
    files = ("model.safetensors", "optimizer.safetensors")  # weights; optimizer moments and RNG states
    return all(sha256_file(a / name) == sha256_file(b / name) for name in files)


def test_ctrl_c_saves_at_the_step_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path):
    full = _trainer(tmp_path / "a", max_steps=6, checkpoint_every=100, eval_every=100)
    full.fit()
    handler = signal.getsignal(signal.SIGINT)
    run = _trainer(tmp_path / "b", max_steps=6, checkpoint_every=100, eval_every=100)  # step 3: no checkpoint step
    with pytest.raises(TrainingInterrupted) as caught:
        run.fit(on_step=_ctrl_c_at(3))
    err = caught.value
    assert isinstance(err, KeyboardInterrupt) and err.saved and err.step == 3
    assert err.checkpoint == run.checkpoint_dir / "step-00000003" and err.checkpoint.is_dir()
    assert "step 3" in str(err) and str(err.checkpoint) in str(err)
    assert signal.getsignal(signal.SIGINT) is handler  # the caller's handler is back
    assert not (run.out / LOCK_NAME).exists()
    resumed = _trainer(tmp_path / "b", max_steps=6, checkpoint_every=100, eval_every=100)
    summary = resumed.fit(resume=True)
    assert summary["steps"] == 6
    assert _same_checkpoint(full.checkpoint_dir / "step-00000006", resumed.checkpoint_dir / "step-00000006")
    steps = [json.loads(line)["step"] for line in (resumed.out / "metrics.jsonl").read_text().splitlines()
             if "train_loss" in line]
    assert steps == list(range(1, 7))  # each step logged once, across the interruption


def test_a_second_ctrl_c_stops_at_once_and_names_the_checkpoint_a_resume_uses(tmp_path, monkeypatch):
    from attnlab.training.run import signals

    monkeypatch.setattr(signals, "REPEAT_S", 0.0)  # the second press comes later than a copy of the first would
    run = _trainer(tmp_path, max_steps=8, checkpoint_every=2)
    with pytest.raises(TrainingInterrupted) as caught:
        run.fit(on_step=_ctrl_c_at(3, times=2))  # the second raises inside step 3's bookkeeping
    err = caught.value
    assert not err.saved and err.checkpoint == run.checkpoint_dir / "step-00000002"
    assert "nothing saved" in str(err) and str(err.checkpoint) in str(err)
    assert not (run.checkpoint_dir / "step-00000003").exists()
    assert not (run.out / LOCK_NAME).exists()


def test_ctrl_c_on_the_last_step_is_not_lost(tmp_path):
    """A run that ends in the step Ctrl-C was pressed still reports it (a seed sweep must stop, not
    start the next seed); the run is complete, its final checkpoint saved."""
    run = _trainer(tmp_path, max_steps=3)
    with pytest.raises(TrainingInterrupted) as caught:
        run.fit(on_step=_ctrl_c_at(3))
    assert caught.value.saved and caught.value.checkpoint == run.checkpoint_dir / "step-00000003"
    summary = _trainer(tmp_path, max_steps=3).fit(resume=True)  # nothing left to do
    assert summary["steps"] == 3


def test_resume_without_a_checkpoint_warns_and_starts_from_step_zero(tmp_path):
    run = _trainer(tmp_path, max_steps=3)
    (run.out / "metrics.jsonl").write_text('{"step": 7, "train_loss": 1.0}\n')  # left by a run killed early
    with pytest.warns(UserWarning, match="holds no checkpoint; the run starts from step 0"):
        summary = run.fit(resume=True)
    assert summary["steps"] == 3
    assert [json.loads(x)["step"] for x in (run.out / "metrics.jsonl").read_text().splitlines()][0] == 1


def test_fit_holds_the_folder_lock_and_releases_it_on_an_error(tmp_path):
    run = _trainer(tmp_path, max_steps=3)
    seen = []
    run.fit(on_step=lambda r: seen.append(read_lock(run.out / LOCK_NAME)))
    assert all(h is not None and h["pid"] == os.getpid() for h in seen)
    assert not (run.out / LOCK_NAME).exists()
    failing = _trainer(tmp_path / "nan", max_steps=3)
    failing.model.final_norm.register_forward_hook(lambda m, a, out: out * float("nan"))
    with pytest.raises(NonFiniteLossError):
        failing.fit()
    assert not (failing.out / LOCK_NAME).exists()


def test_fit_in_a_folder_a_live_run_holds_is_refused_and_writes_nothing(tmp_path):
    run = _trainer(tmp_path, max_steps=3)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = {"pid": other.pid, "host": socket.gethostname(), "started": "now", "command": "attnlab train b.json"}
        (run.out / LOCK_NAME).write_text(json.dumps(holder))
        with pytest.raises(RunLockedError, match=f"PID {other.pid}"):
            run.fit()
        assert not (run.out / "config.json").exists() and not run.checkpoint_dir.exists()
        assert read_lock(run.out / LOCK_NAME)["pid"] == other.pid
    finally:
        other.kill()
        other.wait()


def test_the_saved_config_json_rebuilds_the_run(tmp_path):
    run = _trainer(tmp_path, max_steps=3)
    run.fit()
    data = json.loads((run.out / "config.json").read_text())
    assert {"config", "seed", "versions", "command"} <= set(data)  # what the run records beside its config
    rebuilt = TrainConfig.from_dict(saved_run_config(data))
    assert rebuilt == run.config
    assert saved_run_config(tiny_config(tmp_path)) is None  # a config as a user writes it


def test_the_best_evaluation_between_checkpoints_keeps_its_weights(tmp_path):
    """Evaluations every 3 steps, checkpoints every 100: the best evaluation (step 6) falls between
    checkpoints; its weights must still be saved, and best_checkpoint must name them."""
    run = _trainer(tmp_path, max_steps=12, eval_every=3, checkpoint_every=100, keep_last=1)
    scripted = iter([3.0, 2.0, 2.5, 2.6])  # steps 3, 6, 9, 12: the best is not the last
    run.evaluate = lambda: {"val_loss": next(scripted)}
    weights = {}
    run.fit(on_step=lambda r: weights.__setitem__(r["step"], {k: v.clone() for k, v in run.model.state_dict().items()}))
    index = json.loads((run.checkpoint_dir / "index.json").read_text())
    assert index["best"] == "step-00000006" and index["best_metric"] == 2.0
    best = run.checkpoint_dir / index["best"]
    assert json.loads((best / "state.json").read_text())["metric"] == 2.0  # the checkpoint's own record agrees
    from safetensors.torch import load_file
    saved = load_file(best / "model.safetensors")
    assert all(torch.equal(saved[name], weights[6][name]) for name in saved)  # the weights that scored 2.0
    assert sorted(p.name for p in run.checkpoint_dir.glob("step-*")) == ["step-00000006", "step-00000012"]


def test_resume_past_max_steps_is_refused_and_a_complete_run_reports_its_last_loss(tmp_path):
    _trainer(tmp_path, max_steps=4).fit()
    with pytest.raises(ValueError, match=r"train.max_steps=3, but the run in .* is at step 4 already"):
        _trainer(tmp_path, max_steps=3).fit(resume=True)
    lines = []
    done = Trainer(TrainConfig.from_dict(tiny_config(tmp_path, max_steps=4)), show_progress=False, log=lines.append)
    summary = done.fit(resume=True)
    assert summary["steps"] == 4 and summary["train_loss"] == summary["train_loss"]  # not NaN: the last logged
    records = [json.loads(x) for x in (done.out / "metrics.jsonl").read_text().splitlines()]
    assert summary["train_loss"] == [r["train_loss"] for r in records if "train_loss" in r][-1]
    assert any("the run is complete: step 4 of train.max_steps=4" in line for line in lines)


def test_resume_with_a_stretched_cosine_warns_of_the_learning_rate_jump(tmp_path):
    _trainer(tmp_path, max_steps=4).fit()
    with pytest.warns(UserWarning, match=r"train.max_steps 4 -> 8\): the learning rate at step 4 goes from "):
        _trainer(tmp_path, max_steps=8).fit(resume=True)
