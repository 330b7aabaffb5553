"""Reading a user's own data: text files and folders, TSV/CSV sentence pairs, JSONL.

A *source* string is either the name of a built-in corpus (`shakespeare`, `de-en`,
`python-docs`, see `corpora.py`) or a path:

| path                         | read as                                               |
|------------------------------|-------------------------------------------------------|
| folder                       | every `*.txt`, `*.md`, `*.rst` file below it, one document each |
| `*.txt` (and anything else)  | documents separated by a form feed line (else the whole file)   |
| `*.jsonl`                    | one JSON object per line: `text_field` (text) or `src_field`/`tgt_field` (pairs) |
| `*.tsv`, `*.csv`             | pairs: columns `src_column`, `tgt_column` (a header row is skipped) |
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

TEXT_SUFFIXES = (".txt", ".md", ".rst")


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"data source {str(path)!r} does not exist (expected a file, a folder or a "
                                "built-in corpus name)")


def read_documents(path: str | os.PathLike, *, text_field: str = "text") -> Iterator[str]:
    """Yield the documents of a text source.

    Args:
        path: a file or folder as in the module table.
        text_field: the key holding the text in a JSONL file.

    Raises:
        FileNotFoundError: no such path.
        ValueError: a JSONL line that is not an object with `text_field`, or a folder with no text files.
    """
    path = Path(path)
    _check_exists(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TEXT_SUFFIXES))
        if not files:
            raise ValueError(f"folder {str(path)!r} holds no {', '.join(TEXT_SUFFIXES)} files")
        for file in files:
            yield file.read_text(encoding="utf-8", errors="replace")
        return
    if path.suffix == ".jsonl":
        for number, record in _jsonl(path):
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise ValueError(f"{path}:{number}: expected an object with a string field {text_field!r}")
            yield record[text_field]
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    for doc in text.split("\n\f\n"):
        if doc.strip():
            yield doc


def read_pieces(path: str | os.PathLike, *, text_field: str = "text",
                max_chars: int = 1 << 22) -> Iterator[tuple[str, bool]]:
    """Like `read_documents`, but streams: yields `(piece, ends_document)` with pieces of at
    most about `max_chars` characters cut at line ends, so a plain text file larger than
    memory is read a piece at a time.
    """
    path = Path(path)
    _check_exists(path)
    if path.is_dir() or path.suffix == ".jsonl":
        for doc in read_documents(path, text_field=text_field):
            yield doc, True
        return
    buffer: list[str] = []
    size = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line == "\f\n" or line == "\f":
                if buffer and buffer[-1].endswith("\n"):
                    buffer[-1] = buffer[-1][:-1]  # the separator's leading newline
                text = "".join(buffer)
                if text.strip():
                    yield text, True
                buffer, size = [], 0
                continue
            buffer.append(line)
            size += len(line)
            if size >= max_chars:
                yield "".join(buffer), False
                buffer, size = [], 0
    text = "".join(buffer)
    if text.strip():
        yield text, True


def _jsonl(path: Path) -> Iterator[tuple[int, object]]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None


# What a header row calls the columns of a pairs or examples file (compared in lower case), and
# the languages (English names, ISO 639-1 codes) pair files name their columns after.
COLUMN_NAMES = frozenset("""
    src source tgt target text text_a text_b text_pair sentence sentence1 sentence2 label labels input
    output prompt completion response question answer context translation original reference
    hypothesis premise id words
    english german deutsch french spanish italian dutch portuguese russian chinese japanese korean
    arabic czech polish turkish swedish finnish danish norwegian romanian hungarian greek ukrainian hindi
    en de fr es it nl pt ru zh ja ko ar cs pl tr sv fi da no ro hu el uk hi
