"""The on-disk layout of a run's checkpoints, and reading it back verified. Writing them (with
the optimizer and random states) is `attnlab.io.checkpoints.training_state`; reading the layout lives
here so that `attnlab.load(run_folder)` needs nothing from training.

    OUT/config.json                      resolved TrainConfig, seed, versions
    OUT/checkpoints/step-00000200/       one checkpoint, swapped into place when complete
        model.safetensors                weights (tied tensors stored once)
        optimizer.safetensors            optimizer tensors + RNG states
        state.json                       step, schedule, optimizer hyper-parameters, metrics,
                                         sha256 of both files and of OUT/tokenizer.json
    OUT/checkpoints/index.json           {"latest": "step-...", "best": "step-...", "best_metric": ...}
    OUT/tokenizer.json                   the run's tokenizer

A checkpoint is only read whole and as written: `read_state` checks the sha256 of its files and
that OUT/tokenizer.json is still the tokenizer it was trained with (a tokenizer.json copied in
from another run would otherwise turn every id into another token, silently). Checkpoints
written before the tokenizer's hash was recorded load as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnlab.io.cache import sha256_file


TOKENIZER = "tokenizer.json"


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupted or does not fit the model (or its
    run's tokenizer)."""


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

    The run's index.json says which is the latest and the best (a run without validation has
    no best: its latest serves). Without an index, the newest checkpoint folder is taken.

    Args:
        which: "latest" or "best" when `path` is a run or checkpoints folder.

    Raises:
        FileNotFoundError: nothing there.
        CheckpointError: index.json names a checkpoint that is gone (deleted or moved by hand):
            an error rather than another checkpoint in its place, which would give other
            numbers and other text with no sign of it; the message lists those that remain.
    """
    path = Path(path)
    if (path / "state.json").exists():
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    index = read_index(folder)
    role = which if index.get(which) else "latest"
    name = index.get(role)
    found = list_checkpoints(folder)
    if name and (folder / name / "state.json").exists():
        return folder / name
    if name:
        remaining = ", ".join(p.name for p in found) or "none"
        hint = (f"give one of them in place of the run folder ({found[-1]}), or delete {folder / 'index.json'} to "
                "take the newest" if found else "train again, or restore the checkpoint folder")
        raise CheckpointError(f"the {role} checkpoint {folder / name} is missing ({folder / 'index.json'} names it; "
                              f"deleted or moved?); checkpoints there: {remaining}; {hint}")
    if not found:
        raise FileNotFoundError(f"no checkpoint under {str(path)!r} (expected checkpoints/step-*/state.json)")
    return found[-1]


def run_tokenizer(checkpoint: str | os.PathLike) -> Path | None:
    """RUN/tokenizer.json of a checkpoint RUN/checkpoints/step-N/ (None for a checkpoint
    outside a run folder's layout); it may not exist."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent / TOKENIZER if checkpoint.parent.name == "checkpoints" else None


def check_tokenizer(checkpoint: str | os.PathLike, state: dict[str, Any]) -> None:
    """Refuse a run whose tokenizer.json is not the one `checkpoint` was trained with (its
    sha256 is in state.json as `tokenizer_sha256`). Checkpoints without the hash (written
    before it was recorded) and runs without a tokenizer.json pass.

    Raises:
        CheckpointError: naming both files.
    """
    expected = state.get("tokenizer_sha256")
    tokenizer = run_tokenizer(checkpoint)
    if not isinstance(expected, str) or tokenizer is None or not tokenizer.is_file():
        return
    if sha256_file(tokenizer) != expected:
        raise CheckpointError(f"{tokenizer} is not the tokenizer {checkpoint} was trained with (its sha256 differs "
                              f"from the one {Path(checkpoint) / 'state.json'} records): the ids would decode to "
                              "other tokens; put the run's own tokenizer.json back (another run's, or one trained "
                              "again, does not fit)")


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    """state.json of a checkpoint folder, after checking both files' sha256 and the run's
    tokenizer (`check_tokenizer`).

    Raises:
        CheckpointError: a missing file, unreadable JSON, a hash mismatch, or a run's
            tokenizer.json that is not the checkpoint's.
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
    check_tokenizer(path, state)
    return state
