"""From a DataConfig to batches: tokenizer, token files (cached), objective.

    pipe = Pipeline.build(cfg.data, out_dir)         # trains or loads the tokenizer
    batch = pipe.train_batch(generator)              # dict of LongTensors, per the objective
    for batch in pipe.eval_batches(20): ...          # the same batches at every evaluation
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from attnlab.data import objectives
from attnlab.data.cache import cache_dir
from attnlab.data.sources import is_pairs_source, read_pairs, read_pieces, resolve_source
from attnlab.data.tokenized import TokenFile
from attnlab.training.config import DataConfig

NUM_SENTINELS = 100
EVAL_SEED = 1234


def _special_tokens(kind: str, objective: str) -> list[str]:
    if objective == "masked_lm":
        return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if objective == "span_corruption":
        return ["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(NUM_SENTINELS)]
    if objective == "seq2seq":
        return ["<pad>", "<unk>", "<s>", "</s>"]
    return ["<|endoftext|>"] if kind == "bpe" else ["<pad>", "<unk>", "<|endoftext|>"]


def _source_key(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def build_tokenizer(cfg: DataConfig, train_path: Path, out_dir: Path | None):
    """Load `cfg.tokenizer.path`, or `OUT/tokenizer.json` from an earlier run, or train one on
    the training split. A loaded or trained tokenizer is saved to `OUT/tokenizer.json`, so the
    run folder alone serves `attnlab eval`, `translate` and `generate`."""
    from attnlab.tokenizers import Tokenizer

    saved = out_dir / "tokenizer.json" if out_dir is not None else None
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
                          special_tokens=_special_tokens(cfg.tokenizer.kind, cfg.objective), **kwargs)
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
    def build(cls, cfg: DataConfig, out_dir: str | os.PathLike | None = None, *, show_progress: bool = True) -> "Pipeline":
        """Resolve the sources, build or load the tokenizer, tokenise both splits (cached)."""
        out = Path(out_dir) if out_dir is not None else None
        train_path = resolve_source(cfg.source, "train")
        if cfg.valid is not None:
            valid_path = Path(cfg.valid)
        elif train_path != Path(cfg.source):  # a built-in corpus
            valid_path = resolve_source(cfg.source, "valid")
        else:
            raise ValueError("data.valid: give a validation file for your own data (built-in corpora bring one)")
        pairs = is_pairs_source(cfg.source)
        if pairs != (cfg.objective == "seq2seq"):
            raise ValueError(f"data.objective={cfg.objective!r} does not fit data.source={cfg.source!r} "
                             f"({'sentence pairs' if pairs else 'plain text'}); "
                             "seq2seq takes pairs, the other objectives plain text")
        tok = build_tokenizer(cfg, train_path, out)
        token_hash = hashlib.sha256(json.dumps(tok.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
        folder = cache_dir() / "tokens"
        eos = tok.eos_token_id if cfg.objective in ("causal_lm", "prefix_lm") else None
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
        """Fields the model config takes from the data: vocabulary, padding, arch, head.

        Args:
            arch: the configured `model.arch`; `rnn_encoder_decoder` is kept for the
                encoder-decoder objectives (any other arch follows the objective).

        Raises:
            ValueError: `rnn_encoder_decoder` with an objective that is not seq2seq or span_corruption.
        """
        tok, objective = self.tokenizer, self.cfg.objective
        out: dict[str, Any] = {"vocab_size": tok.vocab_size, "pad_token_id": tok.pad_token_id}
        if arch == "rnn_encoder_decoder":
            if objective not in ("span_corruption", "seq2seq"):
                raise ValueError(f"model.arch='rnn_encoder_decoder' needs data.objective 'seq2seq' or "
                                 f"'span_corruption', got {objective!r}")
            return {**out, "head": "lm"}
        if objective == "masked_lm":
            out.update(arch="encoder", head="mlm")
            if self.cfg.nsp:  # segment embeddings for A/B, BERT's pooler and the NSP classifier
                out.update(type_vocab_size=2, pooler=True, nsp_head=True)
        elif objective in ("span_corruption", "seq2seq"):
            out.update(arch="encoder_decoder", head="lm")
        else:
            out.update(arch="decoder", head="lm")
        return out

    # ---------------------------------------------------------------- batches
    def _pairs_batch(self, files, index: np.ndarray) -> dict[str, torch.Tensor]:
        src, tgt = files
        tok = self.tokenizer
        return objectives.seq2seq([src.document(int(i)).tolist() for i in index],
                                  [tgt.document(int(i)).tolist() for i in index], pad_id=tok.pad_token_id,
                                  bos_id=tok.bos_token_id, eos_id=tok.eos_token_id, max_len=self.cfg.max_pair_len)

    def make_batch(self, files, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """One batch of the configured objective drawn with `generator`."""
        cfg, tok, B = self.cfg, self.tokenizer, self.cfg.batch_size
        if cfg.objective == "seq2seq":
            index = torch.randint(0, files[0].num_documents, (B,), generator=generator).numpy()
            return self._pairs_batch(files, index)
        if cfg.objective == "causal_lm":
            return objectives.causal_lm(files.random_windows(B, cfg.seq_len + 1, generator))
        if cfg.objective == "prefix_lm":
            return objectives.prefix_lm(files.random_windows(B, cfg.seq_len + 1, generator), generator)
        if cfg.objective == "masked_lm":
            pair = self._sentence_pairs(files, generator) if cfg.nsp else None
            ids = pair["input_ids"] if pair is not None else files.random_windows(B, cfg.seq_len, generator)
            word_starts = None
            if cfg.whole_word_mask:
                pieces = np.array([not (t or "").startswith("##") for t in
                                   (tok.id_to_token(i) for i in range(tok.vocab_size))])
                word_starts = torch.from_numpy(pieces)[ids]
            batch = objectives.masked_lm(ids, generator, vocab_size=tok.vocab_size, mask_id=tok.mask_token_id,
                                         special_ids=tok.all_special_ids, mask_prob=cfg.mask_prob,
                                         word_starts=word_starts)
            if pair is not None:
                batch.update(token_type_ids=pair["token_type_ids"], nsp_labels=pair["nsp_labels"])
            return batch
        # span corruption: T5's inputs are encoder input, targets are decoder labels
        ids = files.random_windows(B, cfg.seq_len, generator)
        sc = objectives.span_corruption(ids, generator, sentinel_ids=tok.sentinel_token_ids, eos_id=tok.eos_token_id,
                                        noise_density=cfg.noise_density, mean_span_length=cfg.mean_span_length)
        start = torch.full((B, 1), tok.pad_token_id)  # T5 starts decoding from the pad id
        return {"src_ids": sc["input_ids"], "tgt_ids": torch.cat([start, sc["labels"][:, :-1]], 1),
                "labels": sc["labels"]}

    def _sentence_pairs(self, files, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """`[CLS] A [SEP] B [SEP]` rows of seq_len tokens (A and B split the rest in halves);
        B is A's next segment or, with probability 1/2, a segment of another document."""
        tok, T = self.tokenizer, self.cfg.seq_len - 3
        if tok.cls_token_id is None or tok.sep_token_id is None:
            raise ValueError("data.nsp needs a tokenizer with [CLS] and [SEP] tokens")
        first, second, other = objectives.segment_pairs(files.tokens, files.offsets, self.cfg.batch_size, T // 2,
                                                        T - T // 2, generator)
        return objectives.next_sentence(first, second, other, generator, cls_id=tok.cls_token_id,
                                        sep_id=tok.sep_token_id)

    def train_batch(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return self.make_batch(self.train, generator)

    def eval_batches(self, num_batches: int) -> Iterator[dict[str, torch.Tensor]]:
        """The same `num_batches` validation batches every time (fixed order or fixed seed)."""
        cfg, B = self.cfg, self.cfg.batch_size
        if cfg.objective == "causal_lm":
            windows = self.valid.sequential_windows(cfg.seq_len + 1, limit=num_batches * B)
            for i in range(0, len(windows), B):
                yield objectives.causal_lm(windows[i: i + B])
            return
        if cfg.objective == "seq2seq":
            n = min(self.valid[0].num_documents, num_batches * B)
            for i in range(0, n, B):
                yield self._pairs_batch(self.valid, np.arange(i, min(i + B, n)))
            return
        generator = torch.Generator().manual_seed(EVAL_SEED)
        for _ in range(num_batches):
            yield self.make_batch(self.valid, generator)
