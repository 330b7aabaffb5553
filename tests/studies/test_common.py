"""examples/studies/common.py: the evaluation clock counts the work done in child processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.studies import load_study


def test_cpu_time_counts_a_finished_child_process():
    cpu_time = load_study("translation").cpu_time  # the studies import it from common.py beside them
    own0, total0 = time.process_time(), cpu_time()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    own, total = time.process_time() - own0, cpu_time() - total0
    assert own < 0.2  # this process only waited
    assert total >= 0.4 + own - 0.01  # the child's 0.4 s are counted


def test_positive_int_refuses_zero_negatives_and_words():
    import argparse

    from attnlab.cli.argtypes import positive_int

    assert positive_int("1500") == 1500
    for bad in ("0", "-5", "1.5", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)


def test_a_study_refuses_zero_pretraining_steps_before_doing_anything(tmp_path):
    from tests.studies import STUDIES

    script = STUDIES / "pretraining_pays" / "run.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "out"), "--pretrain-steps", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--pretrain-steps" in done.stderr and "at least 1" in done.stderr
    assert not (tmp_path / "out").exists()


def test_cpu_minutes_are_positive_and_whole_ones_name_their_folder_without_a_point():
    import argparse

    cpu_minutes = load_study("translation").cpu_minutes
    assert cpu_minutes("5") == 5 and isinstance(cpu_minutes("5"), int)  # marks/5min, not marks/5.0min
    assert cpu_minutes("0.5") == 0.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            cpu_minutes(bad)


@pytest.mark.parametrize("name", ["rnn_vs_transformer", "summarisation", "translation"])
def test_every_clock_study_refuses_a_mark_of_zero_minutes(name):
    with pytest.raises(SystemExit):
        load_study(name).parse_args(["--marks", "5", "0"])
    assert load_study(name).parse_args(["--marks", "5", "2.5"]).marks == [5, 2.5]
