"""`attnlab finetune CONFIG`: a config file -> a fine-tuned model folder.

Config (JSON or YAML):

    model:   "minilm" | an attnlab folder | a Hugging Face folder | an `attnlab train` run folder
    tokenizer: optional tokenizer file/folder (default: the one beside the model)
    head: classification (default) | regression | token_classification;  pooling: first | last | mean
    data for token_classification: rows of words and per-word labels (attnlab.finetune.tokens);
    text_column / label_column default to `words` / `labels` there
    dropout: optional override of the model's dropout
    data:    {train, valid, test (optional), text_column, text_pair_column, label_column, labels (optional)}
    recipe:  attnlab.finetune.runner.Recipe fields (lr, layer_decay, reinit_layers, ...)
    seeds: [0]  probe_steps: 0  keep: 1   (the seed sweep; see attnlab.finetune.sweep)
    threads: optional torch threads;  out_dir: where the result goes

Output folder:

    out_dir/model/          attnlab.save(model, tokenizer) — with labels.json and finetune.json
    out_dir/summary.json    config, sweep scores, valid/test metrics, timings
    out_dir/metrics.jsonl   per-step loss and lr of the kept run
    out_dir/confusion.png, confusion.txt   on the test split (else valid)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from attnlab.data.progress import Progress
from attnlab.finetune.data import LabelMap, read_examples
from attnlab.finetune.loading import load_pretrained, with_head
from attnlab.finetune.metrics import confusion_matrix, format_confusion, plot_confusion
from attnlab.finetune.runner import Finetuner, Recipe
from attnlab.finetune.sweep import seed_sweep
from attnlab.finetune.token_runner import TokenFinetuner
from attnlab.finetune.tokens import encode_word_labels, read_word_examples, word_label_map
from attnlab.utils import atomic_write_text

TOP_KEYS = {"model", "tokenizer", "head", "pooling", "dropout", "data", "recipe", "seeds", "probe_steps", "keep",
            "threads", "out_dir", "metric"}
DATA_KEYS = {"train", "valid", "test", "text_column", "text_pair_column", "label_column", "labels"}
LABELS_FILE = "labels.json"
SETTINGS_FILE = "finetune.json"


def _check(config: dict[str, Any]) -> None:
    if not isinstance(config, dict):
        raise TypeError(f"a finetune config must be a mapping, got {type(config).__name__}")
    unknown = sorted(set(config) - TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown finetune config key(s) {unknown}; known: {sorted(TOP_KEYS)}")
    for key in ("model", "data", "out_dir"):
        if key not in config:
            raise ValueError(f"finetune config needs {key!r}")
    data = config["data"]
    if not isinstance(data, dict) or "train" not in data or "valid" not in data:
        raise ValueError("finetune config 'data' needs 'train' and 'valid' files")
    unknown = sorted(set(data) - DATA_KEYS)
    if unknown:
        raise ValueError(f"unknown data key(s) {unknown}; known: {sorted(DATA_KEYS)}")


def run_finetune(config: dict[str, Any], *, base: Path | None = None, log: Callable[[str], None] = print,
                 show_progress: bool = True) -> dict:
    """Fine-tune as `config` says and write the output folder (module docstring).

    Args:
        config: the parsed config.
        base: folder that relative paths in the config are relative to (default: the cwd).
        log: where progress lines go.
        show_progress: draw a progress line (stderr) while training.

    Returns:
        the summary dict (also written to out_dir/summary.json).

    Raises:
        ValueError, TypeError, FileNotFoundError: bad config, data or model (named).
    """
    _check(config)
    start = time.perf_counter()
    base = Path(base) if base is not None else Path.cwd()

    def resolve(p: str | None) -> Path | None:
        return None if p is None else (Path(p) if Path(p).is_absolute() else base / p)

    if config.get("threads"):
        torch.set_num_threads(int(config["threads"]))
    data = config["data"]
    head = config.get("head", "classification")
    if head not in ("classification", "regression", "token_classification"):
        raise ValueError(f"head must be classification, regression or token_classification, got {head!r}")
    if head == "token_classification":
        words = {"words_column": data.get("text_column", "words"), "labels_column": data.get("label_column", "labels")}
        read = lambda path: read_word_examples(path, **words)  # noqa: E731
    else:
        columns = {k: data.get(k, d) for k, d in (("text_column", "text"), ("text_pair_column", None),
                                                   ("label_column", "label"))}
        read = lambda path: read_examples(path, **columns)  # noqa: E731
    train = read(resolve(data["train"]))
    valid = read(resolve(data["valid"]))
    test = read(resolve(data["test"])) if data.get("test") else None
    if data.get("labels"):
        labels = LabelMap(data["labels"])
    else:
        labels = word_label_map(train) if head == "token_classification" else LabelMap.from_examples(train)
    if head == "regression":
        encode = lambda exs, src: [float(e.label) for e in exs]  # noqa: E731
    elif head == "token_classification":
        encode = lambda exs, src: encode_word_labels(labels, exs, src)  # noqa: E731
    else:
        encode = lambda exs, src: labels.encode(exs, src)  # noqa: E731
    y_train, y_valid = encode(train, data["train"]), encode(valid, data["valid"])
    y_test = encode(test, data["test"]) if test is not None else None
    recipe = Recipe.from_dict(config.get("recipe", {}))
    seeds = config.get("seeds", [0])
    probe, keep = int(config.get("probe_steps", 0)), int(config.get("keep", 1))
    metric = config.get("metric", "mse" if head == "regression" else "accuracy")
    sign = -1.0 if metric == "mse" else 1.0
    base_model, tokenizer = load_pretrained(str(resolve(config["model"])) if config["model"] != "minilm" else "minilm",
                                            resolve(config.get("tokenizer")))
    log(f"finetune: {config['model']} ({base_model.config.arch}, {sum(p.numel() for p in base_model.parameters()):,} "
        f"parameters), {len(train)} train / {len(valid)} valid examples, {len(labels)} labels, seeds {seeds}")

    def start_run(seed: int) -> Finetuner:
        model = with_head(base_model, head, len(labels), pooling=config.get("pooling"),
                          dropout=config.get("dropout"), seed=seed)
        runner = TokenFinetuner if head == "token_classification" else Finetuner
        run = runner(model, tokenizer, train, y_train, recipe, seed=seed)
        plain_train = run.train

        def train_with_progress(steps: int) -> None:  # a progress line per seed and phase
            todo = min(steps, recipe.max_steps - run.step_count)
            if todo <= 0:
                return
            bar = Progress(todo, unit="step", desc=f"seed {seed}", enabled=show_progress)
            plain_train(steps, on_step=lambda h: bar.update(1, f"loss {h['loss']:.4f}"))
            bar.close()

        run.train = train_with_progress
        return run

    def evaluate(run: Finetuner) -> float:
        scores = run.evaluate(valid, y_valid)
        log(f"  seed {run.seed} step {run.step_count}: valid {metric} {scores[metric]:.4f} "
            f"(loss {run.history[-1]['loss']:.4f})" if run.history else f"  seed {run.seed}: valid {scores[metric]:.4f}")
        return sign * scores[metric]

    result = seed_sweep(seeds, start_run, evaluate, probe_steps=probe, total_steps=recipe.max_steps, keep=keep)
    best = result.runs[result.best_seed]
    summary: dict[str, Any] = {"config": config, "best_seed": result.best_seed, "kept": result.kept,
                               "probe": {str(k): sign * v for k, v in result.probe.items()},
                               "final": {str(k): sign * v for k, v in result.final.items()},
                               "labels": labels.labels, "valid": best.evaluate(valid, y_valid)}
    out = resolve(config["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    split, exs, ys = ("test", test, y_test) if test is not None else ("valid", valid, y_valid)
    if test is not None:
        summary["test"] = best.evaluate(test, y_test)
    if head != "regression":
        if head == "token_classification":  # over the words that fit in max_length
            word_preds, _ = best.predict_words(exs)
            pairs = [(g, q) for gs, qs in zip(ys, word_preds) for g, q in zip(gs, qs) if q is not None]
            ys, preds = [g for g, _ in pairs], [q for _, q in pairs]
        else:
            preds = best.predict(exs).argmax(-1).tolist()
        matrix = confusion_matrix(ys, preds, len(labels))
        table = format_confusion(matrix, labels.labels)
        atomic_write_text(out / "confusion.txt", f"{split} confusion matrix (rows gold, columns predicted)\n{table}\n")
        plot_confusion(matrix, labels.labels, out / "confusion.png", title=f"{split} confusion")
        log(f"{split} confusion matrix (rows gold, columns predicted):\n{table}")
    _save(best, tokenizer, labels, out / "model")
    atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in best.history))
    summary["seconds"] = round(time.perf_counter() - start, 1)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    shown = {k: summary[k] for k in ("valid", "test") if k in summary}
    log(f"finetune: best seed {result.best_seed}, {json.dumps(shown)}, {summary['seconds']} s -> {out}")
    return summary


def _save(run: Finetuner, tokenizer: Any, labels: LabelMap, folder: Path) -> None:
    """attnlab.save of the model and tokenizer, then labels.json and finetune.json inside it.

    The extra files are written into the folder after the atomic model write, each atomically."""
    from attnlab.serialization import save

    save(run.model, folder, tokenizer=tokenizer)
    atomic_write_text(folder / LABELS_FILE, labels.to_json())
    settings = {"max_length": run.recipe.max_length, "padding_side": run.recipe.padding_side, "pad_id": run.pad_id,
                "label_position": run.recipe.label_position}
    atomic_write_text(folder / SETTINGS_FILE, json.dumps(settings, indent=2) + "\n")
