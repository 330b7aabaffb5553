"""Run on each rank by tests/parallel/test_memory_limit.py (module level: spawn pickles it by name):
the Trainer under an operating-system limit on the process's address space (RLIMIT_AS,
`ulimit -v`), set to what the process holds once torch, attnlab and the process group are loaded
plus a budget for the run."""

from __future__ import annotations


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def train_under_limit(ctx, config: dict, budget_bytes: int | None) -> dict:
    """Train `config` (`attnlab train` with the mesh hooks) with the address space limited to this
    process's VmSize now plus `budget_bytes` (None: no limit, to measure). Returns {"outcome":
    "trained" | "refused: MESSAGE" (attnlab's memory check) | "failed: MESSAGE" (an allocation the
    system refused), "baseline" and "peak" (VmSize before, VmPeak after, bytes), "held" (the
    model's parameters with data and all of them, once trained)}."""
    import resource

    from attnlab.config.validate import ConfigError
    from attnlab.parallel.mesh import MeshTraining
    from attnlab.training import TrainConfig, Trainer

    baseline = _status_kib("VmSize") * 1024
    if budget_bytes is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (baseline + budget_bytes, hard))
    held = None
    try:
        trainer = Trainer(TrainConfig.from_dict(config), log=lambda text: None, show_progress=False, mesh=MeshTraining)
        trainer.fit()
        outcome = "trained"
        unique = {id(p): p for p in trainer.model.parameters()}.values()
        held = {"params": sum(p.numel() for p in unique if not p.is_meta), "whole": sum(p.numel() for p in unique)}
    except ConfigError as err:
        outcome = f"refused: {err}"
    except (MemoryError, RuntimeError) as err:  # torch: "DefaultCPUAllocator: can't allocate memory"
        if not isinstance(err, MemoryError) and "alloc" not in str(err).lower():
            raise
        outcome = f"failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return {"outcome": outcome, "baseline": baseline, "peak": _status_kib("VmPeak") * 1024, "held": held}
