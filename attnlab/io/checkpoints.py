"""The on-disk layout of a run's checkpoints, and reading it back verified. Writing them (with
the optimizer and random states) is `attnlab.training.checkpoint`; reading the layout lives
here so that `attnlab.load(run_folder)` needs nothing from training.

    OUT/config.json                      resolved TrainConfig, seed, versions
    OUT/checkpoints/step-00000200/       one checkpoint, swapped into place when complete
        model.safetensors                weights (tied tensors stored once)
        optimizer.safetensors            optimizer tensors + RNG states
        state.json                       step, schedule, optimizer hyper-parameters, metrics,
                                         sha256 of both files
    OUT/checkpoints/index.json           {"latest": "step-...", "best": "step-...", "best_metric": ...}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnlab.io.cache import sha256_file


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupted or does not fit the model."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def read_index(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / "index.json"
    if not path.exists():
        return {}
    try:
        index = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        index = None
    if not isinstance(index, dict):
        raise CheckpointError(f"{path} is corrupted (not a JSON object); delete it to rebuild from the checkpoint "
                              "folders")
    return index


def list_checkpoints(folder: str | os.PathLike) -> list[Path]:
    """Complete checkpoint folders under `folder`, oldest first."""
    folder = Path(folder)
    return sorted(p for p in folder.glob("step-*") if (p / "state.json").exists()) if folder.exists() else []


def resolve_checkpoint(path: str | os.PathLike, which: str = "latest") -> Path:
    """A checkpoint folder from a run folder, a `checkpoints/` folder or a checkpoint itself.

    Args:
        which: "latest" or "best" when `path` is a run or checkpoints folder.

    Raises:
        FileNotFoundError: nothing there.
    """
    path = Path(path)
    if (path / "state.json").exists():
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    index = read_index(folder)
    name = index.get(which) or index.get("latest")
    if name and (folder / name / "state.json").exists():
        return folder / name
    found = list_checkpoints(folder)
    if not found:
        raise FileNotFoundError(f"no checkpoint under {str(path)!r} (expected checkpoints/step-*/state.json)")
    return found[-1]


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """state.json of a checkpoint folder, after checking both files' sha256.

    Raises:
        CheckpointError: a missing file, unreadable JSON or a hash mismatch.
    """
    path = Path(path)
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: state.json is missing; not a complete checkpoint") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path}/state.json is corrupted (not JSON)") from None
    if not isinstance(state, dict) or not isinstance(state.get("sha256", {}), dict):
        raise CheckpointError(f"{path}/state.json is corrupted (expected an object with the files' sha256)")
    for name, expected in state.get("sha256", {}).items():
        file = path / name
        if not file.exists():
            raise CheckpointError(f"{file} is missing")
        if sha256_file(file) != expected:
            raise CheckpointError(f"{file} is corrupted or truncated (sha256 differs from state.json)")
    return state
