"""A pipeline stage's share of a training checkpoint in the full layout (the files a one-process
run writes, `attnlab.io.checkpoints.save_checkpoint`), without any rank holding the whole model:

    save   every stage sends its own tensors, one at a time, to rank 0, which streams them into
           model.safetensors and optimizer.safetensors (`write_pipeline_files`): rank 0 holds its
           stage and one other tensor at a time, never the whole model
    load   each stage reads its own tensors by name from the two files (`read_checkpoint_part`)

A tensor several stages hold (the tied embedding and LM head, the T5 bias table) is stored once,
under its first name in the whole model, sent by the first stage holding it. In the optimizer
file, `optimizer.{i}.{key}` numbers the parameters in the order of the whole model's optimizer
(`attnlab.training.optim.decay_groups`), as a one-process run numbers them.

safetensors layout (what `write_pipeline_files` streams): 8 bytes, the little-endian length of a
JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
padded with spaces to a multiple of 8; then the tensors' bytes, back to back, in the header's order.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from attnlab.io.files import as_if_created
from attnlab.parallel.stages import StageModule

OPTIMIZER_FILE = "optimizer.safetensors"
WEIGHTS_FILE = "model.safetensors"
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}


def optimizer_order(model: nn.Module, weight_decay: float) -> list[str]:
    """The name of each parameter of the whole model's optimizer, in its order (`decay_groups`,
    empty groups left out as `build_optimizer` leaves them out)."""
    from attnlab.training.optim import decay_groups

    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for g in decay_groups(model, weight_decay) if g["params"] for p in g["params"]]


def _stream_safetensors(path: Path, entries: list[tuple[str, tuple[int, ...], str]],
                        tensor_of: Callable[[str], Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file of `entries` (name, shape, dtype name), in that order, asking
    `tensor_of(name)` for each tensor only when its bytes are written."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, shape, dtype in entries:
        size = _BY_NAME[dtype].itemsize * int(torch.Size(shape).numel())
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, dtype in entries:
            t = tensor_of(name).detach().cpu().contiguous()
            if tuple(t.shape) != tuple(shape) or DTYPES[t.dtype] != dtype:
                raise RuntimeError(f"{name}: sent {tuple(t.shape)} {t.dtype}, announced {tuple(shape)} {dtype}")
            f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    as_if_created(path)


class StageShare:
    """What stage `index` of `num_stages` writes of the checkpoint: the weights and optimizer
    entries it is the first holder of, by their names in the files."""

    def __init__(self, model: nn.Module, index: int, num_stages: int, optimizer: torch.optim.Optimizer,
                 weight_decay: float):
        from attnlab.io.weights import alias_groups

        aliases = alias_groups(model)
        stages = [set(StageModule(model, s, num_stages).state_dict(keep_vars=True)) for s in range(num_stages)]
        module_state = StageModule(model, index, num_stages).state_dict(keep_vars=True)
        self.weights: dict[str, Tensor] = {}
        for name in model.state_dict(keep_vars=True):
            group = aliases.get(name, (name,))
            if group[0] != name:
                continue  # a tied tensor's other name: stored once, under its first
            holders = [s for s in range(num_stages) if any(n in stages[s] for n in group)]
            if holders and holders[0] == index:
                self.weights[name] = next(module_state[n] for n in group if n in module_state)
        params = dict(model.named_parameters())
        order = optimizer_order(model, weight_decay)
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.moments: dict[str, Tensor] = {}
        self.plain: dict[str, dict[str, Any]] = {}
        for i, name in enumerate(order):
            if name not in self.weights or id(params[name]) not in own:
                continue  # another stage's, or a shared one written by its first holder
            for key, value in optimizer.state.get(params[name], {}).items():
                if isinstance(value, Tensor):
                    self.moments[f"optimizer.{i}.{key}"] = value
                else:
                    self.plain.setdefault(str(i), {})[key] = value

    def announce(self) -> tuple[list, list, dict]:
        """(weights, moments) as (name, shape, dtype name) and the plain optimizer entries."""
        def spec(tensors: dict[str, Tensor]) -> list:
            return [(n, tuple(t.shape), DTYPES[t.dtype]) for n, t in sorted(tensors.items())]

        return spec(self.weights), spec(self.moments), self.plain

    def send(self, group: dist.ProcessGroup | None, dst: int) -> None:
        """Send every tensor this stage writes to stage `dst` (rank 0), one at a time, in the order
        the writer asks for them (the model file's, then the optimizer file's, each by name)."""
        for tensors in (self.weights, self.moments):
            for name in sorted(tensors):
                dist.send(tensors[name].detach().contiguous(), group_dst=dst, group=group)


def write_pipeline_files(folder: Path | None, share: StageShare, group: dist.ProcessGroup | None, index: int,
                         num_stages: int, *, param_groups: list[dict[str, Any]] | None = None,
                         rng: dict[str, Tensor] | None = None, device: torch.device | None = None
                         ) -> dict[str, Any] | None:
    """Every stage of a pipeline (its first data-parallel replica) calls: stage 0 (rank 0) streams
    model.safetensors and optimizer.safetensors into `folder` from its own share and the tensors
    the other stages send, one at a time (`StageShare.send`). Stage 0 gives `param_groups`
    (`full_param_groups`), `rng` (the RNG states, `rng_state`) and `device` (where its tensors
    are, for receiving), and gets the optimizer's plain state for state.json; the others None."""
    announced: list[Any] | None = [None] * num_stages if index == 0 else None
    dist.gather_object(share.announce(), announced, group_dst=0, group=group)
    if index != 0:
        share.send(group, 0)
        return None
    for which, file, metadata in ((0, WEIGHTS_FILE, {"format": "pt"}), (1, OPTIMIZER_FILE, None)):
        holder = {name: stage for stage, parts in enumerate(announced) for name, _, _ in parts[which]}
        specs = [(name, tuple(shape), dtype) for parts in announced for name, shape, dtype in parts[which]]
        local = share.weights if which == 0 else {**share.moments, **rng}
        if which == 1:
            specs += [(n, tuple(t.shape), DTYPES[t.dtype]) for n, t in rng.items()]
        specs.sort(key=lambda spec: spec[0])  # the order every sender sends its own in
        spec_of = {name: (shape, dtype) for name, shape, dtype in specs}

        def tensor_of(name: str) -> Tensor:
            if holder.get(name, 0) == 0:
                return local[name]
            shape, dtype = spec_of[name]
            t = torch.empty(shape, dtype=_BY_NAME[dtype], device=device)
            dist.recv(t, group_src=holder[name], group=group)
            return t

        _stream_safetensors(folder / file, specs, tensor_of, metadata)
    plain: dict[str, dict[str, Any]] = {}
    for parts in announced:
        plain.update(parts[2])
    return {"state": plain, "param_groups": param_groups}


