"""Reading the weights of a Hugging Face folder safely.

Reading never runs code from a file: `model.safetensors` holds raw tensors, and a
`pytorch_model.bin` (a pickle) goes through `torch.load(..., weights_only=True)`, whose
unpickler builds tensors and plain containers only and refuses any other object — the
`__reduce__` trick that makes a pickle run a command is rejected before it runs. Writing
(and the safetensors reader) is attnlab's own I/O: `attnlab.io`.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from torch import Tensor

from attnlab.io.files import read_json
from attnlab.io.weights import SAFETENSORS, read_safetensors

TORCH_BIN = "pytorch_model.bin"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # the shards of a large model: model-0000K-of-0000N.safetensors


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


def read_sharded_safetensors(index: str | os.PathLike) -> dict[str, Tensor]:
    """Every tensor of the shards that a `model.safetensors.index.json` lists (its `weight_map`:
    tensor name -> shard file beside it), each tensor from the shard the index names.

    Raises:
        FileNotFoundError: a shard is missing.
        ValueError: an index without a weight_map, a shard outside the folder, a tensor missing
            from its shard (see also `read_safetensors`).
    """
    index = Path(index)
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: expected a 'weight_map' of tensor name -> shard file")
    state: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise ValueError(f"{index}: shard {shard!r} is not a file name beside the index")
        if not (index.parent / shard).is_file():
            raise FileNotFoundError(f"{index.parent / shard} is missing (listed in {index.name})")
        tensors = read_safetensors(index.parent / shard)
        for name in (n for n, s in weight_map.items() if s == shard):
            if name not in tensors:
                raise ValueError(f"{index}: tensor {name!r} is not in {shard}")
            state[name] = tensors[name]
    return state


def read_weights(folder: str | os.PathLike) -> tuple[dict[str, Tensor], Path]:
    """(tensors, file) of a model folder: `model.safetensors`, else the shards of
    `model.safetensors.index.json`, else `pytorch_model.bin`.

    Raises:
        FileNotFoundError: none of them is there.
        ValueError: the file cannot be read (see `read_safetensors`, `read_torch_bin`).
    """
    folder = Path(folder)
    if (folder / SAFETENSORS).is_file():
        return read_safetensors(folder / SAFETENSORS), folder / SAFETENSORS
    if (folder / SAFETENSORS_INDEX).is_file():
        return read_sharded_safetensors(folder / SAFETENSORS_INDEX), folder / SAFETENSORS_INDEX
    if (folder / TORCH_BIN).is_file():
        return read_torch_bin(folder / TORCH_BIN), folder / TORCH_BIN
    raise FileNotFoundError(f"{folder} has no {SAFETENSORS}, {SAFETENSORS_INDEX} or {TORCH_BIN}")
