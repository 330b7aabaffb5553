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
    return trainer


def held(trainer) -> dict[str, int]:
    """What this rank's model holds: elements of its parameters with data (each tied one once),
    of its optimizer's moments, of the whole model, and of its meta-device parameters; its config."""
    unique = {id(p): p for p in trainer.model.parameters()}.values()
    moments = sum(v.numel() for state in trainer.optimizer.state.values() for v in state.values()
                  if hasattr(v, "numel") and v.dim())
    return {"params": sum(p.numel() for p in unique if not p.is_meta), "moments": moments,
            "whole": sum(p.numel() for p in unique), "meta": sum(p.numel() for p in unique if p.is_meta),
            "model": trainer.model.config.to_dict()}


def fit_on_rank(ctx, *configs: dict) -> None:
    """Train each of `configs` in turn (their parallel sections decide the layouts)."""
    for config in configs:
        _fit(config)


def mesh_suite(ctx, base: dict, folder: str, reference_checkpoint: str) -> dict[str, str]:
    """Train `base` on each layout of LAYOUTS (to OUT = folder/NAME), and resume the one-process
    run's `reference_checkpoint` on tp 2 and pp 2 (to folder/tp2-resumed, pp2-resumed). Returns
    {run: "ok" or traceback, "pp2-held": what the pp 2 rank's model and optimizer hold (`held`)}."""
    results: dict[str, str] = {}
    runs = [(name, layout_config(base, os.path.join(folder, name), parallel), None)
            for name, parallel in LAYOUTS.items()]
    for name in ("tp2", "pp2"):
        runs.append((f"{name}-resumed", layout_config(base, os.path.join(folder, f"{name}-resumed"), LAYOUTS[name]),
                     reference_checkpoint))
    for name, config, resume_from in runs:
        try:
            trainer = _fit(config, resume_from)
            results[name] = "ok"
            if name == "pp2":
                results["pp2-held"] = held(trainer)
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
