"""`attnlab finetune CONFIG`: a config file -> a fine-tuned model folder.

Config (JSON or YAML), read into a typed `FinetuneJobConfig` (errors name the dotted field:
`data.label_column: expected a string or null, got 3`; unknown keys are refused likewise):

    model:   "minilm" | an attnlab folder | a Hugging Face folder | an `attnlab train` run folder
    tokenizer: optional tokenizer file/folder (default: the one beside the model)
    head: classification (default) | regression | token_classification;  pooling: first | last | mean
    data for token_classification: rows of words and per-word labels (attnlab.finetune.tokens);
    text_column / label_column default to `words` / `labels` there
    dropout: optional override of the model's dropout
    data:    {train, valid, test (optional), text_column, text_pair_column, label_column, labels (optional)}
    recipe:  attnlab.finetune.runner.Recipe fields (lr, layer_decay, reinit_layers, ...)
    seeds: [0]  probe_steps: 0  keep: 1   (the seed sweep; see attnlab.finetune.sweep)
    metric: the sweep's score (default mse for regression, else accuracy)
    threads: optional torch threads, at most the CPUs;  out_dir: where the result goes

Output folder:

    out_dir/model/          attnlab.save(model, tokenizer) — with labels.json and finetune.json
    out_dir/summary.json    config, sweep scores, valid/test metrics, timings
    out_dir/metrics.jsonl   per-step loss and lr of the kept run
    out_dir/confusion.png, confusion.txt   on the test split (else valid)
    out_dir/runs/seed-N/    each seed's Trainer run: checkpoints/, metrics.jsonl, config.json, loss.png
    out_dir/runs/probe.json the seeds' probe scores, as they are measured

Each seed is a run of the one training loop (attnlab.training.Trainer), checkpointed every
`recipe.checkpoint_every` steps and at the probe. `resume=True` (`attnlab finetune CONFIG
--resume`) continues an interrupted job: every seed from its latest checkpoint, probe scores
already measured taken from probe.json, so it ends as the uninterrupted job would have.

One job writes to an out_dir at a time (attnlab.io.lock: a second is refused, naming the first).
A fresh job refuses an out_dir that holds an earlier job's fine-tuned model or checkpoints;
`overwrite=True` (`--overwrite`) replaces them. Ctrl-C stops the current seed after its step with
a checkpoint (attnlab.training.trainer.TrainingInterrupted); `--resume` goes on from there.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from attnlab.config.load import from_dict, to_dict
from attnlab.config.model import POOLINGS
from attnlab.config.validate import ConfigError, check_types, choice, in_range, non_negative
from attnlab.io.progress import Progress
from attnlab.finetune.data import LabelMap, read_examples
from attnlab.finetune.loading import load_pretrained, with_head
from attnlab.finetune.metrics import confusion_matrix, format_confusion, plot_confusion
from attnlab.finetune.runner import Finetuner, Recipe
from attnlab.finetune.sweep import seed_sweep
from attnlab.finetune.token_runner import TokenFinetuner
from attnlab.finetune.tokens import encode_word_labels, read_word_examples, word_label_map
from attnlab.io.files import atomic_folder, atomic_write_text, json_text
from attnlab.io.lock import RunLock
from attnlab.tokenizers.char import UnknownCharacters
from attnlab.training.setup.threads import MAX_THREADS, set_threads

LABELS_FILE = "labels.json"
SETTINGS_FILE = "finetune.json"
# the scores each head's evaluation reports (runner.Finetuner.evaluate, token_runner.word_report)
METRICS = {"classification": ("accuracy", "macro_f1", "mcc"), "regression": ("mse",),
           "token_classification": ("accuracy", "macro_f1")}


@dataclass
class FinetuneDataConfig:
    """The `data` section: CSV/JSONL files (relative to the config's base folder) and columns.

    The columns default by head (None here): `text` / `label` for sequence heads, `words` /
    `labels` for token_classification. `labels` fixes the label order (default: the training
    split's labels, sorted); an empty list is the default too.
    """

    train: str
    valid: str
    test: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    labels: list[str | int | float] | None = None

    def __post_init__(self) -> None:
        check_types(self, "data")
        names = [str(x) for x in self.labels or []]  # labels are read as strings
        if len(set(names)) != len(names):
            raise ConfigError("data.labels", f"expected distinct labels, got {self.labels}")


@dataclass
class FinetuneJobConfig:
    """An `attnlab finetune` config (the module docstring); `metric` defaults by head on construction."""

    model: str
    data: FinetuneDataConfig
    out_dir: str
    tokenizer: str | None = None
    head: str = "classification"
    pooling: str | None = None
    dropout: float | None = None
    recipe: Recipe = field(default_factory=Recipe)
    seeds: list[int] = field(default_factory=lambda: [0])
    probe_steps: int = 0
    keep: int = 1
    threads: int | None = None
    metric: str | None = None

    def __post_init__(self) -> None:
        check_types(self)
        choice("head", self.head, tuple(METRICS))
        if self.pooling is not None:
            choice("pooling", self.pooling, POOLINGS)
        in_range("dropout", self.dropout, 0, 1, high_open=True, optional=True, what="a probability")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", f"expected a non-empty list of distinct integers, got {self.seeds}")
        non_negative("probe_steps", self.probe_steps, integer=True)
        if self.probe_steps > self.recipe.max_steps:  # the probe is a point of the run
            raise ConfigError("probe_steps", f"expected an integer <= recipe.max_steps ({self.recipe.max_steps}), "
                              f"got {self.probe_steps}")
        if not 1 <= self.keep <= len(self.seeds):
            raise ConfigError("keep", f"expected an integer in [1, {len(self.seeds)}] (the seeds that continue "
                              f"past the probe), got {self.keep}")
        in_range("threads", self.threads, 1, MAX_THREADS, integer=True, optional=True)
        if self.metric is None:
            self.metric = "mse" if self.head == "regression" else "accuracy"
        choice("metric", self.metric, METRICS[self.head])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FinetuneJobConfig":
        """Build and validate from a parsed config file.

        Raises:
            ConfigError (a ValueError): an unknown or missing key, or a value out of range, naming the dotted field.
            ConfigTypeError (a TypeError): a value of the wrong type, named likewise.
        """
        return from_dict(cls, data)


def run_finetune(config: dict[str, Any] | FinetuneJobConfig, *, base: Path | None = None,
                 log: Callable[[str], None] = print, show_progress: bool = True, resume: bool = False,
                 overwrite: bool = False, command: str | None = None) -> dict:
    """Fine-tune as `config` says and write the output folder (module docstring).

    Args:
        config: the parsed config file, or a FinetuneJobConfig.
        base: folder that relative paths in the config are relative to (default: the cwd).
        log: where progress lines go.
        show_progress: draw a progress line (stderr) while training.
        resume: continue the job whose runs are in out_dir/runs (module docstring); where there
            is none, a warning and a fresh start.
        overwrite: replace an earlier job's model and checkpoints in out_dir.
        command: what the out_dir lock records as its holder (default: this process's argv).

    Returns:
        the summary dict (also written to out_dir/summary.json).

    Raises:
        ValueError, TypeError, FileNotFoundError: bad config, data or model (named); a fresh job
            in an out_dir that holds an earlier job's model or checkpoints (without `overwrite`).
        RunLockedError: another live job or run writes to out_dir.
        TrainingInterrupted: Ctrl-C; the seed's checkpoint is saved, `resume=True` goes on.
    """
    job = config if isinstance(config, FinetuneJobConfig) else FinetuneJobConfig.from_dict(config)
    base = Path(base) if base is not None else Path.cwd()
    out = _resolve(base, job.out_dir)
    if resume and overwrite:
        raise ValueError("resume and overwrite: pick one (--resume continues the job in out_dir, --overwrite "
                         "replaces it)")
    with RunLock(out, what="out_dir", command=command):  # before anything is written there
        resume = _prepare_out_dir(out, resume=resume, overwrite=overwrite, log=log)
        return _run_job(job, config, base, out, log=log, show_progress=show_progress, resume=resume)


def _resolve(base: Path, p: str | None) -> Path | None:
    """A config path: absolute as it is, else relative to `base`."""
    return None if p is None else (Path(p) if Path(p).is_absolute() else base / p)


def _prepare_out_dir(out: Path, *, resume: bool, overwrite: bool, log: Callable[[str], None]) -> bool:
    """Refuse (or with `overwrite` clear) what an earlier job left in `out`: its fine-tuned model
    would be silently replaced, its checkpoints would be resumed by a job that did not ask to.
    Returns whether the job resumes (`resume` with checkpoints to resume from)."""
    model, runs = out / "model", out / "runs"
    checkpoints = any(runs.glob("seed-*/checkpoints/step-*"))
    if resume and checkpoints:
        return True
    if resume:  # nothing to resume: a fresh job, with a fresh job's checks
        warnings.warn(f"resume: {runs} holds no checkpoint; the job starts from the beginning", stacklevel=3)
    held = [f"a fine-tuned model ({model})"] * model.exists() + ["the checkpoints of an earlier job"] * checkpoints
    if held and not overwrite:
        raise ValueError(f"out_dir={str(out)!r} already holds {' and '.join(held)}; "
                         + ("continue that job with --resume, " if checkpoints else "")
                         + f"replace {'them' if len(held) > 1 else 'it'} with --overwrite, or choose another out_dir")
    if overwrite and runs.exists():
        shutil.rmtree(runs)  # the earlier job's seeds: a fresh job cannot start over its checkpoints
        log(f"overwrite: removed the earlier job's runs ({runs}); its model is replaced at the end")
    return False


def _run_job(job: FinetuneJobConfig, config: dict[str, Any] | FinetuneJobConfig, base: Path, out: Path, *,
             log: Callable[[str], None], show_progress: bool, resume: bool) -> dict:
    """The job itself (run_finetune), with out_dir locked and checked."""
    start = time.perf_counter()

    def resolve(p: str | None) -> Path | None:
        return _resolve(base, p)

    set_threads("threads", job.threads)  # capped to the CPUs, with a warning (attnlab.training.setup.threads)
    data, head = job.data, job.head
    if head == "token_classification":
        words = {"words_column": data.text_column or "words", "labels_column": data.label_column or "labels"}
        read = lambda path: read_word_examples(path, **words)  # noqa: E731
        inputs = {"words_column": words["words_column"]}
    else:
        columns = {"text_column": data.text_column or "text", "text_pair_column": data.text_pair_column,
                   "label_column": data.label_column or "label"}
        read = lambda path: read_examples(path, **columns)  # noqa: E731
        inputs = {k: columns[k] for k in ("text_column", "text_pair_column")}
    train = read(resolve(data.train))
    valid = read(resolve(data.valid))
    test = read(resolve(data.test)) if data.test else None
    if data.labels:
        labels = LabelMap(data.labels)
    else:
        labels = word_label_map(train) if head == "token_classification" else LabelMap.from_examples(train)
    if head == "regression":
        encode = lambda exs, src: [float(e.label) for e in exs]  # noqa: E731
    elif head == "token_classification":
        encode = lambda exs, src: encode_word_labels(labels, exs, src)  # noqa: E731
    else:
        encode = lambda exs, src: labels.encode(exs, src)  # noqa: E731
    y_train, y_valid = encode(train, data.train), encode(valid, data.valid)
    y_test = encode(test, data.test) if test is not None else None
    recipe, seeds, metric = job.recipe, job.seeds, job.metric
    sign = -1.0 if metric == "mse" else 1.0  # the sweep maximises: mse is an error
    base_model, tokenizer = load_pretrained(str(resolve(job.model)) if job.model != "minilm" else "minilm",
                                            resolve(job.tokenizer))
    _warn_unknown_characters(tokenizer, [(resolve(data.train), train), (resolve(data.valid), valid),
                                         (resolve(data.test), test)])
    runs = out / "runs"
    probe_file = runs / "probe.json"
    known = {int(k): float("nan") if v is None else v  # null: a score that was NaN (json_text)
             for k, v in json.loads(probe_file.read_text(encoding="utf-8")).items()} \
        if resume and probe_file.exists() else {}
    log(f"finetune: {job.model} ({base_model.config.arch}, {sum(p.numel() for p in base_model.parameters()):,} "
        f"parameters), {len(train)} train / {len(valid)} valid examples, {len(labels)} labels, seeds {seeds}")

    def start_run(seed: int) -> Finetuner:
        model = with_head(base_model, head, len(labels), pooling=job.pooling, dropout=job.dropout, seed=seed)
        runner = TokenFinetuner if head == "token_classification" else Finetuner
        run = runner(model, tokenizer, train, y_train, recipe, seed=seed, out_dir=runs / f"seed-{seed}", resume=resume)
        # the sweep's phases end at absolute steps (probe_steps, then max_steps): a run resumed
        # from a checkpoint inside a phase still stops where that phase ends
        run.target_step = 0
        plain_train = run.train

        def train_with_progress(steps: int) -> None:  # a progress line per seed and phase
            todo = min(run.target_step + steps, recipe.max_steps) - run.step_count
            bar = Progress(max(todo, 0), unit="step", desc=f"seed {seed}", enabled=show_progress and todo > 0)
            plain_train(steps, on_step=lambda h: bar.update(1, f"loss {h['loss']:.4f}"))
            bar.close()

        run.train = train_with_progress
        return run

    def evaluate(run: Finetuner) -> float:
        scores = run.evaluate(valid, y_valid)
        log(f"  seed {run.seed} step {run.step_count}: valid {metric} {scores[metric]:.4f} "
            f"(loss {run.history[-1]['loss']:.4f})" if run.history else f"  seed {run.seed}: valid {scores[metric]:.4f}")
        return sign * scores[metric]

    def record_probe(seed: int, score: float) -> None:
        known[seed] = score
        atomic_write_text(probe_file, json_text({str(k): v for k, v in known.items()}) + "\n")

    result = seed_sweep(seeds, start_run, evaluate, probe_steps=job.probe_steps, total_steps=recipe.max_steps,
                        keep=job.keep, known_probe=known, on_probe=record_probe)
    best = result.runs[result.best_seed]
    summary: dict[str, Any] = {"config": config if isinstance(config, dict) else to_dict(job),  # as given
                               "best_seed": result.best_seed, "kept": result.kept,
                               "probe": {str(k): sign * v for k, v in result.probe.items()},
                               "final": {str(k): sign * v for k, v in result.final.items()},
                               "labels": labels.labels, "valid": best.evaluate(valid, y_valid)}
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
    _save(best, tokenizer, labels, out / "model", inputs)
    atomic_write_text(out / "metrics.jsonl", "".join(json_text(h) + "\n" for h in best.history))
    summary["seconds"] = round(time.perf_counter() - start, 1)
    atomic_write_text(out / "summary.json", json_text(summary, indent=2, ensure_ascii=False) + "\n")
    shown = {k: summary[k] for k in ("valid", "test") if k in summary}
    log(f"finetune: best seed {result.best_seed}, {json_text(shown)}, {summary['seconds']} s -> {out}")
    return summary


def _warn_unknown_characters(tokenizer: Any, splits: list[tuple[Path | None, list | None]]) -> None:
    """One warning per data file for the characters a character tokenizer lacks (they become its
    unknown token; attnlab.tokenizers.char.UnknownCharacters); nothing for other tokenizers."""
    for path, examples in splits:
        unknown = UnknownCharacters.of(tokenizer)
        if unknown is None or examples is None:
            continue
        for e in examples:
            for text in (e.words if hasattr(e, "words") else (e.text, e.text_pair or "")):
                unknown.add(text)
        unknown.warn(str(path))


def _save(run: Finetuner, tokenizer: Any, labels: LabelMap, folder: Path, inputs: dict[str, str | None]) -> None:
    """attnlab.save of the model and tokenizer with labels.json and finetune.json beside them, the
    whole folder written atomically (an earlier job's model folder is replaced as a whole).
    `inputs`: the columns the model read (text_column and text_pair_column, None for single
    texts; or words_column), so that `attnlab predict` refuses a pair model given one text."""
    from attnlab.interop.serialization import save

    settings = {"max_length": run.recipe.max_length, "padding_side": run.recipe.padding_side, "pad_id": run.pad_id,
                "label_position": run.recipe.label_position, **inputs}
    from attnlab.nn.lora import lora_layers, merged_copy

    model = merged_copy(run.model) if lora_layers(run.model) else run.model  # LoRA: the adapters merged in
    with atomic_folder(folder) as tmp:
        staged = save(model, tmp / "model", tokenizer=tokenizer)
        for file in staged.iterdir():
            file.replace(tmp / file.name)
        staged.rmdir()
        (tmp / LABELS_FILE).write_text(labels.to_json(), encoding="utf-8")
        (tmp / SETTINGS_FILE).write_text(json_text(settings, indent=2) + "\n", encoding="utf-8")
