"""`Trainer` under data parallel (2 ranks, the torchrun environment variables): it takes exactly
the steps of one process with twice the gradient accumulation, only rank 0 writes, and its
mid-run checkpoint resumes in one process to the same end."""

import copy

import pytest
import torch

import attnlab
from attnlab.parallel import spawn
from attnlab.parallel.launch import pop_nproc, torchrun_command
from attnlab.training import TrainConfig, Trainer
from attnlab.io.checkpoints import checkpoint_name
from tests.parallel.workers import trainer_dp
from tests.training.helpers import tiny_config


def _config(folder, out, grad_accum):
    cfg = tiny_config(folder, out_dir=str(out), max_steps=4, eval_every=4, checkpoint_every=2, grad_accum=grad_accum)
    cfg["model"]["dropout"] = 0.0  # ranks draw dropout masks from their own generators
    return cfg


def _params(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trainer")
    dp_cfg = _config(folder / "data", folder / "dp", grad_accum=1)
    results = spawn(trainer_dp, 2, args=(dp_cfg,), timeout_s=150, collective_timeout_s=60)
    single = Trainer(TrainConfig.from_dict(_config(folder / "data", folder / "single", grad_accum=2)),
                     log=lambda text: None, show_progress=False)
    single.fit()
    return folder, results, single


def test_two_ranks_equal_one_process_with_double_accumulation(runs):
    folder, results, single = runs
    assert results[0]["trainer"] == "ok", results[0]["trainer"]
    assert results[1]["trainer"] == "ok", results[1]["trainer"]
    dp = attnlab.load(folder / "dp" / "final_model").state_dict()
    for name, t in _params(single).items():
        torch.testing.assert_close(dp[name], t, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")
    written = sorted(p.name for p in (folder / "dp" / "checkpoints").iterdir() if p.name.startswith("step"))
    assert written == sorted(p.name for p in (folder / "single" / "checkpoints").iterdir() if p.name.startswith("step"))
    lines = (folder / "dp" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len((folder / "single" / "metrics.jsonl").read_text().splitlines())  # written once


def test_dp_checkpoint_resumes_in_one_process(runs, tmp_path):
    folder, results, single = runs
    assert results[0]["trainer"] == "ok"
    cfg = _config(folder / "data", tmp_path / "resumed", grad_accum=2)
    trainer = Trainer(TrainConfig.from_dict(copy.deepcopy(cfg)), log=lambda text: None, show_progress=False)
    assert trainer.resume(folder / "dp" / "checkpoints" / checkpoint_name(2))
    trainer.fit()
    assert trainer.step == 4
    for name, t in _params(single).items():
        torch.testing.assert_close(_params(trainer)[name], t, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_nproc_flag_is_taken_out_and_becomes_a_torchrun_command():
    assert pop_nproc(["--optim.lr", "1e-3", "--nproc", "2", "--resume"]) == (2, ["--optim.lr", "1e-3", "--resume"])
    assert pop_nproc(["--nproc=4"]) == (4, [])
    with pytest.raises(ValueError, match="--nproc expects a positive integer"):
        pop_nproc(["--nproc", "zero"])
    cmd = torchrun_command(2, ["train", "run.json"])
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[-3:] == ["attnlab.cli.main", "train", "run.json"]


@pytest.mark.slow
def test_attnlab_train_nproc_2_runs_under_torchrun(tmp_path, capsys):
    import json

    from attnlab.cli.main import main

    cfg = _config(tmp_path / "data", tmp_path / "run", grad_accum=1)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    assert main(["train", str(tmp_path / "run.json"), "--nproc", "2"]) == 0
    assert "torch.distributed.run" in capsys.readouterr().out
    assert (tmp_path / "run" / "checkpoints" / checkpoint_name(4)).is_dir()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 4 + 1  # 4 steps + 1 eval, once


def test_sigterm_on_one_rank_stops_every_rank_after_the_same_step_and_resumes_exactly(runs, tmp_path):
    """Rank 1 alone gets SIGTERM in step 3: the ranks agree after the step, both stop there, rank 0
    writes step 3's checkpoint, and one process resumes it to the uninterrupted run's weights."""
    from tests.parallel.workers import trainer_dp_signal

    folder, _, single = runs
    cfg = _config(folder / "data", tmp_path / "dp", grad_accum=1)
    cfg["train"]["checkpoint_every"] = 100
    results = spawn(trainer_dp_signal, 2, args=(cfg, 1, 3), timeout_s=150, collective_timeout_s=60)
    assert [r["step"] for r in results] == [3, 3] and all(r["saved"] for r in results), results
    assert results[0]["checkpoint"] == str(tmp_path / "dp" / "checkpoints" / checkpoint_name(3))
    trainer = Trainer(TrainConfig.from_dict(_config(folder / "data", tmp_path / "one", grad_accum=2)),
                      log=lambda text: None, show_progress=False)
    assert trainer.resume(tmp_path / "dp" / "checkpoints" / checkpoint_name(3))
    trainer.fit()
    for name, t in _params(single).items():
        torch.testing.assert_close(_params(trainer)[name], t, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
def test_sigterm_to_attnlab_train_nproc_2_reaches_every_rank_through_torchrun(tmp_path):
    """SIGTERM to the launching process alone (as Kubernetes or `kill` send it): passed on through
    torchrun to both ranks, which checkpoint the same step; the command exits 143."""
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    cfg = _config(tmp_path / "data", tmp_path / "run", grad_accum=1)
    cfg["train"].update(max_steps=400, checkpoint_every=1000, eval_every=1000, log_every=1)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "ATTNLAB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "train", str(tmp_path / "run.json"), "--nproc",
                             "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)
    for line in proc.stdout:
        if line.startswith("step"):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM after step" in err and "resume with: attnlab train --resume" in err, err[-2000:]
    step = int(err.split("stopped by SIGTERM after step ")[1].split(";")[0])
    assert step < 400 and (tmp_path / "run" / "checkpoints" / checkpoint_name(step)).is_dir()
