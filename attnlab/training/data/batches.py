"""From a DataConfig to batches: tokenizer, token files (cached), objective.

    pipe = DataPipeline.build(cfg.data, out_dir)         # trains or loads the tokenizer
    batch = pipe.train_batch(generator)              # dict of LongTensors, per the objective
    for batch in pipe.eval_batches(20): ...          # the same batches at every evaluation

What differs between objectives (special tokens, text or pairs, the batches) is the objective's
spec in attnlab.training.data.objectives; nothing here names an objective. Causal-LM rows packed
otherwise than plainly (`data.pack` `document_masked` or `pad`) come from attnlab.data.packing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from attnlab.data import packing
from attnlab.data.sources import is_pairs_source, read_pairs, read_pieces, resolve_source
from attnlab.data.tokenized import TokenFile
from attnlab.io.cache import cache_dir
from attnlab.training.config import DataConfig, objective_fields
from attnlab.training.data.objectives import OBJECTIVES, Objective, pairs_batch


def _source_key(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


SPLIT_SEED = 0  # salts the pair hash of data.valid_fraction; fixed, so runs that differ in train.seed share a split


@dataclass
class SourceSplit:
    """One split of a run's data: a whole file or folder, or a part of data.source that
    data.valid_fraction holds out.

    How `data.valid_fraction = f` splits data.source (deterministic: a run, its resume and a run
    with another train.seed see the same two parts):

    - text: the last f of its characters (the cut moved forward to the next line start) is the
      validation part. From the end and in one piece, not as held-out chunks: a training window
      that straddles a train/valid boundary reads validation text, and chunks make two such
      boundaries each where one cut makes one. The price: a text ordered by topic is validated on
      its last topic (as nanoGPT's split and the built-in corpora's are).
    - pairs: pairs are independent, and pair files are often sorted (by length, alphabet or
      origin), so their end is a biased sample. Instead the distinct pairs are ranked by a sha256
      of their text salted with SPLIT_SEED, and taken in that order until they cover
      int(f * number of pairs) rows: a seeded sample that does not depend on the file's order,
      in which every copy of a repeated pair ("Thank you." / "Danke.") falls on one side, so
      validation never scores a pair the model was trained on.

    Args:
        path: the file or folder read.
        pairs: read as sentence pairs (else as text).
        field: the config field that names it, for messages (`data.source`, `data.valid`).
        part: `all` (the whole source), or its `train` or `valid` part under `fraction`.
        fraction: data.valid_fraction (with part `train`/`valid`).
    """

    path: Path
    pairs: bool
    field: str = "data.source"
    part: str = "all"
    fraction: float | None = None

    def describe(self) -> str:
        """The split as a message names it: `data.valid 'v.txt'`, `the validation part
        (data.valid_fraction=0.05) of data.source 'all.txt'`."""
        where = f"{self.field} {str(self.path)!r}"
        if self.part == "all":
            return where
        side = "validation" if self.part == "valid" else "training"
        return f"the {side} part (data.valid_fraction={self.fraction:g}) of {where}"

    def cache_key(self) -> str:
        """What its token files depend on: the source's path, size and time, and the part."""
        key = _source_key(self.path)
        return key if self.part == "all" else f"{key}:{self.part}:{self.fraction!r}"

    def read_pairs(self) -> list[tuple[str, str]]:
        """Its sentence pairs, in file order.

        Raises:
            ValueError: data.valid_fraction of so few pairs that it holds out none.
        """
        rows = read_pairs(self.path)
        if self.part == "all":
            return rows
        held_out = held_out_pairs(rows, self.fraction)
        if not held_out and rows:
            least = math.ceil(1 / self.fraction)
            raise ValueError(f"data.valid_fraction={self.fraction:g} of the {len(rows)} pairs of {self.field} "
                             f"{str(self.path)!r} holds out no pair (it takes at least {least}); give more pairs, a "
                             "larger data.valid_fraction or a data.valid file")
        return [p for p in rows if (p in held_out) == (self.part == "valid")]

    def read_pieces(self, text_field: str) -> Iterator[tuple[str, bool]]:
        """Its text as `(piece, ends_document)` (attnlab.data.sources.read_pieces), streamed."""
        pieces = lambda: read_pieces(self.path, text_field=text_field)
        return pieces() if self.part == "all" else tail_split(pieces, self.fraction, self.part)

    def tokenizer_corpus(self, text_field: str) -> Any:
        """What `Tokenizer.train` reads: a whole plain file by its path (streamed line by line),
        else the texts."""
        if self.pairs:
            return [side for pair in self.read_pairs() for side in pair]
        if self.part == "all" and self.path.is_file() and self.path.suffix != ".jsonl":
            return str(self.path)
        return (piece for piece, _ in self.read_pieces(text_field))

    def check_not_empty(self, text_field: str) -> None:
        """Refuse a missing or empty source before a tokenizer is trained on it. Of a text only
        the start is read (its parts are checked once tokenised, by `DataPipeline.check_batches`).

        Raises:
            FileNotFoundError: no such file or folder.
            ValueError: no text, or no usable pair, in it.
        """
        where = f"{self.field} {str(self.path)!r}"
        if not self.path.exists():
            raise FileNotFoundError(f"{where}: no such file or folder")
        if self.pairs:
            if not self.read_pairs():
                raise ValueError(f"{self.describe()}: no sentence pairs in it (an empty file, or no row with both "
                                 "a source and a target)")
        elif not any(piece.strip() for piece, _ in read_pieces(self.path, text_field=text_field)):
            raise ValueError(f"{where}: no text in it (an empty file, or blank lines only)")


