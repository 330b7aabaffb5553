"""Functions run on each rank by tests/parallel/test_mesh.py (module level: spawn pickles them by
name): the Trainer, as `attnlab train --nproc N` runs it, on tensor- and pipeline-parallel layouts."""

from __future__ import annotations

import copy
import os
import traceback

# parallel sections of the runs the tests compare with one process (2 processes each)
LAYOUTS = {
    "tp2": {"tp": 2},
    "pp2": {"pp": 2, "micro_batches": 4, "schedule": "1f1b"},
}


def layout_config(base: dict, out: str, parallel: dict) -> dict:
    """`base` (a run config) writing to `out` with the given `parallel` section."""
    cfg = copy.deepcopy(base)
    cfg["train"]["out_dir"] = out
    cfg["parallel"] = dict(parallel)
    return cfg


def _fit(config: dict, resume_from: str | None = None) -> None:
    from attnlab.parallel.mesh import MeshTraining
    from attnlab.training import TrainConfig, Trainer

    trainer = Trainer(TrainConfig.from_dict(config), log=lambda text: None, show_progress=False, mesh=MeshTraining)
    if resume_from is not None and not trainer.resume(resume_from):
        raise AssertionError(f"nothing to resume at {resume_from}")
    trainer.fit()


def fit_on_rank(ctx, *configs: dict) -> None:
    """Train each of `configs` in turn (their parallel sections decide the layouts)."""
    for config in configs:
        _fit(config)


def mesh_suite(ctx, base: dict, folder: str, reference_checkpoint: str) -> dict[str, str]:
    """Train `base` on each layout of LAYOUTS (to OUT = folder/NAME), and resume the one-process
    run's `reference_checkpoint` on tp 2 (to folder/tp2-resumed). Returns {run: "ok" or traceback}."""
    results: dict[str, str] = {}
    runs = [(name, layout_config(base, os.path.join(folder, name), parallel), None)
            for name, parallel in LAYOUTS.items()]
    runs.append(("tp2-resumed", layout_config(base, os.path.join(folder, "tp2-resumed"), LAYOUTS["tp2"]),
                 reference_checkpoint))
    for name, config, resume_from in runs:
        try:
            _fit(config, resume_from)
            results[name] = "ok"
        except Exception:  # noqa: BLE001 -- reported to the test, which fails on it
            results[name] = traceback.format_exc()
    return results


def die_mid_step(ctx, config: dict, victim: int, step: int) -> str:
    """Train `config`; rank `victim` exits abruptly inside the forward pass of step `step` (its
    pipeline stage's, or the tensor-parallel model's features), after the earlier checkpoints."""
    import torch

    from attnlab.parallel.mesh import MeshTraining
    from attnlab.training import TrainConfig, Trainer

    trainer = Trainer(TrainConfig.from_dict(config), log=lambda text: None, show_progress=False, mesh=MeshTraining)
    module, name = (trainer.mesh.module, "forward") if trainer.mesh.pipelined else (trainer.model, "features")
    forward = getattr(module, name)

    def dying_forward(*args, **kwargs):
        if ctx.rank == victim and trainer.step == step - 1 and torch.is_grad_enabled():  # training, not evaluating
            os._exit(3)
        return forward(*args, **kwargs)

    setattr(module, name, dying_forward)
    trainer.fit()
    return "finished"
