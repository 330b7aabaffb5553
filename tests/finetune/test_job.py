"""`attnlab finetune` runs on the one training loop: a job killed with SIGKILL at a random point
(a seed's probe, or the kept seed's continuation) and resumed with --resume ends bitwise equal
to an uninterrupted job — weights, metrics and the sweep's scores."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.config import ConfigError, to_dict
from attnlab.finetune.job import FinetuneJobConfig, run_finetune
from attnlab.io.cache import sha256_file
from tests.finetune.helpers import WORDS, colour_rows, tiny, write_csv
from attnlab.tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]


def _job(config_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", "finetune", str(config_path), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _latest_step(folder: Path) -> int:
    steps = [int(p.name.split("-")[1]) for p in folder.glob("checkpoints/step-*")]
    return max(steps, default=0)


def test_sigkill_then_resume_ends_bitwise_equal_to_an_uninterrupted_job(tmp_path):
    tok = Tokenizer.train([WORDS] * 3, kind="char")
    attnlab.save(tiny("encoder", num_layers=2, vocab_size=tok.vocab_size), tmp_path / "base", tokenizer=tok)
    rows = colour_rows(72)
    write_csv(tmp_path / "train.csv", ["text", "label"], rows[:56])
    write_csv(tmp_path / "valid.csv", ["text", "label"], rows[56:])
    configs = {}
    for name in ("full", "killed"):
        config = {"model": str(tmp_path / "base"), "pooling": "mean", "dropout": 0.1,  # dropout: the RNG matters
                  "data": {"train": str(tmp_path / "train.csv"), "valid": str(tmp_path / "valid.csv")},
                  "recipe": {"lr": 3e-3, "max_steps": 14, "batch_size": 6, "grad_accum": 2, "warmup_ratio": 0.2,
                             "checkpoint_every": 1, "precision": "fp32"},  # the killed job runs in a subprocess
                  "seeds": [0, 1], "probe_steps": 4, "keep": 1, "threads": 1, "out_dir": str(tmp_path / name)}
        configs[name] = tmp_path / f"{name}.json"
        configs[name].write_text(json.dumps(config), encoding="utf-8")
    # kill during seed 0's probe, seed 1's probe, or the kept seed's continuation (past the probe)
    seed, at = random.Random(os.getpid()).choice([("seed-0", 2), ("seed-1", 3), ("seed-*", 8)])
    killed = _job(configs["killed"])
    runs = tmp_path / "killed" / "runs"
    deadline = time.monotonic() + 120
    while not any(_latest_step(f) >= at for f in runs.glob(seed)):
        assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read()
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL and not (tmp_path / "killed" / "summary.json").exists()
    resumed = _job(configs["killed"], "--resume")
    threads = torch.get_num_threads()
    try:  # the uninterrupted job, here, while the resumed one runs
        run_finetune(json.loads(configs["full"].read_text(encoding="utf-8")), log=lambda _: None, show_progress=False)
    finally:
        torch.set_num_threads(threads)
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    a, b = tmp_path / "full", tmp_path / "killed"
    where = f"killed at {seed} step {at}"
    assert sha256_file(a / "model" / "model.safetensors") == sha256_file(b / "model" / "model.safetensors"), where
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes(), where
    summaries = [json.loads((x / "summary.json").read_text(encoding="utf-8")) for x in (a, b)]
    for key in ("best_seed", "kept", "probe", "final", "valid"):
        assert summaries[0][key] == summaries[1][key], (key, where)
    assert len((a / "metrics.jsonl").read_text(encoding="utf-8").splitlines()) == 14


def test_a_fresh_job_refuses_an_out_dir_with_checkpoints(tmp_path):
    tok = Tokenizer.train([WORDS] * 3, kind="char")
    attnlab.save(tiny("encoder", num_layers=1, vocab_size=tok.vocab_size), tmp_path / "base", tokenizer=tok)
    write_csv(tmp_path / "d.csv", ["text", "label"], colour_rows(12))
    data = {"train": str(tmp_path / "d.csv"), "valid": str(tmp_path / "d.csv")}
    config = {"model": str(tmp_path / "base"), "data": data,
              "recipe": {"max_steps": 2, "batch_size": 4}, "out_dir": str(tmp_path / "out")}
    run_finetune(config, log=lambda _: None, show_progress=False)
    with pytest.raises(ValueError, match="--resume"):
        run_finetune(config, log=lambda _: None, show_progress=False)
    summary = run_finetune(config, log=lambda _: None, show_progress=False, resume=True)  # nothing left to train
    assert summary["labels"] == ["blue", "green", "red"]


def test_characters_a_char_tokenizer_lacks_are_warned_once_per_data_file(tmp_path):
    tok = Tokenizer.train([WORDS] * 3, kind="char")
    attnlab.save(tiny("encoder", num_layers=1, vocab_size=tok.vocab_size), tmp_path / "base", tokenizer=tok)
    rows = colour_rows(12)
    write_csv(tmp_path / "t.csv", ["text", "label"], rows)
    write_csv(tmp_path / "v.csv", ["text", "label"], [(f"{t} café", y) for t, y in rows[:4]] + rows[4:])
    data = {"train": str(tmp_path / "t.csv"), "valid": str(tmp_path / "v.csv")}
    config = {"model": str(tmp_path / "base"), "data": data,
              "recipe": {"max_steps": 1, "batch_size": 4}, "out_dir": str(tmp_path / "out")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_finetune(config, log=lambda _: None, show_progress=False)
    said = [str(w.message) for w in caught if "character vocabulary" in str(w.message)]
    assert said == [f"{tmp_path / 'v.csv'}: 4 character(s) are not in the character vocabulary and are encoded as "
                    "'<unk>' (1 distinct, most frequent: 'é'); train the tokenizer on text that holds them"]


def _config(**changes):
    return {"model": "minilm", "data": {"train": "t.csv", "valid": "v.csv"}, "out_dir": "out", **changes}


@pytest.mark.parametrize("changes,message", [
    ({"data": {"train": "t.csv"}}, "data.valid: required, not given (a string)"),
    ({"data": {"train": "t.csv", "valid": "v.csv", "tset": "x.csv"}}, "data.tset: unknown data field; allowed: "),
    ({"data": {"train": "t.csv", "valid": "v.csv", "label_column": 3}},
     "data.label_column: expected a string or null, got 3"),
    ({"data": {"train": "t.csv", "valid": "v.csv", "labels": ["a", "a"]}}, "data.labels: expected distinct labels"),
    ({"seedz": [1]}, "seedz: unknown FinetuneJobConfig field; allowed: "),
    ({"recipe": {"precision": "fp8"}}, "recipe.precision: 'fp8' is not one of auto, fp32, bf16, fp16"),
    ({"recipe": {"weight_decay": -0.1}}, "recipe.weight_decay: expected a number >= 0, got -0.1"),
    ({"recipe": {"eps": 0}}, "recipe.eps: expected a number > 0, got 0.0"),
    ({"recipe": {"betas": [0.9, 1.5]}}, "recipe.betas[1]: expected a number in [0, 1), got 1.5"),
    ({"recipe": {"grad_clip": -1}}, "recipe.grad_clip: expected a number >= 0 or null, got -1.0"),
    ({"recipe": {"min_lr_ratio": 2}}, "recipe.min_lr_ratio: expected a number in [0, 1], got 2.0"),
    ({"recipe": {"lr": float("nan")}}, "recipe.lr: expected a finite number, got nan"),
    ({"head": "mlm"}, "head: 'mlm' is not one of classification, regression, token_classification"),
    ({"seeds": [0, 0]}, "seeds: expected a non-empty list of distinct integers"),
    ({"seeds": [0, 1], "keep": 3}, "keep: expected an integer in [1, 2]"),
    ({"probe_steps": 9, "recipe": {"max_steps": 8}}, "probe_steps: expected an integer <= recipe.max_steps (8)"),
    ({"head": "regression", "metric": "accuracy"}, "metric: 'accuracy' is not one of mse"),
])
def test_config_errors_name_the_dotted_field(changes, message):
    with pytest.raises(ConfigError) as err:
        run_finetune(_config(**changes), log=lambda _: None, show_progress=False)
    assert str(err.value).startswith(message)


def test_an_absurd_thread_count_is_refused_on_load():
    # on load, not where the job starts: torch.set_num_threads(100000) crashes the process (SIGSEGV)
    with pytest.raises(ConfigError, match=r"^threads: expected an integer in \[1, 4096\] or null, got 100000$"):
        FinetuneJobConfig.from_dict(_config(threads=100000))


def test_a_job_config_round_trips_and_defaults_its_metric_by_head():
    job = FinetuneJobConfig.from_dict(_config(head="regression", recipe={"lr": 1e-4}))
    assert job.metric == "mse" and job.recipe.lr == 1e-4 and job.data.text_column is None
    assert FinetuneJobConfig.from_dict(to_dict(job)) == job
