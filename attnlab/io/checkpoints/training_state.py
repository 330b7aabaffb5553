"""Training checkpoints: model, optimizer, schedule, RNG states and data position, as
safetensors + JSON (no pickle), written atomically, the last N and the best kept.

Layout of a run folder:

    OUT/config.json                      {"config": the resolved TrainConfig, "model": the built
                                         model's config, seed, precision, versions, command}
    OUT/.attnlab.lock                    while a run writes here (attnlab.io.lock)
    OUT/tokenizer.json
    OUT/checkpoints/step-00000200/       one checkpoint, renamed into place when complete
        model.safetensors                weights (tied tensors stored once)
        optimizer.safetensors            optimizer tensors + RNG states (torch CPU/CUDA, data generator)
        state.json                       step, schedule, optimizer hyper-parameters, metrics,
                                         sha256 of both files and of OUT/tokenizer.json
    OUT/checkpoints/index.json           {"latest": "step-...", "best": "step-...", "best_metric": ...}

A crash while writing leaves a `.tmp-*` folder (ignored and cleaned up next time) and the
previous checkpoints untouched; loading checks every file's sha256, so a truncated or
corrupted checkpoint is a clear `CheckpointError`, never a silent half-load.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model

from attnlab.io.cache import sha256_file
from attnlab.io.checkpoints.layout import TOKENIZER, CheckpointError, checkpoint_name, read_index, read_state
from attnlab.io.files import atomic_folder, atomic_write_json
from attnlab.io.weights import unique_state, write_safetensors


def saved_run_config(data: dict[str, Any]) -> dict[str, Any] | None:
    """The resolved run config inside a run folder's `config.json` (`data`, as read), or None
    when `data` is a run config as a user writes it. The saved file wraps the config (under
    `config`) with what the run recorded beside it, so `attnlab train RUN/config.json` and
    `--resume RUN` rebuild the run from the config alone, every earlier override included."""
    if isinstance(data.get("config"), dict) and "versions" in data:
        return data["config"]
    return None


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors, plain = {}, {"state": {}, "param_groups": state["param_groups"]}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                plain["state"].setdefault(str(index), {})[key] = value
    return tensors, plain


def _restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], plain: dict) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for index, entry in plain["state"].items():
        state.setdefault(int(index), {}).update(entry)
    optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


def rng_state(data_generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Every random state a step depends on: torch's CPU (and CUDA) generators, the data generator."""
    states = {"rng.torch": torch.get_rng_state(), "rng.data": data_generator.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            states[f"rng.cuda.{i}"] = s
    return states


def set_rng_state(tensors: dict[str, torch.Tensor], data_generator: torch.Generator) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    data_generator.set_state(tensors["rng.data"])
    cuda = sorted(k for k in tensors if k.startswith("rng.cuda."))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])


def save_checkpoint(folder: str | os.PathLike, *, step: int, model: torch.nn.Module | None = None,
                    optimizer: torch.optim.Optimizer | None = None, schedule_state: dict,
                    data_generator: torch.Generator, extra: dict[str, Any] | None = None, metric: float | None = None,
                    keep_last: int = 2, files: Callable[[Path], dict] | None = None) -> Path:
    """Write checkpoint `step` under `folder` atomically, update index.json, prune old ones.

    Args:
        folder: the run's `checkpoints/` folder.
        step: optimisation steps done.
        model: the model to save.
        optimizer: the optimizer to save.
        schedule_state: `Schedule.state_dict()`.
        data_generator: the generator that draws batches (its state is the data position).
        extra: JSON-serialisable trainer state (best metric, patience, config, ...).
        metric: validation loss at this step (lower is better), to track the best checkpoint.
        keep_last: how many of the newest checkpoints to keep (the best is kept besides).
        files: instead of `model` and `optimizer`, a function that writes model.safetensors and
            optimizer.safetensors (RNG states included) into the folder it is given and returns the
            optimizer's state for state.json (a pipeline streams its stages' tensors so:
            attnlab.parallel.stage_checkpoint).

    Returns:
        the checkpoint's folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".tmp-*"):  # left by a crash during an earlier write
        shutil.rmtree(stale, ignore_errors=True)
    name = checkpoint_name(step)
    with atomic_folder(folder / name) as tmp:  # renamed into place only when complete
        if files is not None:
            plain = files(tmp)
        else:
            write_safetensors(unique_state(model), tmp / "model.safetensors", metadata={"format": "pt"})
            tensors, plain = _optimizer_tensors(optimizer)
            tensors.update(rng_state(data_generator))
            write_safetensors(tensors, tmp / "optimizer.safetensors")
        state = {"step": step, "schedule": schedule_state, "optimizer": plain, "metric": metric,
                 "extra": extra or {},
                 "sha256": {f: sha256_file(tmp / f) for f in ("model.safetensors", "optimizer.safetensors")}}
        tokenizer = folder.parent / TOKENIZER  # the run's: checked where the checkpoint is read (read_state)
        if tokenizer.is_file():
            state["tokenizer_sha256"] = sha256_file(tokenizer)
        atomic_write_json(tmp / "state.json", state, indent=1)
    index = read_index(folder)
    index["latest"] = name
    if metric is not None and (index.get("best_metric") is None or metric < index["best_metric"]):
        index["best"], index["best_metric"] = name, metric
    atomic_write_json(folder / "index.json", index, indent=1)
    _prune(folder, keep_last, keep={index.get("best"), name})
    return folder / name


def _prune(folder: Path, keep_last: int, keep: set) -> None:
    names = sorted(p.name for p in folder.glob("step-*") if p.is_dir())
    for name in names[:-keep_last] if keep_last else names:
        if name not in keep:
            shutil.rmtree(folder / name, ignore_errors=True)


def load_checkpoint(path: str | os.PathLike, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    data_generator: torch.Generator | None = None) -> dict[str, Any]:
    """Restore a checkpoint into `model` (and `optimizer`, RNG states, data generator).

    Returns:
        the checkpoint's state.json (step, schedule, extra, metric).

    Raises:
        CheckpointError: corrupted files, or weights that do not fit the model.
    """
    path = Path(path)
    state = read_state(path)
    try:
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(f"{path}/model.safetensors cannot be loaded into this model: {err}") from None
    if missing or unexpected:
        raise CheckpointError(f"{path}/model.safetensors does not fit the model: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}")
    if optimizer is not None or data_generator is not None:
        try:
            tensors = load_file(str(path / "optimizer.safetensors"))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{path}/optimizer.safetensors cannot be read: {err}") from None
        if optimizer is not None:
            try:
                _restore_optimizer(optimizer, tensors, state["optimizer"])
            except (ValueError, KeyError, RuntimeError) as err:
                raise CheckpointError(f"{path}: optimizer state does not fit: {err}") from None
        if data_generator is not None:
            set_rng_state(tensors, data_generator)
    return state
