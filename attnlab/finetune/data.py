"""Labelled examples from CSV/TSV/JSONL files, a label map, and padded batches.

A file holds one example per row with a text column, an optional text-pair column and a
label column (names chosen in the config). Errors name the file, the row (1-based, the
header of a CSV being row 1) and the column.

Notation: B batch, T tokens.
"""

from __future__ import annotations

import csv
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from attnlab.data.sources import csv_dialect


@dataclass
class Example:
    """One labelled example: `text`, optional `text_pair`, `label` (a string; None when
    unlabelled), and `row`, its row number in the file it came from (for error messages)."""

    text: str
    text_pair: str | None = None
    label: str | None = None
    row: int | None = None


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, dict) from a .jsonl, .csv or .tsv file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}: row {i} is not valid JSON ({err.msg})") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{path}: row {i} must be a JSON object, got {type(obj).__name__}")
                yield i, obj
    elif suffix in (".csv", ".tsv"):
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, **csv_dialect(path))  # the header names the columns
            for i, row in enumerate(reader, start=2):
                if None in row:  # DictReader files fields beyond the header under None: they would be lost
                    raise _extra_fields(path, i, reader.fieldnames, row[None])
                yield i, row
            if reader.fieldnames is None:
                return
    else:
        raise ValueError(f"{path}: data files must end in .csv, .tsv or .jsonl, got {suffix or 'no suffix'!r}")


def _extra_fields(path: Path, row: int, header: Sequence[str], extra: Sequence[str]) -> ValueError:
    """A row with more fields than the header names (its extra fields would be dropped silently)."""
    cause = "a tab inside a text?" if path.suffix.lower() == ".tsv" else \
        "a comma inside a text that is not in double quotes?"
    return ValueError(f"{path}: row {row} has {len(header) + len(extra)} fields, but the header names "
                      f"{len(header)} columns ({', '.join(header)}); the extra {extra!r} would be lost ({cause} "
                      "Name every column in the header, or fix the row)")


def strip_labels(labels: Sequence[str]) -> tuple[list[str], list[str]]:
    """(labels without surrounding whitespace, the ones that had some): `pos ` and `pos` are
    one class, not two (a stray space in a spreadsheet cell is invisible there)."""
    stripped = [x.strip() for x in labels]
    return stripped, [x for x, y in zip(labels, stripped) if x != y]


def warn_stripped_labels(path: str | os.PathLike, changed: Sequence[str]) -> None:
    """One warning per file for the labels `strip_labels` changed: how many, and an example."""
    if changed:
        warnings.warn(f"{path}: {len(changed)} label(s) had spaces around them (e.g. {changed[0]!r}); they are read "
                      f"without, so {changed[0]!r} and {changed[0].strip()!r} are one class", UserWarning, stacklevel=3)


def read_examples(path: str | os.PathLike, *, text_column: str = "text", text_pair_column: str | None = None,
                  label_column: str | None = "label") -> list[Example]:
    """Read labelled (or, with label_column=None, unlabelled) examples.

    Args:
        path: a .csv, .tsv or .jsonl file.
        text_column: the text's column (CSV header / JSON key).
        text_pair_column: the second text's column, for pairs.
        label_column: the label's column.

    Returns:
        the examples in file order; labels without surrounding whitespace (a warning says how
        many had some).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an empty file, a column that does not exist (named, with the columns
            there are), a row with an empty text or label (named by its row number), or a
            CSV/TSV row with more fields than its header names.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    wanted = [("text_column", text_column), ("text_pair_column", text_pair_column), ("label_column", label_column)]
    out = []
    for i, row in _rows(path):
        for option, column in wanted:
            if column is not None and column not in row:
                raise ValueError(f"{path}: {option}={column!r} is not a column (row {i} has columns "
                                 f"{sorted(row)})")
        values = {}
        for option, column in wanted:
            if column is None:
                values[option] = None
                continue
            value = row[column]
            if value is None or (isinstance(value, str) and not value.strip() and option != "text_pair_column"):
                raise ValueError(f"{path}: row {i} has an empty {column!r}")
            values[option] = str(value)
        out.append(Example(values["text_column"], values["text_pair_column"], values["label_column"], i))
    if not out:
        raise ValueError(f"{path} is empty: expected a header and at least one example row")
    if label_column is not None:
        labels, changed = strip_labels([e.label for e in out])
        for e, label in zip(out, labels):
            e.label = label
        warn_stripped_labels(path, changed)
    return out


class LabelMap:
    """Label strings <-> ids 0..K-1, in the order given (JSON-serialisable as a list)."""

    def __init__(self, labels: Sequence[str]):
        labels = [str(x) for x in labels]
        if not labels:
            raise ValueError("labels must not be empty")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be distinct, got {labels}")
        self.labels = labels
        self.index = {x: i for i, x in enumerate(labels)}

    @classmethod
    def from_examples(cls, examples: Sequence[Example]) -> "LabelMap":
        """The sorted set of the examples' labels (numbers sort numerically when all are)."""
        found = {e.label for e in examples if e.label is not None}
        try:
            order = sorted(found, key=float)
        except ValueError:
            order = sorted(found)
        return cls(order)

    def __len__(self) -> int:
        return len(self.labels)

    def encode(self, examples: Sequence[Example], source: str = "data") -> list[int]:
        """Label ids of the examples.

        Raises:
            ValueError: a label not in the map, naming its row in the file (else the 0-based
                example index) and the known labels.
        """
        ids = []
        for n, e in enumerate(examples):
            if e.label not in self.index:
                where = f"row {e.row}" if e.row is not None else f"example {n}"
                raise ValueError(f"{source}: {where} has label {e.label!r}, which is not in the label set "
                                 f"{self.labels}")
            ids.append(self.index[e.label])
        return ids

    def to_json(self) -> str:
        from attnlab.io.files import json_text

        return json_text({"labels": self.labels}, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LabelMap":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("labels"), list):
            raise ValueError(f"{path}: expected {{\"labels\": [...]}}")
        return cls(data["labels"])


def encode_batch(tokenizer: Any, examples: Sequence[Example], *, max_length: int, pad_id: int = 0,
                 padding_side: str = "right") -> dict[str, Tensor]:
    """Tokenise with the tokenizer's template, truncate to max_length, pad to the batch's longest.

    Padding is done here (with `pad_id`, default the tokenizer's pad token, else 0) so that
    tokenizers without a pad token (characters) work too; the attention mask marks real tokens.

    Returns:
        `input_ids`, `attention_mask`, `token_type_ids`: (B, T) long tensors.
    """
    texts = [e.text for e in examples]
    pairs = [e.text_pair or "" for e in examples] if any(e.text_pair is not None for e in examples) else None
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    ids, types = enc["input_ids"], enc.get("token_type_ids") or [[0] * len(r) for r in enc["input_ids"]]
    T = max(len(r) for r in ids)
    B = len(ids)
    out_ids = torch.full((B, T), pad_id, dtype=torch.long)
    out_mask = torch.zeros(B, T, dtype=torch.long)
    out_types = torch.zeros(B, T, dtype=torch.long)
    for b, (row, ty) in enumerate(zip(ids, types)):
        n = len(row)
        cols = slice(T - n, T) if padding_side == "left" else slice(0, n)
        out_ids[b, cols] = torch.tensor(row, dtype=torch.long)
        out_mask[b, cols] = 1
        out_types[b, cols] = torch.tensor(ty, dtype=torch.long)
    return {"input_ids": out_ids, "attention_mask": out_mask, "token_type_ids": out_types}