def full_param_groups(model: nn.Module, optimizer: torch.optim.Optimizer, optim: Any) -> list[dict[str, Any]]:
    """The param_groups of the whole model's optimizer as its state_dict gives them (what a
    one-process run saves): `build_optimizer` over empty CPU stand-ins of the model's decay groups,
    with `optim` (the run's optim section), at the learning rate `optimizer` (a stage's) has now."""
    from attnlab.training.optim import build_optimizer, decay_groups

    groups = [{**g, "params": [nn.Parameter(torch.empty(0)) for _ in g["params"]]}
              for g in decay_groups(model, optim.weight_decay)]
    full = build_optimizer(model, optim.name, optim.lr, optim.betas, optim.eps, optim.weight_decay, groups=groups)
    lr = optimizer.param_groups[0]["lr"] / optimizer.param_groups[0].get("lr_scale", 1.0)
    for group in full.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    return full.state_dict()["param_groups"]


def read_checkpoint_part(path: str | os.PathLike, model: nn.Module, module: nn.Module, order: list[str],
                         plain_state: dict[str, dict[str, Any]]
                         ) -> tuple[dict[str, Tensor], dict[str, dict[str, Any]], dict[str, Tensor]]:
    """The tensors of `module` (a part of `model`: a pipeline stage, or the whole) in a training
    checkpoint in the full layout (written by any layout), reading only those from its files.

    Args:
        path: the checkpoint folder (its state.json read and its sha256 checked by the caller).
        model: the whole model (on the meta device or not: names and ties only).
        module: the part whose tensors are read; its parameter names are the model's.
        order: `optimizer_order(model, ...)`: the index `i` of the `optimizer.{i}.{key}` tensors.
        plain_state: state.json's `optimizer.state` (the entries that are not tensors, by index).

    Returns:
        (weights: each of `module`'s parameter and persistent buffer names -> the full tensor,
        moments: parameter name -> {key: value}, the RNG state tensors `rng.*`).

    Raises:
        CheckpointError: a tensor of `module` missing from the files.
    """
    from attnlab.io.checkpoints import CheckpointError
    from attnlab.io.weights import alias_groups, read_safetensors, safetensors_names

    path = Path(path)
    weights_file, optimizer_file = path / WEIGHTS_FILE, path / OPTIMIZER_FILE
    aliases = alias_groups(model)
    present = safetensors_names(weights_file)
    wanted: dict[str, str] = {}  # the module's name -> the file's (a tied tensor is stored once)
    for name, _ in module.named_parameters(remove_duplicate=False):
        found = next((n for n in aliases.get(name, (name,)) if n in present), None)
        if found is None:
            raise CheckpointError(f"{weights_file} has no tensor {name}")
        wanted[name] = found
    persistent = set(module.state_dict(keep_vars=True)) - set(wanted)
    wanted.update({name: name for name in persistent if name in present})
    stored = read_safetensors(weights_file, names=sorted(set(wanted.values())))
    weights = {name: stored[found] for name, found in wanted.items()}
    index = {name: i for i, name in enumerate(order)}
    mine: dict[str, str] = {}  # "optimizer.{i}." -> the module's name
    for name, _ in module.named_parameters():
        i = next((index[n] for n in aliases.get(name, (name,)) if n in index), None)
        if i is not None:
            mine[f"optimizer.{i}."] = name
    keys = [k for k in safetensors_names(optimizer_file)
            if k.startswith("rng.") or k[:k.find(".", len("optimizer.")) + 1] in mine]
    moments: dict[str, dict[str, Any]] = {}
    rng = {}
    for key, value in read_safetensors(optimizer_file, names=keys).items():
        if key.startswith("rng."):
            rng[key] = value
            continue
        prefix, _, entry = key.rpartition(".")
        moments.setdefault(mine[prefix + "."], {})[entry] = value
    for prefix, name in mine.items():
        for entry, value in plain_state.get(prefix[len("optimizer."):-1], {}).items():
            moments.setdefault(name, {})[entry] = value
    return weights, moments, rng
