"""TensorBoard logging of a run (`train.tensorboard: true`): the scalars of metrics.jsonl and a
few text samples at each evaluation, as event files in OUT/tensorboard/.

    tensorboard --logdir runs/          # every run under runs/, one curve each

Scalars, one tag per metrics.jsonl field (its value, at its step):

    training records     train_loss -> train/loss; lr, grad_norm, tokens_per_s, loss_scale,
                         elapsed_s and the loss parts (cls, lm, moe_balance ...) -> train/<field>
    evaluation records   val_loss -> valid/loss, val_ppl -> valid/ppl, bleu -> valid/bleu ...

Text: `config` (the resolved run config) at the start, and at each evaluation `samples`: greedy
continuations of the first validation windows (decoder language models) or greedy translations
of the first validation pairs (sentence-pair objectives), as a Markdown table. Other objectives
(masked LM, span corruption) and tasks without a data pipeline (fine-tuning) log none.

The `tensorboard` package is an optional extra (`pip install 'attnlab[tensorboard]'`), imported
only when a run asks for it. A resumed run hides the events its checkpoint had not reached (they
are written again), as metrics.jsonl drops their lines.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.config.validate import ConfigError
from attnlab.models.families import family
from attnlab.nn.losses import IGNORE

INSTALL = "pip install 'attnlab[tensorboard]'"
SAMPLES = 3  # validation rows sampled at each evaluation
PROMPT_TOKENS = 16  # of a decoder's prompt (the start of a validation window)
NEW_TOKENS = 48  # greedy tokens generated per sample (fewer where the positions' table ends)


def require_tensorboard() -> None:
    """Raises ConfigError naming `train.tensorboard` and the install command when the
    `tensorboard` package is missing (checked without importing it)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("train.tensorboard", f"true needs the tensorboard package, which is not installed: {INSTALL}")


def scalar_tag(field: str, evaluation: bool) -> str:
    """The tag of a metrics.jsonl field: `train_loss` -> `train/loss`, `val_ppl` -> `valid/ppl`,
    `lr` -> `train/lr`, `bleu` -> `valid/bleu`."""
    if evaluation:
        return "valid/" + field.removeprefix("val_")
    return "train/" + field.removeprefix("train_")


class TensorBoardLog:
    """One run's event writer (rank 0 only).

    Args:
        folder: the event folder (OUT/tensorboard).
        start_step: the last step already done (0 for a new run): events of later steps that an
            earlier writer left are hidden (they are about to be written again).
        fresh: a new run in this folder: earlier event files are removed first.
    """

    def __init__(self, folder: Path, *, start_step: int, fresh: bool):
        from torch.utils.tensorboard import SummaryWriter  # the optional extra: imported here only

        folder.mkdir(parents=True, exist_ok=True)
        if fresh:
            for stale in folder.glob("events.out.tfevents.*"):
                stale.unlink()
        self.writer = SummaryWriter(str(folder), purge_step=start_step + 1 if start_step else None)

    def record(self, record: dict[str, Any]) -> None:
        """The numbers of a metrics.jsonl record as scalars at its step (flags and the step left out)."""
        evaluation = "val_loss" in record
        for field, value in record.items():
            if field == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.writer.add_scalar(scalar_tag(field, evaluation), value, record["step"])
        self.writer.flush()  # a TensorBoard watching the run sees each record

    def text(self, tag: str, markdown: str, step: int) -> None:
        self.writer.add_text(tag, markdown, step)
        self.writer.flush()

    def config(self, config: dict[str, Any], step: int) -> None:
        self.text("config", "```json\n" + json.dumps(config, indent=2) + "\n```", step)

    def close(self) -> None:
        self.writer.close()


def _cell(text: str) -> str:
    """Text as one Markdown table cell: pipes escaped, newlines shown as ⏎, HTML made inert."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("\n", " ⏎ ")


@torch.no_grad()
def text_samples(task: Any, model: nn.Module, device: torch.device) -> str | None:
    """A Markdown table of greedy samples on the first validation rows of `task` (see the module
    docstring), or None where the task has none to show. Greedy decoding draws no random
    number, so sampling leaves the run's RNG streams as they were; call it in eval mode.

    Args:
        task: the run's task; samples come from a PretrainTask's data pipeline.
        model: the model being trained (eval mode).
        device: where it runs.
    """
    from attnlab.decoding import generate

    pipeline = getattr(task, "pipeline", None)
    if pipeline is None or getattr(model.config, "head", None) != "lm":
        return None
    objective, tok = pipeline.objective, pipeline.tokenizer
    batch = next(iter(pipeline.eval_batches(1)), None)
    if batch is None:
        return None
    max_len = model.config.position.max_len
    if family(objective.arch).decoding == "prompt" and "input_ids" in batch:
        prompts = batch["input_ids"][:SAMPLES, :min(PROMPT_TOKENS, max_len - 1)].to(device)
        new = max(0, min(NEW_TOKENS, max_len - prompts.shape[1]))
        out = generate(model, prompts, new, eos_token_id=tok.eos_token_id).tolist()
        P = prompts.shape[1]
        rows = [(tok.decode(row[:P]), tok.decode(row[P:])) for row in out]
        return "| prompt | greedy continuation |\n|---|---|\n" + "".join(
            f"| {_cell(a)} | {_cell(b)} |\n" for a, b in rows)
    if objective.bleu and "src_ids" in batch:
        src, mask = batch["src_ids"][:SAMPLES].to(device), batch["src_mask"][:SAMPLES].to(device)
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.pad_token_id  # as the pipeline's batches
        new = min(pipeline.cfg.max_pair_len + 1, max_len - 1)
        out = generate(model, src, new, attention_mask=mask, decoder_start_token_id=bos,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        rows = []
        for i, hyp in enumerate(out[:, 1:].tolist()):
            hyp = hyp[: hyp.index(tok.eos_token_id)] if tok.eos_token_id in hyp else hyp
            source = [t for t, real in zip(src[i].tolist(), mask[i].tolist()) if real]
            reference = [t for t in batch["labels"][i].tolist() if t != IGNORE and t != tok.eos_token_id]
            rows.append((tok.decode(source, skip_special_tokens=True), tok.decode(hyp, skip_special_tokens=True),
                         tok.decode(reference, skip_special_tokens=True)))
        return "| source | greedy translation | reference |\n|---|---|---|\n" + "".join(
            f"| {_cell(a)} | {_cell(b)} | {_cell(c)} |\n" for a, b, c in rows)
    return None