def held_out_pairs(pairs: list[tuple[str, str]], fraction: float) -> set[tuple[str, str]]:
    """The distinct pairs data.valid_fraction holds out (see SourceSplit): in the order of a
    salted sha256 of their text, until they cover int(fraction * len(pairs)) rows."""
    counts = Counter(pairs)
    rank = lambda pair: hashlib.sha256(f"{SPLIT_SEED}\0{pair[0]}\0{pair[1]}".encode()).digest()
    chosen: set[tuple[str, str]] = set()
    covered, wanted = 0, int(fraction * len(pairs))
    for pair in sorted(counts, key=rank):
        if covered >= wanted:
            break
        chosen.add(pair)
        covered += counts[pair]
    return chosen


def tail_split(pieces: Callable[[], Iterable[tuple[str, bool]]], fraction: float,
               part: str) -> Iterator[tuple[str, bool]]:
    """The `part` (`train` or `valid`) of a stream of `(piece, ends_document)` whose last
    `fraction` of characters, the cut moved forward to the next line start, is validation.
    `pieces()` is called once to count and once to read.

    Example:
        >>> list(tail_split(lambda: [("a\\nb\\nc\\nd\\n", True)], 0.3, "valid"))
        [('d\\n', True)]
    """
    total = sum(len(text) for text, _ in pieces())
    cut = total - int(fraction * total)  # the first validation character, before moving to a line start
    position = 0
    for text, ends in pieces():
        start, position = position, position + len(text)
        if position <= cut or start >= cut:  # wholly on one side
            if (position <= cut) == (part == "train"):
                yield text, ends
            elif part == "train":
                return
            continue
        at = cut - start
        at = at if text[at - 1] == "\n" else text.find("\n", at) + 1 or len(text)
        head, tail = text[:at], text[at:]
        if part == "train" and head:
            yield head, ends and not tail  # a document cut in two ends in the validation part
        elif part == "valid" and tail:
            yield tail, ends


def source_splits(cfg: DataConfig) -> tuple[SourceSplit, SourceSplit]:
    """The training and validation splits of `cfg`: data.source and data.valid, a built-in
    corpus's own two, or data.source cut in two by data.valid_fraction (see SourceSplit).

    Raises:
        ValueError: your own data without data.valid or data.valid_fraction, or
            data.valid_fraction with a built-in corpus (it brings its validation split).
    """
    pairs = is_pairs_source(cfg.source)
    train_path = resolve_source(cfg.source, "train", verify=cfg.verify)
    builtin = train_path != Path(cfg.source)
    if cfg.valid_fraction is not None:
        if builtin:
            raise ValueError(f"data.valid_fraction: the built-in corpus {cfg.source!r} brings its own validation "
                             "split; leave data.valid_fraction unset")
        return (SourceSplit(train_path, pairs, part="train", fraction=cfg.valid_fraction),
                SourceSplit(train_path, pairs, part="valid", fraction=cfg.valid_fraction))
    if cfg.valid is not None:
        return SourceSplit(train_path, pairs), SourceSplit(Path(cfg.valid), pairs, "data.valid")
    if builtin:
        valid_path = resolve_source(cfg.source, "valid", verify=cfg.verify)
        return SourceSplit(train_path, pairs), SourceSplit(valid_path, pairs)
    raise ValueError("data.valid: give a validation file for your own data, or data.valid_fraction (e.g. 0.05) to "
                     "hold out part of data.source (built-in corpora bring their own)")


