"""`attnlab predict CKPT --input FILE --output FILE`: batch inference with a fine-tuned model.

CKPT is the `model/` folder written by `attnlab finetune` (attnlab.save + labels.json). The
input is CSV/TSV/JSONL with the text (and text-pair) column; the output (.jsonl or .csv) has
one row per input row: the input columns plus `prediction` (the label) and `score` (its
probability), or the predicted number for a regression head. For a token-classification
model the input rows hold words (a JSON list, or a space-separated string in CSV) and the
output has `words` and `predictions`, one label per word (null, or `-` in CSV, for a word cut
off by max_length). Written atomically.
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

PREDICTING_HEADS = ("classification", "regression", "token_classification")  # what `attnlab finetune` trains


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict", help="label a CSV/JSONL file with a fine-tuned model", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: attnlab predict runs/pairs/model --input pairs.csv --text-pair-column text_pair "
               "--output predictions.jsonl")
    parser.add_argument("checkpoint", help="a model folder written by `attnlab finetune` (its model/ folder)")
    parser.add_argument("--input", required=True, help="input .csv, .tsv or .jsonl")
    parser.add_argument("--output", required=True, help="output .jsonl or .csv (written atomically)")
    parser.add_argument("--text-column", default=None,
                        help="text column (default text; words for token-classification models)")
    parser.add_argument("--text-pair-column", default=None, help="second text column for pair tasks")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per forward pass")
    parser.set_defaults(func=_main)


def predict_file(checkpoint: str, input_path: str, output_path: str, *, text_column: str | None = None,
                 text_pair_column: str | None = None, batch_size: int = 64) -> int:
    """Label `input_path` with the model in `checkpoint` and write `output_path`; returns the row count.

    Raises:
        FileNotFoundError: no model folder or input file.
        ValueError: a missing column, an empty file, an unknown output suffix, a batch size
            below 1, a model without a fine-tuned head, a model fine-tuned on text pairs given
            no `text_pair_column` (or one on single texts given one).
    """
    from attnlab.finetune.data import LabelMap, read_examples
    from attnlab.finetune.job import LABELS_FILE, SETTINGS_FILE
    from attnlab.finetune.runner import predict
    from attnlab.io.files import read_json
    from attnlab.interop.serialization import load

    folder, out = Path(checkpoint), Path(output_path)
    if out.suffix.lower() not in (".jsonl", ".csv"):
        raise ValueError(f"--output must end in .jsonl or .csv, got {out.name!r}")
    if out.is_dir():
        raise ValueError(f"--output {out} is a folder; give the path of a .jsonl or .csv file")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, got {batch_size}")
    model, tokenizer = load(folder, with_tokenizer=True)
    if tokenizer is None:
        raise FileNotFoundError(f"{folder} has no tokenizer.json (use the model/ folder of `attnlab finetune`)")
    if model.config.head not in PREDICTING_HEADS:
        raise ValueError(f"{folder} holds a model without a fine-tuned head (head={model.config.head!r}); predict "
                         f"needs one of {', '.join(PREDICTING_HEADS)}: give the model/ folder written by "
                         "`attnlab finetune`")
    settings = read_json(folder / SETTINGS_FILE) if (folder / SETTINGS_FILE).is_file() else {}
    labels = LabelMap.load(folder / LABELS_FILE) if (folder / LABELS_FILE).is_file() else None
    if model.config.head == "token_classification":
        rows = _predict_words(model, tokenizer, settings, labels, input_path, text_column or "words", batch_size)
        _write_rows(rows, out, token_rows=True)
        return len(rows)
    _check_pair_input(folder, settings, text_pair_column)
    text_column = text_column or "text"
    examples = read_examples(input_path, text_column=text_column, text_pair_column=text_pair_column, label_column=None)
    out_t = predict(model, tokenizer, examples, max_length=settings.get("max_length", 128),
                    pad_id=settings.get("pad_id", 0), padding_side=settings.get("padding_side", "right"),
                    batch_size=batch_size)
    rows = []
    for ex, o in zip(examples, out_t):
        row = {text_column: ex.text}
        if text_pair_column:
            row[text_pair_column] = ex.text_pair
        if model.config.head == "regression":
            row["prediction"] = float(o)
        else:
            probs = o.softmax(-1)
            k = int(probs.argmax())
            row["prediction"] = labels.labels[k] if labels is not None else k
            row["score"] = round(float(probs[k]), 6)
        rows.append(row)
    _write_rows(rows, out)
    return len(rows)


def _check_pair_input(folder: Path, settings: dict, text_pair_column: str | None) -> None:
    """Refuse to feed a pair model single texts (each would be read as a pair with an empty second
    text: a confident answer to another question), or a single-text model pairs. The columns are
    those `attnlab finetune` records in finetune.json; a folder without them is not checked.

    Raises:
        ValueError: naming the columns the model was fine-tuned on and the flag to change.
    """
    if "text_pair_column" not in settings:  # written before finetune.json recorded its columns
        return
    trained_text, trained_pair = settings.get("text_column", "text"), settings["text_pair_column"]
    if trained_pair is not None and text_pair_column is None:
        raise ValueError(f"{folder} was fine-tuned on text pairs (columns {trained_text!r} and {trained_pair!r}); "
                         "given only the first text it would answer for an empty second one: name the input's "
                         f"second text column with --text-pair-column (e.g. --text-pair-column {trained_pair})")
    if trained_pair is None and text_pair_column is not None:
        raise ValueError(f"--text-pair-column {text_pair_column!r}: {folder} was fine-tuned on single texts (column "
                         f"{trained_text!r}), not pairs; leave out --text-pair-column")


def _predict_words(model, tokenizer, settings: dict, labels, input_path: str, words_column: str,
                   batch_size: int) -> list[dict]:
    """Rows {words_column: [...], "predictions": [label or None per word]} of a token-classification model."""
    from attnlab.finetune.token_runner import predict_words
    from attnlab.finetune.tokens import read_word_examples

    examples = read_word_examples(input_path, words_column=words_column, labels_column=None)
    preds, truncated = predict_words(model, tokenizer, examples, max_length=settings.get("max_length", 128),
                                     pad_id=settings.get("pad_id", 0), padding_side=settings.get("padding_side", "right"),
                                     position=settings.get("label_position", "first"), batch_size=batch_size)
    if truncated:
        print(f"predict: {truncated} word(s) did not fit in max_length={settings.get('max_length', 128)} "
              "and have no prediction")
    name = (lambda k: labels.labels[k]) if labels is not None else (lambda k: k)
    return [{words_column: e.words, "predictions": [None if k is None else name(k) for k in row]}
            for e, row in zip(examples, preds)]


def _write_rows(rows: list[dict], out: Path, token_rows: bool = False) -> None:
    """JSONL or CSV (lists become space-separated strings, None `-`), written atomically."""
    from attnlab.io.files import atomic_write_text, json_text

    if not rows:
        raise ValueError(f"no rows to write to {out}: the input holds no examples")
    if out.suffix.lower() == ".jsonl":
        text = "".join(json_text(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        if token_rows:
            rows = [{k: " ".join("-" if x is None else str(x) for x in v) for k, v in r.items()} for r in rows]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)


def _main(args: argparse.Namespace) -> int:
    n = predict_file(args.checkpoint, args.input, args.output, text_column=args.text_column,
                     text_pair_column=args.text_pair_column, batch_size=args.batch_size)
    print(f"predict: {n} rows -> {args.output}")
    return 0
