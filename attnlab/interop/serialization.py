"""`save(model, path, tokenizer=None)` and `load(path)`: a model as a folder of plain files.

    path/
      config.json         ModelConfig.to_json() (a ViT's VisionConfig.to_json()) — plain data
      model.safetensors   every tensor once, by its attnlab name; tied tensors stored once
      tokenizer.json      when a tokenizer is given (Hugging Face format)

No pickle, ever: tensors go through safetensors, the config through JSON. Writing is atomic
(`atomic_folder`): the files are written into a temporary folder beside `path`, which is
swapped in at the end, so a crash leaves the previous folder (or nothing), never half of a
new one; a folder that attnlab did not write is never replaced.

    attnlab.save(model, "run/model", tokenizer=tok)
    model = attnlab.load("run/model")                              # eval mode
    model, tok = attnlab.load("run/model", with_tokenizer=True)    # tok is None without tokenizer.json

Why here, in `interop`: loading builds a model (`models`, LoRA from `nn`), reads a tokenizer
(`tokenizers`) and opens Hugging Face folders too (`from_hf`), so it sits at the lowest layer
that sees all of them — the one of `interop` — and among that layer's packages with the one
whose subject is model folders on disk (`save_hf`, `from_hf(folder)`). The files themselves
(safetensors, atomic folders, the checkpoints' layout) are `attnlab.io`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.config import ModelConfig
from attnlab.io.checkpoints import read_state, resolve_checkpoint
from attnlab.io.files import atomic_folder, read_json
from attnlab.io.weights import SAFETENSORS, load_state, read_safetensors, unique_state, write_safetensors

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
FORMAT = "attnlab"


def save(model: nn.Module, path: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Write `model` (and `tokenizer`) to the folder `path`, atomically.

    Args:
        model: a model from `build_model` / `from_hf` / `load`, or a `VisionEncoder` (it carries
            `model.config`).
        path: the folder to write; an existing model folder there is replaced.
        tokenizer: anything with `save(folder)` writing `tokenizer.json` (attnlab's Tokenizer).

    Returns:
        the folder written.

    Raises:
        TypeError: `model` has no ModelConfig (or VisionConfig), or `tokenizer` has no `save`.
        ValueError: `path` is a file, or a folder attnlab did not write (see `atomic_folder`); a
            model with quantized decoding weights (`attnlab.decoding.quantize_weights`).
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig) and not _is_vision(config):
        raise TypeError(f"model must be built by attnlab (with a ModelConfig or VisionConfig in .config), "
                        f"got {type(model).__name__}")
    if tokenizer is not None and not callable(getattr(tokenizer, "save", None)):
        raise TypeError(f"tokenizer must have a save(folder) method, got {type(tokenizer).__name__}")
    if any(hasattr(m, "qweight") for m in model.modules()):  # attnlab.decoding.quantize.QuantizedLinear
        raise ValueError("this model holds int8/bf16 decoding weights (quantize_weights): save the fp32 model and "
                         "quantize after loading (attnlab generate --weights int8)")
    path = Path(path)
    with atomic_folder(path) as tmp:
        (tmp / CONFIG).write_text(config.to_json() + "\n", encoding="utf-8")
        write_safetensors(unique_state(model), tmp / SAFETENSORS, metadata={"format": FORMAT})
        if tokenizer is not None:
            tokenizer.save(tmp)
            if not (tmp / TOKENIZER).is_file():
                raise ValueError(f"tokenizer.save(folder) did not write {TOKENIZER}")
    return path


def load(path: str | os.PathLike, *, with_tokenizer: bool = False) -> Any:
    """Read a folder written by `save`, an `attnlab train` run folder (its best checkpoint), one
    of a run's checkpoints (RUN/checkpoints/step-N/, or RUN/checkpoints/ for the best; the
    config and tokenizer are RUN's), or a Hugging Face folder (through `from_hf`).

    Args:
        path: the folder, or a Hugging Face Hub model `hf:NAME[@REVISION]` (`attnlab.interop.hub`).
        with_tokenizer: also return the tokenizer (None when the folder has no tokenizer.json).

    Returns:
        the model in eval mode, or (model, tokenizer) with `with_tokenizer=True`. Floating
        tensors keep the dtype they were saved in.

    Raises:
        FileNotFoundError: no folder, config.json or model.safetensors; a run folder without
            checkpoints.
        ValueError: a file instead of a folder, a bad config, a truncated weights file, or
            missing, unexpected or mis-shaped tensors; nothing half-loaded is returned. Every
            message names the folder or the file in it.
        HubError: an `hf:` name that cannot be had (not cached while offline, not found, gated, ...).
    """
    from attnlab.interop.hub import resolve_model_path

    folder = resolve_model_path(path)  # an `hf:NAME` is its snapshot in the Hugging Face cache
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist (expected a model folder: {CONFIG} + {SAFETENSORS})")
    if not folder.is_dir():
        raise ValueError(f"{folder} is a file; expected a model folder ({CONFIG} + {SAFETENSORS})")
    try:
        checkpoint = _checkpoint_of_run(folder)
        if checkpoint is not None:  # RUN/checkpoints/ or RUN/checkpoints/step-N/: config and tokenizer are RUN's
            folder = checkpoint.parent.parent
            model = _build_run_model(folder, read_json(folder / CONFIG), checkpoint)
        else:
            model = _load_model(folder, read_json(folder / CONFIG))
    except ValueError as err:  # name the folder in errors that do not (an unsupported HF architecture, ...)
        if isinstance(err, UnicodeDecodeError) or str(folder) in str(err):
            raise
        raise ValueError(f"{folder}: {err}") from err
    if not with_tokenizer:
        return model
    tokenizer = None
    if (folder / TOKENIZER).is_file():
        from attnlab.tokenizers import Tokenizer

        tokenizer = Tokenizer.load(folder / TOKENIZER)
    return model, tokenizer


def _load_model(folder: Path, data: dict) -> nn.Module:
    """The model of a folder whose config.json holds `data`: Hugging Face, a run, or attnlab's."""
    if "arch" not in data and "model_type" in data:  # a Hugging Face folder
        from attnlab.interop.api import from_hf

        return from_hf(folder)
    if "arch" not in data and isinstance(data.get("model"), dict):  # an `attnlab train` run: its best checkpoint
        if not (folder / "checkpoints").is_dir():
            raise FileNotFoundError(f"{folder} holds the config.json of an `attnlab train` run but no checkpoints/ "
                                    "(expected checkpoints/step-*/)")
        return _load_run(folder, data)
    try:
        config = _config_of(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{folder / CONFIG}: not an attnlab model config: {err}") from err
    if not (folder / SAFETENSORS).is_file():
        raise FileNotFoundError(f"{folder} has no {SAFETENSORS}")
    return _build(config, folder / SAFETENSORS, keep_dtype=True)


def _checkpoint_of_run(folder: Path) -> Path | None:
    """The checkpoint to load when `folder` is one (state.json + weights) or a run's
    checkpoints/ folder (its best); None for any other folder."""
    if (folder / CONFIG).exists():
        return None
    if (folder / "state.json").is_file():
        return folder
    if folder.name == "checkpoints" and (folder.parent / CONFIG).is_file():
        return resolve_checkpoint(folder, "best")
    return None


def _load_run(folder: Path, run_config: dict) -> nn.Module:
    """The model of an `attnlab train` run folder, with its best checkpoint's weights (verified)."""
    return _build_run_model(folder, run_config, resolve_checkpoint(folder, "best"))


def _build_run_model(run: Path, run_config: dict, checkpoint: Path) -> nn.Module:
    """The model of run `run` (its config.json holds `run_config`) with `checkpoint`'s weights.

    Raises:
        ValueError: a config.json without the run's `model` section; a corrupted checkpoint.
    """
    if not isinstance(run_config.get("model"), dict):
        raise ValueError(f"{run / CONFIG}: expected the config.json of an `attnlab train` run (with a 'model' "
                         f"section) beside {checkpoint}")
    read_state(checkpoint)  # checks the files' sha256 before anything is loaded
    lora = (run_config.get("config") or {}).get("lora")  # a LoRA run's checkpoints: base weights + adapters
    return _build(_config_of(run_config["model"]), checkpoint / SAFETENSORS, keep_dtype=False, lora=lora)


def _is_vision(config: Any) -> bool:
    """Whether `config` is a ViT's VisionConfig (checked by module, so torch loads only with a model)."""
    return type(config).__name__ == "VisionConfig" and type(config).__module__ == "attnlab.models.vision"


def _config_of(data: dict) -> Any:
    """The config of a saved model: a VisionConfig for a ViT (`image_size` + `encoder`, no `arch`),
    else a ModelConfig."""
    if "arch" not in data and "image_size" in data and "encoder" in data:
        from attnlab.models.vision import VisionConfig

        return VisionConfig.from_dict(data)
    return ModelConfig.from_dict(data)


def _build(config: Any, weights: Path, *, keep_dtype: bool, lora: dict | None = None) -> nn.Module:
    """A model built from `config` (a ModelConfig, or a ViT's VisionConfig) with the tensors of
    `weights`, in eval mode; with `keep_dtype`, in the one floating dtype the tensors were saved in.
    With `lora` (a run's `lora` section) the weights are base + adapters: loaded wrapped, then
    merged into plain Linears."""
    from attnlab.models import build_model

    state = read_safetensors(weights)
    if _is_vision(config):
        from attnlab.models.vision import VisionEncoder

        model = VisionEncoder(config)
    else:
        model = build_model(config)
    if lora:
        from attnlab.nn.lora import add_lora

        add_lora(model, **lora)
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if keep_dtype and len(dtypes) == 1:
        model = model.to(dtypes.pop())
    load_state(model, state, source=str(weights))
    if lora:
        from attnlab.nn.lora import unload_lora

        unload_lora(model, merge=True).requires_grad_(True)
    model.config = config
    return model.eval()
