"""A rank that dies mid-run: the survivors stop with an error naming the problem, in time."""

import time

import pytest

from attnlab.parallel import WorkerError, spawn
from tests.parallel.workers import die_mid_run


def test_survivor_exits_with_a_clear_error_within_the_timeout():
    collective_timeout = 5.0
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(die_mid_run, 2, args=(1, 1.0), timeout_s=60, collective_timeout_s=collective_timeout)
    elapsed = time.monotonic() - start
    reports = info.value.reports
    assert "exit code 3" in reports[1]
    assert "CollectiveError" in reports[0] and "another rank probably died" in reports[0], reports[0]
    assert "killed" not in reports[0]  # it ended by itself, not by the deadline
    assert elapsed < 45, f"took {elapsed:.1f} s"


@pytest.mark.slow
def test_survivor_of_a_hung_rank_times_out_with_a_clear_error():
    from tests.parallel.workers import hang_mid_run

    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(hang_mid_run, 2, args=(1, 12.0), timeout_s=60, collective_timeout_s=3.0)
    reports = info.value.reports
    assert reports[1] == "ok"  # the hung rank woke up and finished
    assert "CollectiveError" in reports[0] and "Timed out" in reports[0], reports[0]  # gloo's own timeout
    assert time.monotonic() - start < 40
