"""Data parallel (2 ranks over gloo with DDP, and with FSDP): 2 x batch b == 1 process x batch 2b
for 10 Adam steps, and the checkpoint rank 0 wrote mid-run resumes exactly in one process."""

import pytest
import torch

import attnlab
from attnlab.parallel import ParallelContext, shard_batch
from tests.parallel.helpers import resume_single
from tests.parallel.workers import reference_dp

from tests.parallel.conftest import DP_ROWS as ROWS


def test_two_ranks_match_one_process_with_the_global_batch(dp_run):
    out, results = dp_run
    for rank, checks in enumerate(results):
        assert checks["training"] == "ok", f"rank {rank}: {checks['training']}"
    trained = attnlab.load(out / "dp_step10").state_dict()
    reference = reference_dp(str(out), ROWS)
    for name, t in reference.items():
        torch.testing.assert_close(trained[name], t, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_fsdp_matches_one_process_with_the_global_batch(dp_run):
    out, results = dp_run
    for rank, checks in enumerate(results):
        assert checks["fsdp"] == "ok", f"rank {rank}: {checks['fsdp']}"
    trained = attnlab.load(out / "fsdp_step10").state_dict()
    for name, t in reference_dp(str(out), ROWS).items():
        torch.testing.assert_close(trained[name], t, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_dp_checkpoint_resumes_in_one_process(dp_run):
    out, results = dp_run
    assert results[0]["training"] == "ok"
    resumed = resume_single(out / "dp_step5", first_seed=200, rows=2 * ROWS, ignore_first=False)
    for name, t in attnlab.load(out / "dp_step10").state_dict().items():
        torch.testing.assert_close(resumed[name], t, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_shard_batch_takes_this_ranks_rows_and_refuses_uneven_batches():
    batch = {"input_ids": torch.arange(12).view(6, 2), "n": 3}
    ctx = ParallelContext(rank=1, world_size=2, dp_size=2)
    part = shard_batch(batch, ctx)
    assert part["input_ids"].tolist() == [[6, 7], [8, 9], [10, 11]] and part["n"] == 3
    with pytest.raises(ValueError, match="divisible by the data-parallel size 2"):
        shard_batch(torch.zeros(5, 2), ctx)