""".split())


def csv_dialect(path: str | os.PathLike) -> dict[str, Any]:
    """`csv.reader` arguments for a delimited file, the same wherever one is read: `.tsv` is tab
    separated without quoting (a quote is text: `"Hi," she said`), `.csv` is RFC 4180 (commas,
    double-quoted fields)."""
    return {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if Path(path).suffix.lower() == ".tsv" else {}


def is_header(row: Sequence[str]) -> bool:
    """Whether the first row of a delimited file names its columns instead of holding data: its
    non-empty cells are distinct and each is a known column name (`COLUMN_NAMES`, or words of it
    joined by `_`, `-` or a space: `source_text`). Two equal cells are data (a UI string
    translated as itself, `Text,Text`), as is anything else unknown.

    Example:
        >>> is_header(["src", "tgt"]), is_header(["", "English", "German"]), is_header(["Text", "Text"])
        (True, True, False)
    """
    cells = [cell.strip().lower() for cell in row if cell.strip()]
    words = lambda cell: {w for w in re.split(r"[_\- ]+", cell) if w}
    known = lambda cell: cell in COLUMN_NAMES or bool(words(cell)) and words(cell) <= COLUMN_NAMES
    return bool(cells) and len(set(cells)) == len(cells) and all(known(cell) for cell in cells)


def read_pairs(path: str | os.PathLike, *, src_column: int = 0, tgt_column: int = 1, src_field: str = "src",
               tgt_field: str = "tgt") -> list[tuple[str, str]]:
    """(source, target) sentence pairs from a TSV, CSV or JSONL file.

    Args:
        path: `*.tsv` (tab separated, no quoting), `*.csv` (RFC 4180 quoting) or `*.jsonl`.
        src_column: 0-based column of the source side in TSV/CSV rows.
        tgt_column: 0-based column of the target side in TSV/CSV rows.
        src_field: key of the source side in JSONL objects.
        tgt_field: key of the target side in JSONL objects.

    Returns:
        the pairs in file order; rows with an empty side are skipped, and so is a first row of
        column names (`is_header`: `src,tgt`, `english,german`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown extension, or a row with too few columns / missing fields.
    """
    path = Path(path)
    _check_exists(path)
    pairs = []
    if path.suffix == ".jsonl":
        for number, record in _jsonl(path):
            if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in (src_field, tgt_field)):
                raise ValueError(f"{path}:{number}: expected an object with string fields {src_field!r} and {tgt_field!r}")
            pairs.append((record[src_field], record[tgt_field]))
    elif path.suffix in (".tsv", ".csv"):
        with open(path, encoding="utf-8", newline="") as f:
            seen_first = False
            for number, row in enumerate(csv.reader(f, **csv_dialect(path)), 1):
                if not row:
                    continue
                if not seen_first:
                    seen_first = True
                    if is_header(row):  # column names, never a training pair
                        continue
                if len(row) <= max(src_column, tgt_column):
                    raise ValueError(f"{path}:{number}: {len(row)} column(s), need column {max(src_column, tgt_column)}")
                pairs.append((row[src_column].strip(), row[tgt_column].strip()))
    else:
        raise ValueError(f"pairs file {str(path)!r}: expected a .tsv, .csv or .jsonl extension")
    return [(s, t) for s, t in pairs if s and t]


def resolve_source(source: str, split: str = "train", *, verify: bool = True) -> Path:
    """A built-in corpus name -> its fetched split file; a path -> itself.

    Args:
        verify: for a built-in corpus, refuse a package whose sha256 is not a known-good one
            (`data.verify` of a run config; see attnlab.data.corpora.fetch).

    Raises:
        ValueError: `split` is not train/valid.
    """
    if split not in ("train", "valid"):
        raise ValueError(f"split must be 'train' or 'valid', got {split!r}")
    from attnlab.data.corpora import split_files

    if is_builtin(source):
        return split_files(source, verify=verify)[split]
    return Path(source)


def is_builtin(source: str) -> bool:
    """Whether a source string names a built-in corpus rather than a path: a corpus name with
    no file or folder of that name in the working folder (which would win)."""
    from attnlab.data.corpora import CORPORA

    return source in CORPORA and not os.path.exists(source)


def is_pairs_source(source: str) -> bool:
    """Whether a source holds sentence pairs (a pairs corpus, a TSV/CSV file)."""
    from attnlab.data.corpora import CORPORA

    if is_builtin(source):
        return CORPORA[source].kind == "pairs"
    return Path(source).suffix in (".tsv", ".csv")
