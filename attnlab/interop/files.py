"""Reading and writing weight folders safely.

Reading never runs code from a file: `model.safetensors` holds raw tensors, and a
`pytorch_model.bin` (a pickle) goes through `torch.load(..., weights_only=True)`, whose
unpickler builds tensors and plain containers only and refuses any other object — the
`__reduce__` trick that makes a pickle run a command is rejected before it runs.

Writing goes through `atomic_folder`: every file is written into a temporary folder beside
the target, which is renamed into place at the end, so a crash leaves either the old
folder or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

SAFETENSORS = "model.safetensors"
TORCH_BIN = "pytorch_model.bin"


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from a file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or not an object.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, got {type(data).__name__}")
    return data


def read_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """Every tensor of a .safetensors file (on the CPU).

    Raises:
        ValueError: the file is truncated or not a safetensors file (the message names it).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err} (is the file truncated or not a safetensors file?)") from err


def read_torch_bin(path: str | os.PathLike) -> dict[str, Tensor]:
    """A state dict from a PyTorch pickle, through the weights-only unpickler.

    Raises:
        ValueError: the file holds anything besides tensors and containers (refused, never
            run), is truncated, or is not a {name: tensor} dict.
    """
    try:
        data = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if "global" in ln.lower()]
        lines += [ln.strip() for ln in str(err).splitlines() if ln.strip().lower().startswith("unsupported")]
        reason = lines[0] if lines else type(err).__name__
        raise ValueError(f"refusing to load {path}: it holds Python objects other than tensors ({reason}); "
                         "attnlab never unpickles arbitrary objects — convert the file to safetensors with a "
                         "tool you trust") from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err} (is the file truncated?)") from err
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in data.items()):
        raise ValueError(f"{path} should hold a {{name: tensor}} state dict, got {type(data).__name__}")
    return data


def read_weights(folder: str | os.PathLike) -> tuple[dict[str, Tensor], Path]:
    """(tensors, file) of a model folder: `model.safetensors`, else `pytorch_model.bin`.

    Raises:
        FileNotFoundError: neither file is there.
        ValueError: the file cannot be read (see `read_safetensors`, `read_torch_bin`).
    """
    folder = Path(folder)
    if (folder / SAFETENSORS).is_file():
        return read_safetensors(folder / SAFETENSORS), folder / SAFETENSORS
    if (folder / TORCH_BIN).is_file():
        return read_torch_bin(folder / TORCH_BIN), folder / TORCH_BIN
    raise FileNotFoundError(f"{folder} has no {SAFETENSORS} or {TORCH_BIN}")


def write_safetensors(tensors: dict[str, Tensor], path: str | os.PathLike,
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors (each must own its storage: no two names for one tensor)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, os.fspath(path), metadata=metadata)


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; on success it replaces `target`.

    An existing `target` is replaced only if it is empty or a model folder (has a
    config.json), so a typo cannot wipe an unrelated folder. On any error the temporary
    folder is removed and `target` is untouched.

    Raises:
        ValueError: `target` is a file, or a non-empty folder that is not a model folder.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"path: {target} exists and is a file; give a folder path")
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        raise ValueError(f"path: {target} is a non-empty folder without a config.json; refusing to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        yield tmp
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
