"""From a DataConfig to batches: tokenizer, token files (cached), objective.

    pipe = Pipeline.build(cfg.data, out_dir)         # trains or loads the tokenizer
    batch = pipe.train_batch(generator)              # dict of LongTensors, per the objective
    for batch in pipe.eval_batches(20): ...          # the same batches at every evaluation

What differs between objectives (special tokens, text or pairs, the batches) is the objective's
spec in attnlab.training.objectives; nothing here names an objective.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from attnlab.data.sources import is_pairs_source, read_pairs, read_pieces, resolve_source
from attnlab.data.tokenized import TokenFile
from attnlab.io.cache import cache_dir
from attnlab.training.config import DataConfig, objective_fields
from attnlab.training.objectives import OBJECTIVES, Objective, pairs_batch


def _source_key(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def build_tokenizer(cfg: DataConfig, train_path: Path, out_dir: Path | None, given: Any = None):
    """`given` (a pretrained model's tokenizer), or load `cfg.tokenizer.path`, or `OUT/tokenizer.json`
    from an earlier run, or train one on the training split. A given, loaded or trained tokenizer
    is saved to `OUT/tokenizer.json`, so the run folder alone serves `attnlab eval`, `translate`
    and `generate`."""
    from attnlab.tokenizers import Tokenizer

    saved = out_dir / "tokenizer.json" if out_dir is not None else None
    if given is not None:
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            given.save(saved)  # atomic
        return given
    if cfg.tokenizer.path:
        tok = Tokenizer.load(cfg.tokenizer.path)
        if saved is not None and not saved.exists():
            saved.parent.mkdir(parents=True, exist_ok=True)
            tok.save(saved)  # atomic
        return tok
    if saved is not None and saved.exists():
        return Tokenizer.load(saved)
    if is_pairs_source(str(train_path)):
        texts = [side for pair in read_pairs(train_path) for side in pair]
    elif train_path.is_file() and train_path.suffix not in (".jsonl",):
        texts = str(train_path)
    else:
        texts = [piece for piece, _ in read_pieces(train_path, text_field=cfg.text_field)]
    kwargs = {"lowercase": False} if cfg.tokenizer.kind == "wordpiece" else {}
    tok = Tokenizer.train(texts, kind=cfg.tokenizer.kind, vocab_size=cfg.tokenizer.vocab_size,
                          special_tokens=OBJECTIVES[cfg.objective].special_tokens(cfg.tokenizer.kind), **kwargs)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        tok.save(saved)
    return tok


@dataclass
class Pipeline:
    """The data side of a run: tokenizer, train/valid token files, objective settings."""

    cfg: DataConfig
    tokenizer: Any
    train: Any  # TokenFile, or (src TokenFile, tgt TokenFile) for pairs
    valid: Any

    @classmethod
    def build(cls, cfg: DataConfig, out_dir: str | os.PathLike | None = None, *, show_progress: bool = True,
              tokenizer: Any = None) -> "Pipeline":
        """Resolve the sources, build or load the tokenizer (or take `tokenizer`, a pretrained
        model's), tokenise both splits (cached)."""
        out = Path(out_dir) if out_dir is not None else None
        train_path = resolve_source(cfg.source, "train")
        if cfg.valid is not None:
            valid_path = Path(cfg.valid)
        elif train_path != Path(cfg.source):  # a built-in corpus
            valid_path = resolve_source(cfg.source, "valid")
        else:
            raise ValueError("data.valid: give a validation file for your own data (built-in corpora bring one)")
        objective, pairs = OBJECTIVES[cfg.objective], is_pairs_source(cfg.source)
        if pairs != objective.pairs:
            takes = [name for name, spec in OBJECTIVES.items() if spec.pairs]
            raise ValueError(f"data.objective={cfg.objective!r} does not fit data.source={cfg.source!r} "
                             f"({'sentence pairs' if pairs else 'plain text'}); "
                             f"{', '.join(takes)} take{'s' if len(takes) == 1 else ''} pairs, "
                             "the other objectives plain text")
        tok = build_tokenizer(cfg, train_path, out, tokenizer)
        token_hash = hashlib.sha256(json.dumps(tok.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
        folder = cache_dir() / "tokens"
        eos = tok.eos_token_id if objective.eos_between_documents else None
        splits = {}
        for split, path in (("train", train_path), ("valid", valid_path)):
            key = hashlib.sha256(f"{_source_key(path)}:{token_hash}:{eos}".encode()).hexdigest()[:16]
            prefix = folder / f"{path.stem}-{split}-{key}"
            if pairs:
                splits[split] = tuple(cls._token_file(Path(f"{prefix}-{side}"), [p[i] for p in read_pairs(path)],
                                                      tok, None, show_progress) for i, side in enumerate(("src", "tgt")))
            else:
                total = path.stat().st_size if path.is_file() else None
                splits[split] = cls._token_file(prefix, read_pieces(path, text_field=cfg.text_field), tok, eos,
                                                show_progress, total)
        return cls(cfg, tok, splits["train"], splits["valid"])

    @staticmethod
    def _token_file(prefix: Path, pieces, tok, eos, show_progress: bool, total: int | None = None) -> TokenFile:
        if prefix.with_suffix(".json").exists():
            return TokenFile(prefix)
        return TokenFile.build(prefix, pieces, tok.encode, tok.vocab_size, eos_id=eos, total_chars=total,
                               source=str(prefix.name), show_progress=show_progress)

    # ---------------------------------------------------------------- model-side facts
    def model_overrides(self, arch: str | None = None) -> dict[str, Any]:
        """Fields the model config takes from the data: vocabulary and padding (the tokenizer's),
        arch and head (the objective's, see attnlab.training.config.objective_fields).

        Args:
            arch: the configured `model.arch`; `rnn_encoder_decoder` is kept for the
                encoder-decoder objectives (any other arch follows the objective).

        Raises:
            ConfigError: `rnn_encoder_decoder` with an objective that does not train an encoder-decoder.
        """
        tok = self.tokenizer
        return {"vocab_size": tok.vocab_size, "pad_token_id": tok.pad_token_id,
                **objective_fields(self.cfg.objective, self.cfg.nsp, arch)}

    # ---------------------------------------------------------------- batches
    @property
    def objective(self) -> Objective:
        return OBJECTIVES[self.cfg.objective]

    def _pairs_batch(self, files, index) -> dict[str, torch.Tensor]:
        """The seq2seq batch of the pairs at `index` (translation scores decode these)."""
        return pairs_batch(self.cfg, self.tokenizer, files, index)

    def make_batch(self, files, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """One batch of the configured objective drawn from `files` with `generator`."""
        return self.objective.train_batch(self.cfg, self.tokenizer, files, generator)

    def train_batch(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return self.make_batch(self.train, generator)

    def eval_batches(self, num_batches: int) -> Iterator[dict[str, torch.Tensor]]:
        """The same `num_batches` validation batches every time (fixed order or fixed seed)."""
        return self.objective.eval_batches(self.cfg, self.tokenizer, self.valid, num_batches)
