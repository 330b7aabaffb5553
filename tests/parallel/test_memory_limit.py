"""Pipeline parallel fits a model that one process cannot: each process's address space limited
by the operating system (RLIMIT_AS, `ulimit -v`) to its VmSize once torch, attnlab and the process
group are loaded plus BUDGET, below what one process needs for the whole model's weights,
gradients and Adam states (16 bytes a parameter: 865 MiB for this 56.7 M-parameter decoder) and
above what each of two stages needs. One process is refused by attnlab's memory check (which reads
the limit), and, with the check off, fails at an allocation the system refuses; two stages train
under the same limit and write a checkpoint, which resumes in one process (no limit). Measured on
2 CPU cores (load about 12): the peak address space above the loaded process, without a limit,
was 1,036 MiB on one process, 682 and 630 MiB on the two stages; slow (about 2 minutes).

glibc gives each thread that allocates its own heap arena, 64 MiB of address space reserved each
(not memory in use): MALLOC_ARENA_MAX=2 keeps the address space close to what is allocated, so
that the limit measures the tensors rather than the threads the process group starts.
"""

import copy

import pytest
import torch
from safetensors.torch import load_file

from attnlab.io.checkpoints import checkpoint_name
from attnlab.parallel import WorkerError, spawn
from attnlab.training import TrainConfig, Trainer
from tests.parallel.memory_limit_workers import train_under_limit
from tests.parallel.mesh_workers import layout_config
from tests.training.helpers import tiny_config

BUDGET = 860 * 2**20
PP2 = {"pp": 2, "micro_batches": 2}


def _base(folder) -> dict:
    cfg = tiny_config(folder, max_steps=2, eval_every=2, eval_batches=1, checkpoint_every=2, log_every=1)
    cfg["schedule"]["warmup_steps"] = 1
    cfg["model"].update(d_model=768, num_layers=8, num_heads=12, d_ff=3072, dropout=0.0)
    return cfg


@pytest.mark.slow
def test_a_model_too_large_for_one_process_trains_on_two_stages_and_resumes_in_one(tmp_path, monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # inherited by the spawned ranks
    base = _base(tmp_path / "data")
    [one] = spawn(train_under_limit, 1, args=(layout_config(base, str(tmp_path / "one"), {}), BUDGET),
                  timeout_s=300, collective_timeout_s=120)
    assert one["outcome"].startswith("refused: model: training it"), one["outcome"]
    assert "the address-space limit, ulimit -v" in one["outcome"]

    unchecked = copy.deepcopy(base)
    unchecked["train"]["check_memory"] = False
    try:
        [alone] = spawn(train_under_limit, 1, args=(layout_config(unchecked, str(tmp_path / "alone"), {}), BUDGET),
                        timeout_s=300, collective_timeout_s=120)
        outcome = alone["outcome"]
    except WorkerError as err:  # killed where the allocation failed outside Python
        outcome = f"failed: {err}"
    assert outcome.startswith("failed:"), outcome

    ranks = spawn(train_under_limit, 2, args=(layout_config(base, str(tmp_path / "pp2"), PP2), BUDGET), pp=2,
                  timeout_s=600, collective_timeout_s=300)
    assert [r["outcome"] for r in ranks] == ["trained", "trained"]
    assert all(r["peak"] - r["baseline"] <= BUDGET for r in ranks)
    assert all(r["held"]["params"] < 0.6 * r["held"]["whole"] for r in ranks)  # each its stage (and the tied table)

    checkpoint = tmp_path / "pp2" / "checkpoints" / checkpoint_name(2)
    longer = copy.deepcopy(base)
    longer["train"]["max_steps"] = 3
    resumed = Trainer(TrainConfig.from_dict(layout_config(longer, str(tmp_path / "resumed"), {})),
                      log=lambda text: None, show_progress=False)
    assert resumed.resume(checkpoint) and resumed.step == 2
    saved = load_file(str(checkpoint / "model.safetensors"))
    for name, tensor in resumed.model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    params = {id(p) for p in resumed.model.parameters()}
    assert {id(p) for p in resumed.optimizer.state} == params  # every parameter's Adam moments came back
    params_total = sum(p.numel() for p in resumed.model.parameters())
    assert 16 * params_total > BUDGET  # one process's weights, gradients and Adam alone pass the limit
    resumed.fit()
    assert resumed.step == 3 and resumed.history["train"][-1][0] == 3
