import json
import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.io.cache import sha256_file
from attnlab.training import NonFiniteLossError, TrainConfig, Trainer
from attnlab.io.checkpoints import resolve_checkpoint
from tests.training.helpers import tiny_config


pytestmark = pytest.mark.usefixtures("isolated_cache")


def _trainer(tmp_path, **train):
    return Trainer(TrainConfig.from_dict(tiny_config(tmp_path, **train)), show_progress=False, log=lambda _: None)


def _params(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_run_writes_metrics_curve_config_and_learns(tmp_path):
    trainer = _trainer(tmp_path, max_steps=30, eval_every=10, log_every=5)
    summary = trainer.fit()
    out = Path(trainer.out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train_loss" in r] == [5, 10, 15, 20, 25, 30]
    assert all(r["tokens_per_s"] > 0 for r in records if "train_loss" in r)
    evals = [r for r in records if "val_loss" in r]
    assert len(evals) == 3 and math.isclose(evals[-1]["val_ppl"], math.exp(evals[-1]["val_loss"]))
    assert summary["val_loss"] < evals[0]["val_loss"] < math.log(trainer.model.config.vocab_size)
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "config.json").read_text())
    assert saved["seed"] == 0 and "torch" in saved["versions"] and saved["config"]["train"]["max_steps"] == 30
    assert (out / "tokenizer.json").exists()


def test_resume_equals_an_uninterrupted_run(tmp_path):
    full = _trainer(tmp_path / "a", max_steps=8, checkpoint_every=100)
    full.fit()
    part = _trainer(tmp_path / "b", max_steps=8, checkpoint_every=3)
    part.fit()
    ckpt = resolve_checkpoint(part.checkpoint_dir / "step-00000006")
    resumed = _trainer(tmp_path / "b", max_steps=8)
    resumed.resume(ckpt)
    assert resumed.step == 6
    resumed.fit()
    for (k, a), b in zip(_params(full.model).items(), _params(resumed.model).values()):
        assert torch.equal(a, b), k


def _run_cli(config_path, *extra, env):
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "train", str(config_path), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[2])


