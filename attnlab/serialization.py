"""`save(model, path, tokenizer=None)` and `load(path)`: a model as a folder of plain files.

    path/
      config.json         ModelConfig.to_json() — plain data
      model.safetensors   every tensor once, by its attnlab name; tied tensors stored once
      tokenizer.json      when a tokenizer is given (Hugging Face format)

No pickle, ever: tensors go through safetensors, the config through JSON. Writing is atomic:
the files are written into a temporary folder beside `path`, which is renamed into place at
the end, so a crash leaves the previous folder (or nothing), never half of a new one.

    attnlab.save(model, "run/model", tokenizer=tok)
    model = attnlab.load("run/model")                              # eval mode
    model, tok = attnlab.load("run/model", with_tokenizer=True)    # tok is None without tokenizer.json
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.interop.common import alias_groups, load_state
from attnlab.interop.files import SAFETENSORS, atomic_folder, read_json, read_safetensors, write_safetensors

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
FORMAT = "attnlab"


def _unique_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """state_dict with each tied tensor under its first name only."""
    groups = alias_groups(model)
    out = {}
    for name, tensor in model.state_dict().items():
        if groups.get(name, (name,))[0] == name:
            out[name] = tensor
    return out


def save(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Write `model` (and `tokenizer`) to the folder `path`, atomically.

    Args:
        model: a model from `build_model` / `from_hf` / `load` (it carries `model.config`).
        path: the folder to write; an existing model folder there is replaced.
        tokenizer: anything with `save(folder)` writing `tokenizer.json` (attnlab's Tokenizer).

    Returns:
        the folder written.

    Raises:
        TypeError: `model` has no ModelConfig, or `tokenizer` has no `save`.
        ValueError: `path` is a file, or a non-empty folder that is not a model folder.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise TypeError(f"model must be built by attnlab (with a ModelConfig in .config), got {type(model).__name__}")
    if tokenizer is not None and not callable(getattr(tokenizer, "save", None)):
        raise TypeError(f"tokenizer must have a save(folder) method, got {type(tokenizer).__name__}")
    path = Path(path)
    with atomic_folder(path) as tmp:
        (tmp / CONFIG).write_text(config.to_json() + "\n", encoding="utf-8")
        write_safetensors(_unique_state(model), tmp / SAFETENSORS, metadata={"format": FORMAT})
        if tokenizer is not None:
            tokenizer.save(tmp)
            if not (tmp / TOKENIZER).is_file():
                raise ValueError(f"tokenizer.save(folder) did not write {TOKENIZER}")
    return path


def load(path: str | os.PathLike, *, with_tokenizer: bool = False) -> Any:
    """Read a folder written by `save`, an `attnlab train` run folder (its best checkpoint), or a
    Hugging Face folder (through `from_hf`).

    Args:
        path: the folder.
        with_tokenizer: also return the tokenizer (None when the folder has no tokenizer.json).

    Returns:
        the model in eval mode, or (model, tokenizer) with `with_tokenizer=True`. Floating
        tensors keep the dtype they were saved in.

    Raises:
        FileNotFoundError: no folder, config.json or model.safetensors.
        ValueError: a bad config, a truncated weights file, or missing, unexpected or
            mis-shaped tensors (named); nothing half-loaded is returned.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder (expected {CONFIG} + {SAFETENSORS})")
    data = read_json(folder / CONFIG)
    if "arch" not in data and "model_type" in data:  # a Hugging Face folder
        from attnlab.interop.api import from_hf

        model = from_hf(folder)
    elif "model" in data and (folder / "checkpoints").is_dir():  # an `attnlab train` run: its best checkpoint
        model = _load_run(folder, data)
    else:
        try:
            config = ModelConfig.from_dict(data)
        except TypeError as err:
            raise ValueError(f"{folder / CONFIG}: {err}") from err
        if not (folder / SAFETENSORS).is_file():
            raise FileNotFoundError(f"{folder} has no {SAFETENSORS}")
        state = read_safetensors(folder / SAFETENSORS)
        from attnlab.models import build_model

        model = build_model(config)
        dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
        if len(dtypes) == 1:
            model = model.to(dtypes.pop())
        load_state(model, state, source=str(folder / SAFETENSORS))
        model.config = config
        model.eval()
    if not with_tokenizer:
        return model
    tokenizer = None
    if (folder / TOKENIZER).is_file():
        from attnlab.tokenizers import Tokenizer

        tokenizer = Tokenizer.load(folder / TOKENIZER)
    return model, tokenizer


def _load_run(folder: Path, run_config: dict) -> Any:
    """The model of an `attnlab train` run folder, with its best checkpoint's weights."""
    from attnlab.models import build_model
    from attnlab.training.checkpoint import load_checkpoint, resolve_checkpoint

    config = ModelConfig.from_dict(run_config["model"])
    model = build_model(config)
    load_checkpoint(resolve_checkpoint(folder, "best"), model=model)
    model.config = config
    return model.eval()
