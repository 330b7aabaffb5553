"""A run's `lora` section on the one training loop: the model wrapped with LoRA adapters
(attnlab.nn.lora) after it is built or loaded and before the optimizer is made, and what the run
folder keeps of it.

    Trainer.__init__:  task.prepare(model)            re-initialisation, freezing (fine-tuning)
                       apply_lora(model, config.lora)  adapters added, every base weight frozen
                       build_optimizer(model)         over what trains: the adapters (+ train_modules)
    Trainer.fit end:   export_lora(model, OUT)        OUT/adapter/ and, when the run is over, OUT/merged/

    OUT/checkpoints/step-N/model.safetensors   base weights + adapters, as the run holds them (exact resume)
    OUT/adapter/                               the adapters alone (attnlab.nn.lora.save_adapters: a
                                               small safetensors + adapter_config.json with the
                                               settings and the base model's config and sha256)
    OUT/merged/                                the model with the adapters merged in (attnlab.save,
                                               with OUT/tokenizer.json): attnlab.load, generate, convert

Fine-tuning (attnlab.finetune) passes `recipe.lora` into its run config, with the new task head
in train_modules.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from attnlab.config.load import to_dict
from attnlab.config.validate import ConfigError
from attnlab.nn.lora import LoraError, add_lora, lora_layers, lora_targets, merged_copy, save_adapters
from attnlab.training.config import LoraConfig

ADAPTER_DIR = "adapter"
MERGED_DIR = "merged"


def _config_error(err: LoraError) -> ConfigError:
    return ConfigError(f"lora.{err.argument}", err.problem)


def check_lora_targets(model: nn.Module, lora: LoraConfig | None) -> None:
    """Raise now, before any data is prepared, if `lora.target_modules` does not fit `model` (a
    model on the meta device will do: only the names and shapes are read).

    Raises:
        ConfigError: naming `lora.target_modules` and the pattern (attnlab.nn.lora.lora_targets).
    """
    if lora is None:
        return
    try:
        lora_targets(model, lora.target_modules)
    except LoraError as err:
        raise _config_error(err) from None


def apply_lora(model: nn.Module, lora: LoraConfig | None, *, seed: int = 0,
               log: Callable[[str], None] = print) -> nn.Module:
    """`model` with the adapters of `lora` added in place (attnlab.nn.lora.add_lora): every base
    weight frozen except train_modules', each A drawn from a generator seeded with `seed`, B zero.
    Without a `lora` section, the model as it is.

    Raises:
        ConfigError: naming the `lora.` field that does not fit the model (a target pattern that
            matches nothing, a train_modules pattern likewise).
    """
    if lora is None:
        return model
    try:
        names = add_lora(model, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout,
                         target_modules=lora.target_modules, train_modules=lora.train_modules,
                         generator=torch.Generator().manual_seed(seed))
    except LoraError as err:
        raise _config_error(err) from None
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    adapters = sum(len(m.rows) for m in lora_layers(model).values())
    log(f"lora: rank {lora.rank}, alpha {lora.alpha:g}, targets {', '.join(lora.target_modules)}: {adapters} "
        f"adapters in {len(names)} Linears; trainable {trainable:,} of {total:,} parameters "
        f"({100 * trainable / max(total, 1):.2f}%)")
    return model


def export_lora(model: nn.Module, out: str | Path, *, merged: bool = True,
                settings: LoraConfig | None = None) -> list[Path]:
    """Write what a LoRA run keeps beside its checkpoints (module docstring): OUT/adapter/ and,
    with `merged`, OUT/merged/ (with OUT/tokenizer.json when there is one). A model without
    adapters writes nothing.

    Returns:
        the folders written.
    """
    if not lora_layers(model):
        return []
    out = Path(out)
    written = [save_adapters(model, out / ADAPTER_DIR, settings=to_dict(settings) if settings is not None else None)]
    if merged:
        from attnlab.interop.serialization import save

        tokenizer = _TokenizerFile(out / "tokenizer.json") if (out / "tokenizer.json").is_file() else None
        plain = merged_copy(model)
        written.append(save(plain, out / MERGED_DIR, tokenizer=tokenizer))
    return written


class _TokenizerFile:
    """A run's tokenizer.json as attnlab.save takes a tokenizer: `save(folder)` copies the file."""

    def __init__(self, path: Path):
        self.path = path

    def save(self, folder: str | Path) -> None:
        shutil.copyfile(self.path, Path(folder) / "tokenizer.json")


__all__ = ["ADAPTER_DIR", "MERGED_DIR", "apply_lora", "check_lora_targets", "export_lora"]