# three CLI processes, so `make test-slow`; test_resume_equals_an_uninterrupted_run and
# test_checkpoint.py's crash-during-write test guard the same in the default suite
@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_is_bitwise_exact(tmp_path):
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    configs = {}
    for name in ("full", "killed"):
        cfg = tiny_config(tmp_path, max_steps=14, checkpoint_every=1, eval_every=5, threads=1)
        cfg["train"]["out_dir"] = str(tmp_path / name)
        configs[name] = tmp_path / f"{name}.json"
        configs[name].write_text(json.dumps(cfg))
    # tokenise once so both runs start from the same cached token files
    Trainer(TrainConfig.from_dict(json.loads(configs["full"].read_text())), show_progress=False, log=lambda _: None)
    kill_at = random.Random(os.getpid()).randint(3, 11)
    full = _run_cli(configs["full"], env=env)
    killed = _run_cli(configs["killed"], env=env)
    for line in killed.stdout:
        if line.startswith("step") and int(line.split()[1].split("/")[0]) >= kill_at:
            killed.send_signal(signal.SIGKILL)
            break
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "checkpoints" / "step-00000014").exists()
    resumed = _run_cli(configs["killed"], "--resume", env=env)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0 and "resumed from" in out
    full.communicate(timeout=300)
    assert full.returncode == 0
    a = tmp_path / "full" / "checkpoints" / "step-00000014"
    b = tmp_path / "killed" / "checkpoints" / "step-00000014"
    assert sha256_file(a / "model.safetensors") == sha256_file(b / "model.safetensors"), f"killed at step {kill_at}"
    assert sha256_file(a / "optimizer.safetensors") == sha256_file(b / "optimizer.safetensors")


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_non_finite_loss_stops_naming_the_step_or_is_skipped(tmp_path, policy):
    trainer = _trainer(tmp_path, max_steps=6, nan_policy=policy)
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == 3 else output

    trainer.model.final_norm.register_forward_hook(poison)
    if policy == "stop":
        with pytest.raises(NonFiniteLossError, match="at step 3"):
            trainer.fit()
        return
    logs = []
    trainer.log = logs.append
    summary = trainer.fit()
    assert summary["steps"] == 6 and math.isfinite(summary["train_loss"])
    assert any("step 3" in line and "skipped" in line for line in logs)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    records = [json.loads(x) for x in (Path(trainer.out) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("skipped")] == [3]


def _strict(name):
    raise AssertionError(f"{name} is not JSON")


def test_a_skipped_steps_nan_loss_is_written_as_null_and_read_back_as_nan(tmp_path):
    trainer = _trainer(tmp_path, max_steps=6, nan_policy="skip")
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == 3 else output

    trainer.model.final_norm.register_forward_hook(poison)
    trainer.fit()
    lines = (Path(trainer.out) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=_strict) for line in lines]  # strict JSON: no NaN
    assert [r["train_loss"] for r in records if r.get("skipped")] == [None]
    again = _trainer(tmp_path, max_steps=8, nan_policy="skip")
    assert again.resume()  # reads metrics.jsonl back (the loss curve's history): null is NaN
    losses = dict(again.history["train"])
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and math.isnan(losses[3]) and math.isfinite(losses[4])
    again.plot()
    assert (Path(trainer.out) / "loss.png").stat().st_size > 0


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    from attnlab.training.tasks.batch_loss import batch_loss

    trainer = _trainer(tmp_path, max_steps=1)
    g = torch.Generator().manual_seed(0)
    batches = [trainer.pipeline.train_batch(g) for _ in range(2)]
    big = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    model = trainer.model
    model.eval()
    model.zero_grad()
    for b in batches:
        (batch_loss(model, b) / 2).backward()
    accumulated = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    batch_loss(model, big).backward()
    for a, b in zip(accumulated, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_early_stopping(tmp_path):
    trainer = _trainer(tmp_path, max_steps=50, eval_every=1, early_stopping_patience=1)
    trainer.config.optim.lr = 0.0  # nothing improves after the first evaluation
    trainer.schedule.base_lr = 0.0
    summary = trainer.fit()
    assert summary["stop_reason"] == "early_stopping" and summary["steps"] == 2


@pytest.mark.parametrize("objective,extra", [
    ("prefix_lm", {}),
    ("masked_lm", {"model": {"preset": "tiny-encoder"}}),
    ("span_corruption", {"model": {"preset": "tiny-encoder-decoder"}}),
])
def test_every_text_objective_trains(tmp_path, objective, extra):
    cfg = tiny_config(tmp_path, max_steps=4, eval_every=4)
    cfg["data"]["objective"] = objective
    cfg["model"].update(extra.get("model", {}))
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    summary = trainer.fit()
    assert math.isfinite(summary["val_loss"]) and summary["steps"] == 4


def test_seq2seq_trains_and_reports_bleu(tmp_path):
    pairs = [(f"the {w} is here .", f"der {w} ist hier .") for w in ("king", "queen", "lord", "sword", "crown")]
    (tmp_path / "p.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs * 20))
    cfg = tiny_config(tmp_path, max_steps=4, eval_every=4, bleu_samples=5, precision="bf16")
    cfg["data"].update(objective="seq2seq", source=str(tmp_path / "p.tsv"), valid=str(tmp_path / "p.tsv"))
    cfg["model"] = {"preset": "tiny-encoder-decoder"}
    summary = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None).fit()
    assert 0.0 <= summary["bleu"] <= 100.0 and 0.0 <= summary["chrf"] <= 100.0


def test_a_fresh_run_refuses_a_folder_with_checkpoints(tmp_path):
    _trainer(tmp_path, max_steps=2).fit()
    with pytest.raises(ValueError, match="--resume"):
        _trainer(tmp_path, max_steps=2).fit()


def test_accumulation_weighs_every_token_equally_however_micro_batches_are_masked(tmp_path):
    """Two micro-batches with 60 and 12 label tokens: the accumulated gradient (and loss) is the
    one big batch's — sum of token losses / 72 — not the mean of the two micro-batch means."""
    from attnlab.nn.losses import IGNORE
    from attnlab.training.tasks.batch_loss import batch_loss

    trainer = _trainer(tmp_path, max_steps=1, grad_accum=2, precision="fp32")  # against an fp32 reference
    g = torch.Generator().manual_seed(0)
    batches = [trainer.pipeline.train_batch(g) for _ in range(2)]
    batches[1]["labels"][:, 3:] = IGNORE  # 4 rows x 3 real tokens against 4 x 16 (minus nothing)
    batches[0]["labels"][0, :4] = IGNORE
    assert [trainer.task.weight(b) for b in batches] == [60, 12]
    big = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    model = trainer.model
    model.eval()  # no dropout: the two paths see the same network
    model.zero_grad()
    loss, _, skipped = trainer.accumulate(batches)
    accumulated = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    reference = batch_loss(model, big)
    reference.backward()
    assert not skipped and loss == pytest.approx(float(reference.detach()), rel=1e-6)
    for a, b in zip(accumulated, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    model.zero_grad()  # the mean of micro-batch means weighs the 12 tokens as much as the 60: another gradient
    for b in batches:
        (batch_loss(model, b) / 2).backward()
    assert not all(torch.allclose(a, p.grad, rtol=1e-3, atol=1e-6) for a, p in zip(accumulated, model.parameters()))


def test_a_time_limited_run_estimates_its_end_from_the_limit(tmp_path):
    lines = []
    cfg = tiny_config(tmp_path, max_steps=10**7, max_minutes=0.03, log_every=1, eval_every=10**7,
                      checkpoint_every=10**7)
    Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lines.append).fit()
    etas = [line.rsplit("ETA ", 1)[1] for line in lines if "ETA " in line]
    assert etas and all(eta.endswith("s") and "h" not in eta for eta in etas), etas  # not 10**7 steps away
    assert all(int(eta.rstrip("s")) <= 2 for eta in etas if "m" not in eta), etas


def test_training_in_chunks_prints_the_setup_once(tmp_path):
    lines = []
    trainer = Trainer(TrainConfig.from_dict(tiny_config(tmp_path, max_steps=6, log_every=1, eval_every=10**7,
                                                        checkpoint_every=10**7)), show_progress=False,
                      log=lines.append)
    for stop in (2, 4, 6):
        trainer.fit(stop_at=stop)
    assert trainer.step == 6
    assert sum(line.startswith("setup:") for line in lines) == 1, lines


@pytest.mark.parametrize("parallel", [{"tp": 2}, {"pp": 2}], ids=["tp2", "pp2"])
def test_a_split_model_needs_the_mesh_hooks(tmp_path, parallel):
    """tp / pp > 1 run through the hooks of attnlab.parallel, which sits above training: given as
    `mesh=`, never imported by the loop, and asked for before anything is prepared."""
    cfg = TrainConfig.from_dict({**tiny_config(tmp_path), "parallel": parallel})
    with pytest.raises(ValueError, match=r"mesh=attnlab\.parallel\.mesh\.MeshTraining"):
        Trainer(cfg, log=lambda text: None, show_progress=False)
    assert not (tmp_path / "run").exists()