def build_tokenizer(cfg: DataConfig, train: Path | SourceSplit, out_dir: Path | None, given: Any = None):
    """`given` (a pretrained model's tokenizer), or load `cfg.tokenizer.path`, or `OUT/tokenizer.json`
    from an earlier run, or train one on the training split (`train`: its file, or a SourceSplit).
    A given, loaded or trained tokenizer is saved to `OUT/tokenizer.json`, so the run folder alone
    serves `attnlab eval`, `translate` and `generate`."""
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
    if not isinstance(train, SourceSplit):
        train = SourceSplit(Path(train), is_pairs_source(str(train)))
    kwargs = {"lowercase": False} if cfg.tokenizer.kind == "wordpiece" else {}
    tok = Tokenizer.train(train.tokenizer_corpus(cfg.text_field), kind=cfg.tokenizer.kind,
                          vocab_size=cfg.tokenizer.vocab_size,
                          special_tokens=OBJECTIVES[cfg.objective].special_tokens(cfg.tokenizer.kind), **kwargs)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        tok.save(saved)
    return tok


def _size(files: Any) -> str:
    """`1,234 tokens` of a TokenFile, `56 pairs` of a (src, tgt) pair of them."""
    return f"{files[0].num_documents:,} pairs" if isinstance(files, tuple) else f"{len(files):,} tokens"


