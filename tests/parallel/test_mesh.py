"""The 2-D mesh (4 processes: tp = 2 x dp = 2): slow on a 2-core machine, so `make test-slow`."""

import pytest

from attnlab.parallel import spawn
from tests.parallel.workers import mesh_suite


@pytest.mark.slow
def test_tensor_parallel_under_ddp_matches_one_process():
    results = spawn(mesh_suite, 4, args=(2,), tp=2, timeout_s=240, collective_timeout_s=120)
    for rank, checks in enumerate(results):
        assert checks["mesh"] == "ok", f"rank {rank}: {checks['mesh']}"
