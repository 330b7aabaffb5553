"""`from_hf`, `to_hf`, `save_hf`: attnlab models to and from Hugging Face `transformers`.

    model = attnlab.from_hf(hf_model)              # a transformers model object
    model = attnlab.from_hf("path/to/folder")      # config.json + model.safetensors (or .bin)
    model = attnlab.from_hf("hf:gpt2")             # a Hub model, through huggingface_hub's cache
    hf_model = attnlab.to_hf(model)                # needs `transformers`
    attnlab.interop.save_hf(model, "out/")         # a Hugging Face folder, no transformers needed

Reading a folder never builds the Hugging Face class: config.json maps to a ModelConfig and
the tensors are renamed straight into a fresh attnlab model. Every conversion is strict —
a missing, unexpected or mis-shaped tensor is an error naming it — and a model is returned
only once all of its tensors have loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.interop.common import state_from_hf, state_to_hf
from attnlab.interop.families import FAMILIES, family_of, folder_architecture, supported_architectures
from attnlab.interop.files import read_weights
from attnlab.interop.special import special_token_ids, tokenizer_config
from attnlab.io.files import atomic_folder, json_text, read_json
from attnlab.io.weights import SAFETENSORS, load_state, write_safetensors

def from_state(hf_config: dict[str, Any], architecture: str, state: dict[str, Tensor], *,
               source: str = "the checkpoint") -> nn.Module:
    """An attnlab model (eval mode) from a Hugging Face config dict and state dict.

    Raises:
        ValueError: unsupported architecture or option; missing, unexpected or mis-shaped
            tensors (named, with `source`).
    """
    family = family_of(architecture)
    if hf_config.get("model_type", family.MODEL_TYPE) != family.MODEL_TYPE:
        raise ValueError(f"{source}: model_type={hf_config.get('model_type')!r} does not match "
                         f"architecture {architecture!r}")
    cfg = family.config_from_hf(hf_config, architecture)
    from attnlab.models import build_model

    model = build_model(cfg)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    ours = state_from_hf(state, family.conversion(cfg, architecture), source=source, expected=shapes)
    load_state(model, ours, source=source)
    return model.eval()


def from_hf(model_or_path: Any) -> nn.Module:
    """Convert a Hugging Face model (object or folder) to an attnlab model in eval mode.

    Args:
        model_or_path: a `transformers` model (GPT2LMHeadModel, GPT2Model, BertModel,
            BertForMaskedLM, BertForSequenceClassification, BartForConditionalGeneration,
            MarianMTModel, T5ForConditionalGeneration, LlamaForCausalLM, MistralForCausalLM,
            Qwen2ForCausalLM, and their base `*Model`s), a folder with `config.json` and
            `model.safetensors` (or `pytorch_model.bin`, read without unpickling objects), or a
            Hugging Face Hub model `hf:NAME[@REVISION]` (`attnlab.interop.hub`: safetensors only).

    Returns:
        the attnlab model (`model.config` is its ModelConfig); outputs match the original.

    Raises:
        ValueError: unsupported architecture or option; missing, unexpected or mis-shaped
            weights; an unreadable or unsafe weights file. Messages name the tensor or file.
        FileNotFoundError: a folder without config.json or weights.
        HubError: an `hf:` name that cannot be had (not cached while offline, not found, gated, ...).
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        from attnlab.interop.hub import resolve_model_path

        folder = resolve_model_path(model_or_path)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder (expected config.json + {SAFETENSORS})")
        hf_config = read_json(folder / "config.json")
        architecture = folder_architecture(hf_config, str(folder / "config.json"))
        try:  # fail on the architecture and its options before reading gigabytes
            family_of(architecture).config_from_hf(hf_config, architecture)
        except ValueError as err:
            raise ValueError(f"{folder}: {err}") from None
        state, file = read_weights(folder)
        return from_state(hf_config, architecture, state, source=str(file))
    if not isinstance(model_or_path, nn.Module) or not hasattr(model_or_path, "config"):
        raise TypeError(f"from_hf expects a transformers model or a folder path, got {type(model_or_path).__name__}")
    architecture = type(model_or_path).__name__
    family_of(architecture)
    return from_state(model_or_path.config.to_dict(), architecture, model_or_path.state_dict(),
                      source=f"{architecture}.state_dict()")


