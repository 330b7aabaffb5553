"""Process groups shared by the parallel tests: starting 2 processes costs seconds, so each
suite runs once per session and the tests read its results."""

import pytest

from attnlab.parallel import spawn
from tests.parallel.workers import dp_suite, tp_suite

DP_ROWS = 2  # rows per data-parallel rank


@pytest.fixture(scope="session")
def tp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    results = spawn(tp_suite, 2, args=(str(out),), tp=2, timeout_s=150, collective_timeout_s=60)
    return out, results


@pytest.fixture(scope="session")
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    results = spawn(dp_suite, 2, args=(str(out), DP_ROWS), timeout_s=120, collective_timeout_s=60)
    return out, results
