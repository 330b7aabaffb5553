"""Full checkpoints for sharded models: gather on save, shard on load.

A tensor-parallel rank holds chunk r of n of some tensors along one dimension (each sharded
Parameter carries that dimension as `tp_dim`). Saving all-gathers them into the full layout and
rank 0 writes an ordinary `attnlab.save` folder, plus `optimizer.safetensors` (optimizer moments in
the same full layout, keyed `PARAM_NAME/STATE_KEY`). Loading reads that folder whole and splits it
again for any tensor-parallel size, or none: the layout on disk never depends on the run's.

    save_full_checkpoint(model, "ckpt", optimizer=opt)      # every rank calls; rank 0 writes
    model = load_full_checkpoint("ckpt", group=ctx.tp_group) # every rank calls
    load_optimizer_state("ckpt", model, opt)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.io.files import atomic_folder
from attnlab.io.weights import read_safetensors, write_safetensors
from attnlab.parallel.comm import group_rank, group_size
from attnlab.parallel.tensor import gather_full, local_part

OPTIMIZER_FILE = "optimizer.safetensors"


def _full(t: Tensor) -> Tensor:
    """An FSDP (DTensor) shard gathered to the whole tensor; other tensors as they are."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _named_params(model: nn.Module) -> dict[str, nn.Parameter]:
    return dict(model.named_parameters())  # tied parameters under their first name only


def gather_full_state(model: nn.Module, group=None) -> dict[str, Tensor]:
    """The model's state dict in the full (unsharded) layout; every tensor-parallel rank must call.

    Args:
        model: a model, tensor-parallel (`tensor_parallel`) or not, or a part of one (a pipeline stage).
        group (torch.distributed.ProcessGroup | None): the tensor-parallel group; default the model's `tp_group`.

    Returns:
        name -> tensor, each tied tensor under its first name.
    """
    group = group if group is not None else getattr(model, "tp_group", None)
    params = dict(model.named_parameters(remove_duplicate=False))  # every name of a tied parameter
    out: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        p = params.get(name)
        if p is not None and id(p) in seen:
            continue  # the second name of a tied tensor (attnlab.save stores it once too)
        if p is not None:
            seen.add(id(p))
        t = _full(t.detach())
        if p is not None and getattr(p, "tp_dim", None) is not None:
            out[name] = gather_full(t, p, group)
        else:
            out[name] = t.clone()
    return out


def gather_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, group=None) -> dict[str, Tensor]:
    """Optimizer state in the full layout, flat `PARAM_NAME/STATE_KEY` -> tensor (all ranks call);
    `group` as in `gather_full_state`."""
    group = group if group is not None else getattr(model, "tp_group", None)
    out: dict[str, Tensor] = {}
    for name, p in _named_params(model).items():
        for key, value in optimizer.state.get(p, {}).items():
            value = _full(value) if isinstance(value, Tensor) else torch.tensor(value)
            dim = getattr(p, "tp_dim", None)
            if dim is not None and value.shape == _full(p).shape:
                value = gather_full(value.detach(), p, group)
            out[f"{name}/{key}"] = value.detach().clone()
    return out


def load_optimizer_state(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Fill `optimizer` (built over `model`'s parameters) from a full checkpoint's optimizer file,
    taking this rank's chunk of sharded tensors.

    Raises:
        FileNotFoundError: the folder has no optimizer.safetensors.
        ValueError: a state tensor for a parameter the model does not have.
    """
    file = Path(path) / OPTIMIZER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist (was the checkpoint saved with optimizer=...?)")
    flat = read_safetensors(file)
    params = _named_params(model)
    group = getattr(model, "tp_group", None)
    n, r = group_size(group) if getattr(model, "tp_size", 1) > 1 else 1, group_rank(group)
    state: dict[nn.Parameter, dict[str, Tensor]] = {}
    for key, value in flat.items():
        name, _, entry = key.rpartition("/")
        if name not in params:
            raise ValueError(f"{file}: state {key!r} names no parameter of this model")
        p = params[name]
        dim = getattr(p, "tp_dim", None)
        if dim is not None and n > 1 and value.dim() == p.dim() and value.shape != p.shape:
            value = local_part(value, p, n, r).clone()
        state.setdefault(p, {})[entry] = value.to(p.device) if value.dim() else value
    optimizer.state.clear()
    for p, entries in state.items():
        optimizer.state[p] = entries


def save_full_checkpoint(model: nn.Module, path: str | os.PathLike, *, optimizer: torch.optim.Optimizer | None = None,
                         rank: int | None = None) -> Path | None:
    """Write the full-layout checkpoint of a (possibly sharded) model; every rank must call.

    Args:
        model: the model; its `.config` is written as config.json.
        path: the folder (an earlier checkpoint there is replaced atomically).
        optimizer: also write its state in the full layout.
        rank: the global rank; only rank 0 writes (default: torch.distributed's rank, or 0).

    Returns:
        the folder on rank 0, None elsewhere.
    """
    from attnlab.interop.serialization import save
    from attnlab.models import build_model

    state = gather_full_state(model)
    opt_state = gather_optimizer_state(model, optimizer) if optimizer is not None else None
    if rank is None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank != 0:
        return None
    full = build_model(model.config)
    full.load_state_dict(state, strict=False)  # tied names share storage: one copy fills both
    with atomic_folder(path) as tmp:  # the model and its optimizer state are swapped in together
        save(full, tmp)
        if opt_state is not None:
            write_safetensors(opt_state, tmp / OPTIMIZER_FILE)
    return Path(path)


def load_full_checkpoint(path: str | os.PathLike, group=None, *, gather_output: bool = True) -> nn.Module:
    """Load a full checkpoint and shard it over `group` (shard on load); every rank calls.

    Args:
        path: a folder written by `attnlab.save` or `save_full_checkpoint`.
        group (torch.distributed.ProcessGroup | None): the tensor-parallel group; None with one process gives
            the plain model.
        gather_output: as in `tensor_parallel`.

    Returns:
        the model, in train mode.
    """
    from attnlab.interop.serialization import load
    from attnlab.parallel.tensor import tensor_parallel

    model = load(path)
    model.train()
    return tensor_parallel(model, group, gather_output=gather_output)
