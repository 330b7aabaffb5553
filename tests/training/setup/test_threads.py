"""Thread counts (attnlab.training.setup.threads): more than the CPUs is capped with a warning naming
the field, an absurd count never reaches torch (torch.set_num_threads(100000) crashes the
process at its first parallel region)."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from attnlab.config.validate import ConfigError
from attnlab.training import TrainConfig, Trainer
from attnlab.training.setup.threads import MAX_THREADS, capped_threads, set_threads, usable_cpus
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("isolated_cache")  # restores torch's thread count


def test_usable_cpus_are_those_of_the_affinity_mask(monkeypatch):
    assert usable_cpus() == len(os.sched_getaffinity(0)) <= os.cpu_count()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})  # `taskset -c 3`, a container's cpuset
    assert usable_cpus() == 1
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS, Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cpus() == 6


def test_more_threads_than_cpus_are_capped_with_a_warning_naming_field_asked_and_used():
    cpus = usable_cpus()
    with pytest.warns(UserWarning, match=rf"^train\.threads={cpus + 5} is more than the {cpus} CPU\(s\) this process "
                                         rf"may run on; using {cpus} threads$"):
        assert capped_threads("train.threads", cpus + 5) == cpus
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning within the CPUs
        assert capped_threads("train.threads", cpus) == cpus


def test_an_absurd_count_is_refused_before_torch_sees_it(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    for bad in (0, MAX_THREADS + 1, 100_000, 2.5):
        with pytest.raises(ConfigError, match=r"^threads: expected an integer in \[1, 4096\]"):
            set_threads("threads", bad)
    set_threads("threads", None)  # torch's own choice: left alone
    assert seen == []
    set_threads("threads", 1)
    assert seen == [1]


def test_the_trainer_caps_train_threads_to_the_cpus(tmp_path):
    cpus = usable_cpus()
    config = TrainConfig.from_dict(tiny_config(tmp_path, threads=cpus + 3))
    with pytest.warns(UserWarning, match=rf"train\.threads={cpus + 3} is more than the {cpus} CPU"):
        Trainer(config, show_progress=False, log=lambda _: None)
    assert torch.get_num_threads() == cpus


def test_train_threads_100000_is_a_one_line_error_not_a_crash(tmp_path):
    """The issue's command, in a process of its own: it used to end in SIGSEGV."""
    config = tmp_path / "run.json"
    config.write_text(__import__("json").dumps(tiny_config(tmp_path)))
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-m", "attnlab.cli.main", "train", str(config), "--train.threads", "100000"],
                          capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root), "ATTNLAB_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("attnlab train: error: train.threads: expected an integer in [1, 4096] or null, "
                                   "got 100000")
