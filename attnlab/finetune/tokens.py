"""Token classification data: rows of words with one label per word, aligned to sub-tokens.

A row holds a list of words and a list of labels of the same length: JSONL
`{"words": ["Datei", "open"], "labels": ["de", "en"]}`, or CSV/TSV with the words and the
labels as space-separated strings (`words,labels` / `Datei open,de en`). Column names are
chosen in the config (`text_column`, `label_column`; defaults `words`, `labels`).

Alignment (BERT's NER recipe, Devlin et al. 2019, https://arxiv.org/abs/1810.04805, sec. 5.3):
each word is tokenised on its own (with a leading space after the first word, which
byte-level BPE needs and WordPiece ignores), so the concatenation is the tokenisation of the
space-joined words; the word's label goes on its first sub-token (or, with
`position="last"`, its last one, which suits causal decoders that cannot look ahead; a
separate leading space token, as character tokenizers give, is skipped), and
every other position, special tokens included, gets IGNORE (-100), which the loss skips.
Words whose labelled sub-token does not fit in max_length are truncated: counted, not scored,
and predicted as None.

Notation: B batch, T tokens, W words of a row, K labels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from attnlab.finetune.data import LabelMap, _rows, strip_labels, warn_stripped_labels

IGNORE = -100


@dataclass
class WordExample:
    """One row: `words`, their `labels` (None when unlabelled) and `row`, its row number."""

    words: list[str]
    labels: list[str] | None = None
    row: int | None = None


def _as_list(value: Any, path: Path, row: int, column: str) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"{path}: row {row} column {column!r} must be a list of strings or a space-separated "
                     f"string, got {type(value).__name__}")


def read_word_examples(path: str | os.PathLike, *, words_column: str = "words",
                       labels_column: str | None = "labels") -> list[WordExample]:
    """Read token-classification rows (module docstring).

    Args:
        path: a .jsonl, .csv or .tsv file.
        words_column: the column name of the words.
        labels_column: the column name of the labels (None: unlabelled rows).

    Returns:
        the rows in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an empty file, a missing column, a row without words, or a row whose
            label count differs from its word count (each named by its row).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    out, changed = [], []
    for i, row in _rows(path):
        for option, column in (("text_column", words_column), ("label_column", labels_column)):
            if column is not None and column not in row:
                raise ValueError(f"{path}: {option}={column!r} is not a column (row {i} has columns {sorted(row)})")
        words = _as_list(row[words_column], path, i, words_column)
        if not words:
            raise ValueError(f"{path}: row {i} has no words in {words_column!r}")
        labels = None
        if labels_column is not None:
            labels, stripped = strip_labels(_as_list(row[labels_column], path, i, labels_column))
            changed += stripped
            if len(labels) != len(words):
                raise ValueError(f"{path}: row {i} has {len(words)} words but {len(labels)} labels")
        out.append(WordExample(words, labels, i))
    if not out:
        raise ValueError(f"{path} is empty: expected at least one row of words and labels")
    warn_stripped_labels(path, changed)
    return out


def word_label_map(examples: Sequence[WordExample]) -> LabelMap:
    """The sorted set of the word labels."""
    return LabelMap(sorted({x for e in examples for x in (e.labels or [])}))


def encode_word_labels(labels: LabelMap, examples: Sequence[WordExample], source: str = "data") -> list[list[int]]:
    """Label ids per word.

    Raises:
        ValueError: a label not in the set, naming the row, the word and the known labels.
    """
    out = []
    for n, e in enumerate(examples):
        ids = []
        for w, (word, label) in enumerate(zip(e.words, e.labels or [])):
            if label not in labels.index:
                where = f"row {e.row}" if e.row is not None else f"example {n}"
                raise ValueError(f"{source}: {where} word {w} ({word!r}) has label {label!r}, which is not in "
                                 f"the label set {labels.labels}")
            ids.append(labels.index[label])
        out.append(ids)
    return out


