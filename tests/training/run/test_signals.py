"""Preemption: SIGTERM and SIGUSR1 (what schedulers send before they kill a job) stop a run like a
first Ctrl-C — the step finishes, a checkpoint is written, `TrainingInterrupted` names the signal
and the exit status 128 + its number — and the resumed run ends bitwise equal to one never
stopped, also when the signal arrives while a checkpoint is being written, or arrives twice. Handlers are put back
after `fit`; a signal the process ignores stays ignored; `train.stop_signals: []` leaves SIGTERM
to its default."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab.cli.main import main
from attnlab.config.validate import ConfigError
from attnlab.io.cache import sha256_file
from attnlab.io.checkpoints import training_state as checkpoint_module
from attnlab.training import TrainConfig, Trainer
from attnlab.training.run import signals as signals_module
from attnlab.training.run.signals import deferred_stop, exit_status
from attnlab.training.run.signals import TrainingInterrupted
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("isolated_cache")
STEPS = dict(max_steps=6, checkpoint_every=100, eval_every=100)  # step 3 is no checkpoint step


def _trainer(folder, **train):
    return Trainer(TrainConfig.from_dict(tiny_config(folder, **{**STEPS, **train})), show_progress=False,
                   log=lambda _: None)


def _same_final_checkpoint(a: Path, b: Path, step: int = 6) -> bool:
    name = f"checkpoints/step-{step:08d}"
    return all(sha256_file(a / name / f) == sha256_file(b / name / f)
               for f in ("model.safetensors", "optimizer.safetensors"))


def _send_at(step, signum):
    def hook(record):
        if record["step"] == step:
            os.kill(os.getpid(), signum)
    return hook


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full")
    old = os.environ.get("ATTNLAB_CACHE")
    os.environ["ATTNLAB_CACHE"] = str(folder / "cache")
    try:
        _trainer(folder).fit()
    finally:
        os.environ.pop("ATTNLAB_CACHE") if old is None else os.environ.__setitem__("ATTNLAB_CACHE", old)
    return folder / "run"


@pytest.mark.parametrize("name,status", [("SIGTERM", 143), ("SIGUSR1", 138), ("SIGINT", 130)])
def test_a_stop_signal_checkpoints_the_step_and_the_resume_is_bitwise(tmp_path, uninterrupted, name, status):
    signum = getattr(signal, name)
    before = signal.getsignal(signum)
    run = _trainer(tmp_path)
    with pytest.raises(TrainingInterrupted) as caught:
        run.fit(on_step=_send_at(3, signum))
    err = caught.value
    assert err.saved and err.step == 3 and err.signal == name and err.exit_status == status
    assert err.checkpoint == run.checkpoint_dir / "step-00000003" and err.checkpoint.is_dir()
    assert (name == "SIGINT" or f"stopped by {name} after step 3" in str(err)) and str(err.checkpoint) in str(err)
    assert signal.getsignal(signum) is before  # the caller's handler is back
    _trainer(tmp_path).fit(resume=True)
    assert _same_final_checkpoint(uninterrupted, run.out)


def test_sigterm_while_a_checkpoint_is_written_finishes_it_then_stops(tmp_path, uninterrupted, monkeypatch):
    """The signal arrives between the weights and the optimizer file of step 4's checkpoint:
    that checkpoint is completed (not left half-written), the run stops there, and resumes exactly."""
    plain = checkpoint_module.write_safetensors
    sent = []

    def write_then_signal(tensors, path, **kwargs):
        plain(tensors, path, **kwargs)
        if path.name == "model.safetensors" and not sent:
            sent.append(path)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(checkpoint_module, "write_safetensors", write_then_signal)
    run = _trainer(tmp_path, checkpoint_every=4)
    with pytest.raises(TrainingInterrupted) as caught:
        run.fit()
    assert sent and caught.value.step == 4 and caught.value.signal == "SIGTERM"
    assert caught.value.checkpoint == run.checkpoint_dir / "step-00000004"
    assert sorted(p.name for p in run.checkpoint_dir.iterdir()) == ["index.json", "step-00000004"]  # no .tmp-*
    monkeypatch.setattr(checkpoint_module, "write_safetensors", plain)
    _trainer(tmp_path, checkpoint_every=4).fit(resume=True)
    assert _same_final_checkpoint(uninterrupted, run.out)


def test_a_repeated_signal_is_one_request_a_later_ctrl_c_stops_at_once(tmp_path, uninterrupted, monkeypatch):
    """SLURM signals every process of a step and torchrun forwards it again: the copies must not cut
    the checkpoint short. A Ctrl-C pressed again later (after REPEAT_S) still stops at once."""
    def thrice(signum):
        def hook(record):
            if record["step"] == 3:
                for _ in range(3):
                    os.kill(os.getpid(), signum)
        return hook

    for name in ("SIGTERM", "SIGINT"):  # a Ctrl-C delivered twice at once (the terminal's group + torchrun)
        run = _trainer(tmp_path / name)
        with pytest.raises(TrainingInterrupted) as caught:
            run.fit(on_step=thrice(getattr(signal, name)))
        assert caught.value.saved and caught.value.step == 3 and caught.value.signal == name
    monkeypatch.setattr(signals_module, "REPEAT_S", 0.0)  # a second press, later
    run = _trainer(tmp_path / "later", checkpoint_every=2)
    with pytest.raises(TrainingInterrupted) as caught:
        run.fit(on_step=thrice(signal.SIGINT))
    assert not caught.value.saved and caught.value.checkpoint == run.checkpoint_dir / "step-00000002"
    assert not (run.checkpoint_dir / "step-00000003").exists()


def test_stop_signals_choose_which_are_handled(tmp_path):
    seen = {}

    def look(record):
        seen[record["step"]] = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR2))

    _trainer(tmp_path / "none", max_steps=3, stop_signals=[]).fit(on_step=look)
    assert seen[1] == (signal.SIG_DFL, signal.SIG_DFL)  # left to the default: the process ends at once
    _trainer(tmp_path / "usr2", max_steps=3, stop_signals=["SIGUSR2"]).fit(on_step=look)
    assert seen[1][0] == signal.SIG_DFL and callable(seen[1][1])
    with pytest.raises(ConfigError, match=r"train.stop_signals\[0\]: 'SIGKILL' is not one of SIGTERM"):
        TrainConfig.from_dict(tiny_config(tmp_path, stop_signals=["SIGKILL"]))


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with deferred_stop(["SIGTERM"]) as request:
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
        assert not request and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_exit_status_is_128_plus_the_signal_number():
    assert exit_status("SIGINT") == 128 + signal.SIGINT == 130
    assert exit_status("SIGTERM") == 128 + signal.SIGTERM
    assert exit_status("SIGUSR1") == 128 + signal.SIGUSR1


def test_sigterm_to_a_background_train_process_checkpoints_prints_the_resume_and_exits_143(tmp_path):
    """The real process, started the way a job script's background job is (SIGINT ignored, so
    Ctrl-C could not stop it), stopped with SIGTERM as a scheduler does; the resume, in-process,
    ends bitwise equal to an uninterrupted run."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps(tiny_config(tmp_path, max_steps=40, checkpoint_every=100, eval_every=100,
                                             log_every=1)))
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731 (a script's `cmd &`)
    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "train", str(config)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ignore_sigint)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("step") or time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    step = int(err.split("stopped by SIGTERM after step ")[1].split(";")[0])
    assert 1 <= step < 40 and (tmp_path / "run" / "checkpoints" / f"step-{step:08d}").is_dir()
    assert f"resume with: attnlab train --resume {tmp_path / 'run'}" in err
    assert main(["train", "--resume", str(tmp_path / "run")]) == 0
    assert main(["train", str(config), "--train.out_dir", str(tmp_path / "full")]) == 0
    assert _same_final_checkpoint(tmp_path / "full", tmp_path / "run", 40)