def _export_family(config: ModelConfig, family: str | None) -> ModuleType:
    if family is not None:
        by_name = {f.MODEL_TYPE: f for f in FAMILIES}
        if family not in by_name:
            raise ValueError(f"family={family!r} is not one of {', '.join(by_name)}")
        return by_name[family]
    for fam in FAMILIES:
        if fam.matches(config):
            return fam
    raise ValueError(f"no Hugging Face family expresses arch={config.arch!r} with "
                     f"position.scheme={config.position.scheme!r}")


def hf_export(model: nn.Module, family: str | None = None, *,
              tokenizer: Any = None) -> tuple[dict[str, Any], str, dict[str, Tensor]]:
    """(config.json dict, architecture, state dict with each tied tensor once) of an attnlab model.

    Args:
        model: a model from `build_model` (it carries `model.config`).
        family: `gpt2`, `llama`, `mistral`, `qwen2`, `bert`, `bart`, `marian` or `t5`; None
            picks by the config (decoder with rotary positions -> Mistral with the
            sliding-window kernel, Qwen2 with attention biases, Llama otherwise; other decoders
            -> GPT-2; encoder -> BERT; encoder-decoder by position scheme: t5_bias -> T5,
            sinusoidal -> Marian, learned -> BART).
        tokenizer: the model's attnlab tokenizer, whose bos/eos ids the config records;
            without one, the family's defaults where they fit the vocabulary, else None
            (`attnlab.interop.special`).

    Raises:
        ValueError: the config uses something the family cannot express (fields listed);
            a tokenizer special token outside the model's vocabulary.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise TypeError(f"expected an attnlab model built by build_model (with .config), got {type(model).__name__}")
    if not config.d_ff:
        raise ValueError("d_ff=0: attention-only layers have no feed-forward, which every Hugging Face family "
                         "this converts to has")
    fam = _export_family(config, family)
    hf_config, architecture = fam.config_to_hf(config)
    hf_config.update(special_token_ids(hf_config, fam.SPECIAL_TOKENS, tokenizer))
    state = state_to_hf(model, fam.conversion(config, architecture))
    return hf_config, architecture, state


def to_hf(model: nn.Module, family: str | None = None, *, tokenizer: Any = None) -> nn.Module:
    """The equivalent `transformers` model (eval mode); see `hf_export` for `family` and `tokenizer`.

    Raises:
        ValueError: the config cannot be expressed, or the installed transformers ties
            tensors that the attnlab model keeps apart.
        ImportError: transformers is not installed.
    """
    import transformers

    hf_config, architecture, state = hf_export(model, family, tokenizer=tokenizer)
    kwargs = {k: v for k, v in hf_config.items() if k not in ("model_type", "architectures")}
    config = transformers.AutoConfig.for_model(hf_config["model_type"], **kwargs)
    hf_model = getattr(transformers, architecture)(config)
    load_state(hf_model, state, source=f"the {architecture} converted from attnlab")
    return hf_model.eval()


def save_hf(model: nn.Module, path: str | os.PathLike, family: str | None = None, tokenizer: Any = None) -> Path:
    """Write a Hugging Face folder (config.json + model.safetensors, and tokenizer.json +
    tokenizer_config.json when a tokenizer is given), atomically, without needing
    transformers; `transformers` loads it with `from_pretrained(path)` (model and tokenizer)
    without a warning about token ids.

    Args:
        model: an attnlab model; family: as in `hf_export`.
        tokenizer: an attnlab Tokenizer (anything with `save(folder)` writing tokenizer.json);
            its bos/eos ids go into config.json and its special tokens into
            tokenizer_config.json (see `attnlab.interop.special`).

    Returns:
        the folder written.

    Raises:
        ValueError: as `hf_export`; `path` is a file or a non-empty non-model folder.
    """
    hf_config, architecture, state = hf_export(model, family, tokenizer=tokenizer)
    path = Path(path)
    with atomic_folder(path) as tmp:
        _write_json(tmp / "config.json", hf_config)
        write_safetensors(state, tmp / SAFETENSORS, metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp)
            _write_json(tmp / "tokenizer_config.json", tokenizer_config(tokenizer, _max_length(model.config)))
    return path


def _write_json(file: Path, data: dict[str, Any]) -> None:
    file.write_text(json_text(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _max_length(config: ModelConfig) -> int | None:
    """The longest input the exported model takes: its position table's length (learned or
    sinusoidal positions), else None (relative positions have no limit)."""
    return config.position.max_len if config.position.scheme in ("learned", "sinusoidal") else None