@dataclass
class DataPipeline:
    """The data side of a run: tokenizer, train/valid token files, objective settings."""

    cfg: DataConfig
    tokenizer: Any
    train: Any  # TokenFile, or (src TokenFile, tgt TokenFile) for pairs
    valid: Any
    # how check_batches names the splits (`SourceSplit.describe`), and whether it has drawn their first batches
    split_names: tuple[str, str] = dataclasses.field(default=("the training split", "the validation split"),
                                                     repr=False, compare=False)
    checked: bool = dataclasses.field(default=False, repr=False, compare=False)

    @classmethod
    def build(cls, cfg: DataConfig, out_dir: str | os.PathLike | None = None, *, show_progress: bool = True,
              tokenizer: Any = None, check: bool = True) -> "DataPipeline":
        """Resolve the splits (`source_splits`), build or load the tokenizer (or take `tokenizer`,
        a pretrained model's), tokenise both splits (cached), and draw a first batch of each
        (`check_batches`; check=False leaves that to the caller: the Trainer draws them once its
        memory check has passed, since a batch too large for the machine is spent there first).

        Raises:
            FileNotFoundError: a source that does not exist.
            ValueError: no validation split for your own data; a source the objective does not
                read; a split with no text or pairs, or too little for one batch (`check_batches`).
        """
        out = Path(out_dir) if out_dir is not None else None
        train_split, valid_split = source_splits(cfg)
        objective, pairs = OBJECTIVES[cfg.objective], is_pairs_source(cfg.source)
        if pairs != objective.pairs:
            takes = [name for name, spec in OBJECTIVES.items() if spec.pairs]
            raise ValueError(f"data.objective={cfg.objective!r} does not fit data.source={cfg.source!r} "
                             f"({'sentence pairs' if pairs else 'plain text'}); "
                             f"{', '.join(takes)} take{'s' if len(takes) == 1 else ''} pairs, "
                             "the other objectives plain text")
        for split in (train_split, valid_split):  # before minutes of tokenizer training
            split.check_not_empty(cfg.text_field)
        tok = build_tokenizer(cfg, train_split, out, tokenizer)
        token_hash = hashlib.sha256(json.dumps(tok.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
        folder = cache_dir() / "tokens"
        eos = tok.eos_token_id if objective.eos_between_documents else None
        splits = {}
        for name, split in (("train", train_split), ("valid", valid_split)):
            key = hashlib.sha256(f"{split.cache_key()}:{token_hash}:{eos}".encode()).hexdigest()[:16]
            prefix = folder / f"{split.path.stem}-{name}-{key}"
            if pairs:
                rows = split.read_pairs() if not all(
                    Path(f"{prefix}-{side}.json").exists() for side in ("src", "tgt")) else []
                splits[name] = tuple(cls._token_file(Path(f"{prefix}-{side}"), [p[i] for p in rows], tok, None,
                                                     show_progress, source=f"{split.describe()} ({side})")
                                     for i, side in enumerate(("src", "tgt")))
            else:
                whole = split.part == "all" and split.path.is_file()
                total = split.path.stat().st_size if whole else None
                splits[name] = cls._token_file(prefix, split.read_pieces(cfg.text_field), tok, eos, show_progress,
                                               total, source=split.describe())
        pipeline = cls(cfg, tok, splits["train"], splits["valid"], (train_split.describe(), valid_split.describe()))
        if check:
            pipeline.check_batches()
        return pipeline

    @staticmethod
    def _token_file(prefix: Path, pieces, tok, eos, show_progress: bool, total: int | None = None, *,
                    source: str = "data") -> TokenFile:
        """The cached token file at `prefix`, or one built from `pieces`; building with a character
        tokenizer warns (naming `source`) about characters its vocabulary lacks."""
        if prefix.with_suffix(".json").exists():
            return TokenFile(prefix)
        from attnlab.tokenizers.char import UnknownCharacters

        unknown = UnknownCharacters.of(tok)
        if unknown is not None:
            pieces = unknown.watch(pieces)
        tokens = TokenFile.build(prefix, pieces, tok.encode, tok.vocab_size, eos_id=eos, total_chars=total,
                                 source=str(prefix.name), show_progress=show_progress)
        if unknown is not None:
            unknown.warn(source)
        return tokens

    def check_batches(self, train: str | None = None, valid: str | None = None) -> None:
        """Draw one training batch and the first validation batch now: data too short for the
        objective (an empty validation file, a text shorter than a window) is refused before the
        first step, not met at the first evaluation with nothing saved. `train`/`valid` name the
        splits in the error (default: `split_names`). Done once: a later call returns at once.

        Raises:
            ValueError: naming the split, its size, the objective and data.seq_len.
        """
        if self.checked:
            return
        train, valid = train or self.split_names[0], valid or self.split_names[1]
        fits = f"data.objective={self.cfg.objective!r} with data.seq_len={self.cfg.seq_len}"
        if self.cfg.pack != "plain":
            fits += f" and data.pack={self.cfg.pack!r}"
        try:
            self.make_batch(self.train, torch.Generator().manual_seed(0))
        except ValueError as err:
            raise ValueError(f"{train} ({_size(self.train)}) is too short for one training batch of {fits}: {err}") \
                from None
        try:
            first = next(iter(self.eval_batches(1)), None)
        except ValueError as err:
            raise ValueError(f"{valid} ({_size(self.valid)}) is too short for one validation batch of {fits}: "
                             f"{err}") from None
        if first is None:
            more = "a larger data.valid_fraction" if self.cfg.valid_fraction is not None else "more validation data"
            raise ValueError(f"{valid} ({_size(self.valid)}) fills no validation batch of {fits}; give {more} or a "
                             "smaller data.seq_len")
        self.checked = True

    # ---------------------------------------------------------------- model-side facts
    def model_overrides(self, arch: str | None = None) -> dict[str, Any]:
        """Fields the model config takes from the data: vocabulary and padding (the tokenizer's),
        arch and head (the objective's, see attnlab.training.config_resolve.objective_fields).

        Args:
            arch: the configured `model.arch`; `rnn_encoder_decoder` is kept for the
                encoder-decoder objectives (any other arch follows the objective).

        Raises:
            ConfigError: `rnn_encoder_decoder` with an objective that does not train an encoder-decoder.
        """
        tok = self.tokenizer
        return {"vocab_size": tok.vocab_size, "pad_token_id": tok.pad_token_id,
                **objective_fields(self.cfg.objective, self.cfg.nsp, arch, self.cfg.span_boundary)}

    # ---------------------------------------------------------------- batches
    @property
    def objective(self) -> Objective:
        return OBJECTIVES[self.cfg.objective]

    def _pairs_batch(self, files, index) -> dict[str, torch.Tensor]:
        """The seq2seq batch of the pairs at `index` (translation scores decode these)."""
        return pairs_batch(self.cfg, self.tokenizer, files, index)

    @property
    def pad_id(self) -> int:
        """What fills a padded row (data.pack 'pad'; masked out, no loss): the tokenizer's pad, else its EOS."""
        tok = self.tokenizer
        return next((i for i in (tok.pad_token_id, tok.eos_token_id) if i is not None), 0)

    def make_batch(self, files, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """One batch of the configured objective drawn from `files` with `generator` (rows packed
        as data.pack says)."""
        cfg = self.cfg
        if cfg.pack != "plain":
            return packing.train_batch(cfg.pack, files, cfg.batch_size, cfg.seq_len, generator, pad_id=self.pad_id)
        return self.objective.train_batch(cfg, self.tokenizer, files, generator)

    def train_batch(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return self.make_batch(self.train, generator)

    def eval_batches(self, num_batches: int) -> Iterator[dict[str, torch.Tensor]]:
        """The same `num_batches` validation batches every time (fixed order or fixed seed)."""
        cfg = self.cfg
        if cfg.pack != "plain":
            return packing.eval_batches(cfg.pack, self.valid, cfg.batch_size, cfg.seq_len, num_batches,
                                        pad_id=self.pad_id)
        return self.objective.eval_batches(cfg, self.tokenizer, self.valid, num_batches)
