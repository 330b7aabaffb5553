"""Tensors to and from safetensors files, and a model's state with its tied tensors named once.

safetensors holds raw tensors and a JSON header, nothing that runs: reading a file never
executes code from it. The one writer below serves `attnlab.save`, training checkpoints and
the Hugging Face export.

Tied tensors (a decoder's output matrix shared with its embedding, an encoder-decoder's
shared vocabulary) have several state-dict names for one parameter. `unique_state` keeps the
first name of each; `load_state` fills every alias from any one of its names, strictly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from attnlab.io.files import as_if_created

if TYPE_CHECKING:  # torch is imported where tensors are handled, so that `import attnlab.io` stays light
    from torch import Tensor, nn

SAFETENSORS = "model.safetensors"


def read_safetensors(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[str, Tensor]:
    """Every tensor of a .safetensors file (on the CPU), or only those named in `names`: the
    others are not read (a pipeline stage reads its own layers from a whole model's file).

    Raises:
        ValueError: the file is truncated or not a safetensors file, or has no tensor of one of
            `names` (the message names the file and the tensor).
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    missing: list[str] = []
    try:
        if names is None:
            return load_file(os.fspath(path), device="cpu")
        with safe_open(os.fspath(path), framework="pt", device="cpu") as f:
            present = set(f.keys())
            missing = [n for n in names if n not in present]
            if not missing:
                return {n: f.get_tensor(n) for n in names}
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err} (is the file truncated or not a safetensors file?)") from err
    raise ValueError(f"{path} has no tensor {missing[0]}")


def safetensors_names(path: str | os.PathLike) -> set[str]:
    """The names of the tensors of a .safetensors file, from its header alone.

    Raises:
        ValueError: the file is truncated or not a safetensors file.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(os.fspath(path), framework="pt", device="cpu") as f:
            return set(f.keys())
    except (SafetensorError, OSError, RuntimeError) as err:
        raise ValueError(f"cannot read {path}: {err} (is the file truncated or not a safetensors file?)") from err


def write_safetensors(tensors: Mapping[str, Tensor], path: str | os.PathLike,
                      metadata: dict[str, str] | None = None) -> None:
    """Write tensors to `path` (on the CPU, contiguous). Each must own its storage: give tied
    tensors once (`unique_state`). Write into a temporary (`atomic_file`, `atomic_folder`)
    when a crash must not leave half a file.

    The file gets the mode of any other file attnlab writes (0666 less the umask): safetensors
    writes through a private temporary of its own (0600), which other users, a group sharing
    the run folder or a web server could not read.

    Raises:
        OSError: the file system refused the write (a full disk, an I/O error): the error names
            `path` (safetensors' own error names neither the file nor, to Python, the errno).
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, os.fspath(path), metadata=metadata)
    except SafetensorError as err:
        code = _os_error_code(str(err))
        if code is None:
            raise
        raise OSError(code, os.strerror(code), os.fspath(path)) from err
    as_if_created(path)


def _os_error_code(message: str) -> int | None:
    """The errno in a message of safetensors' Rust writer: `... I/O error: No space left on
    device (os error 28)` -> 28; None when it holds none."""
    found = re.search(r"\(os error (\d+)\)", message)
    return int(found.group(1)) if found else None


def alias_groups(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """state-dict name -> every name of the same parameter (a tied tensor has several)."""
    by_param: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(p), []).append(name)
    groups: dict[str, tuple[str, ...]] = {}
    for names in by_param.values():
        for n in names:
            groups[n] = tuple(names)
    return groups


def unique_state(model: nn.Module) -> dict[str, Tensor]:
    """`model.state_dict()` with each tied tensor under its first name only."""
    groups = alias_groups(model)
    return {name: tensor for name, tensor in model.state_dict().items() if groups.get(name, (name,))[0] == name}


def upgraded(model: nn.Module, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """`state` with the names of older checkpoints renamed by the modules whose layout changed
    since (each such module has `upgrade_state(state, prefix)`, also applied by load_state_dict)."""
    state = dict(state)
    for prefix, module in model.named_modules():
        upgrade = getattr(module, "upgrade_state", None)
        if upgrade is not None:
            upgrade(state, f"{prefix}." if prefix else "")
    return state


def load_state(model: nn.Module, state: Mapping[str, Tensor], *, source: str = "the weights") -> nn.Module:
    """Copy `state` into `model`, strictly: every tensor present once (ties: any one name),
    no extra names, matching shapes. The model is changed only if everything checks.

    Raises:
        ValueError: naming the missing, unexpected or mis-shaped tensor and `source`.
    """
    import torch

    state = upgraded(model, state)
    expected = model.state_dict(keep_vars=True)
    groups = alias_groups(model)
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"unexpected tensor(s) in {source}: {', '.join(unexpected[:8])}")
    plan: dict[str, Tensor] = {}
    missing = []
    for name, target in expected.items():
        names = groups.get(name, (name,))
        given = [n for n in names if n in state]
        if not given:
            missing.append(name)
            continue
        value = state[given[0]]
        for other in given[1:]:
            if state[other].shape != value.shape or not torch.equal(state[other], value):
                raise ValueError(f"{source}: {given[0]} and {other} are one tied tensor in this model but differ")
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"shape mismatch for {given[0]} in {source}: expected {tuple(target.shape)}, "
                             f"got {tuple(value.shape)}")
        plan[name] = value
    if missing:
        raise ValueError(f"missing tensor(s) in {source}: {', '.join(missing[:8])}"
                         + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    with torch.no_grad():
        for name, value in plan.items():
            expected[name].copy_(value)
    return model