def align_words(tokenizer: Any, words: Sequence[str], word_labels: Sequence[int] | None = None, *,
                max_length: int = 128, position: str = "first") -> dict[str, Any]:
    """Token ids of one row with each word's label on its first (or last) sub-token.

    Args:
        tokenizer: an attnlab Tokenizer (its template adds the special tokens).
        words: the row's words.
        word_labels: label ids, one per word (None: all IGNORE, for prediction).
        max_length: tokens including the template's special tokens.
        position: "first" or "last" sub-token of each word carries the label.

    Returns:
        {"input_ids", "token_type_ids", "labels" (IGNORE where unlabelled), "word_index"
        (the word a labelled position belongs to, else -1): lists of length <= max_length,
        "truncated": words that did not fit}.

    Raises:
        ValueError: an unknown position, or max_length smaller than the template.
    """
    if position not in ("first", "last"):
        raise ValueError(f"position must be 'first' or 'last', got {position!r}")
    budget = max_length - tokenizer.template.num_added(False)
    if budget < 1:
        raise ValueError(f"max_length={max_length} leaves no room after the template's special tokens")
    ids: list[int] = []
    marks: list[int] = []  # word index at the labelled sub-token, else -1
    truncated = 0
    space = tokenizer.encode(" ")  # [] for WordPiece; a token of its own for characters
    for w, word in enumerate(words):
        pieces = tokenizer.encode(word if w == 0 else " " + word)
        lead = len(space) if space and w > 0 and pieces[:len(space)] == space and len(pieces) > len(space) else 0
        at = lead if position == "first" else len(pieces) - 1  # a leading space token is not the word
        if not pieces or len(ids) + at >= budget:
            truncated += 1
            ids.extend(pieces)
            marks.extend([-1] * len(pieces))
            continue
        ids.extend(pieces)
        marks.extend([w if j == at else -1 for j in range(len(pieces))])
    ids, marks = ids[:budget], marks[:budget]
    specials_before = 0
    for name, _ in tokenizer.template.single:
        if name == "$A":
            break
        specials_before += 1
    full_ids, types = tokenizer.template.apply(ids, None, tokenizer.token_to_id)
    word_index = [-1] * len(full_ids)
    word_index[specials_before:specials_before + len(marks)] = marks
    labels = [IGNORE if w < 0 or word_labels is None else int(word_labels[w]) for w in word_index]
    return {"input_ids": full_ids, "token_type_ids": types, "labels": labels, "word_index": word_index,
            "truncated": truncated}


def encode_word_batch(tokenizer: Any, examples: Sequence[WordExample], word_labels: Sequence[Sequence[int]] | None,
                      *, max_length: int, pad_id: int = 0, padding_side: str = "right",
                      position: str = "first") -> dict[str, Tensor]:
    """`align_words` for each row, padded to the batch's longest.

    Returns:
        `input_ids`, `attention_mask`, `token_type_ids`, `labels` (IGNORE at padding),
        `word_index` (-1 at padding): (B, T) long tensors; `truncated`: (B,) words cut per row.
    """
    rows = [align_words(tokenizer, e.words, None if word_labels is None else word_labels[b], max_length=max_length,
                        position=position) for b, e in enumerate(examples)]
    T, B = max(len(r["input_ids"]) for r in rows), len(rows)
    fill = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE, "word_index": -1}
    out = {k: torch.full((B, T), v, dtype=torch.long) for k, v in fill.items()}
    for b, r in enumerate(rows):
        n = len(r["input_ids"])
        cols = slice(T - n, T) if padding_side == "left" else slice(0, n)
        out["input_ids"][b, cols] = torch.tensor(r["input_ids"])
        out["attention_mask"][b, cols] = 1
        out["token_type_ids"][b, cols] = torch.tensor(r["token_type_ids"])
        out["labels"][b, cols] = torch.tensor(r["labels"])
        out["word_index"][b, cols] = torch.tensor(r["word_index"])
    out["truncated"] = torch.tensor([r["truncated"] for r in rows])
    return out


def word_predictions(logits: Tensor, word_index: Tensor, num_words: Sequence[int]) -> list[list[int | None]]:
    """Per row, the argmax label id of each word read at its labelled sub-token (None: truncated).

    Args:
        logits: (B, T, K); word_index: (B, T) from encode_word_batch; num_words: W per row.
    """
    best = logits.argmax(-1)  # (B, T)
    out = []
    for b, n in enumerate(num_words):
        row: list[int | None] = [None] * n
        for t in (word_index[b] >= 0).nonzero().flatten().tolist():
            row[int(word_index[b, t])] = int(best[b, t])
        out.append(row)
    return out


def to_jsonl(examples: Sequence[WordExample], path: str | os.PathLike) -> Path:
    """Write rows as JSONL {"words": [...], "labels": [...]} (atomically)."""
    from attnlab.io.files import atomic_write_text, json_text

    text = "".join(json_text({"words": e.words, "labels": e.labels}, ensure_ascii=False) + "\n" for e in examples)
    atomic_write_text(Path(path), text)
    return Path(path)
