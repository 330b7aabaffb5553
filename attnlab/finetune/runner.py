"""A fine-tuning run on the one training loop: the Recipe (plain data), and `Finetuner`, a
seeded run of a model with a task head over `attnlab.training.Trainer` and a `FinetuneTask`
(attnlab.finetune.task: the loss with GPT's auxiliary LM term, LLRD, re-init, freezing).

    run = Finetuner(model, tokenizer, examples, labels, Recipe(lr=1e-4, max_steps=150), seed=0,
                    out_dir="runs/ft/seed-0")           # checkpoints, metrics.jsonl, loss.png there
    run.train(50); run.train(100)                       # pauses and goes on (a seed sweep's probe)
    run.evaluate(valid_examples, valid_labels)          # accuracy, macro_f1, mcc (mse for regression)
    Finetuner(..., out_dir="runs/ft/seed-0", resume=True)   # after an interruption: exactly where it was

Being a Trainer run, fine-tuning has its checkpoints, exact resume, the NaN policy, token-weighted
gradient accumulation and data parallel. Without `out_dir` the run's files go to a temporary
folder removed with the run.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from attnlab.finetune.data import Example, encode_batch
from attnlab.finetune.metrics import classification_report
from attnlab.finetune.task import FinetuneTask, model_inputs
from attnlab.config.load import to_dict
from attnlab.config.validate import ConfigError, check_types, choice, in_range, non_negative, positive, sub_config
from attnlab.training.config import DEVICES, NAN_POLICIES, PRECISIONS, LoraConfig, TrainConfig
from attnlab.training.tasks.batch_loss import autocast
from attnlab.training.trainer import Trainer


@dataclass
class Recipe:
    """Optimisation and recipe options of one fine-tuning run (plain data).

    lr: the head's learning rate; layer_decay: LLRD factor (1 = off); reinit_layers: top layers
    re-initialised; freeze_embeddings / freeze_layers: frozen bottom; lm_loss_weight: lambda;
    betas, eps: AdamW's; grad_accum: micro-batches of batch_size per step (weighted by examples,
    or labelled tokens); checkpoint_every: steps between checkpoints (the last step and a sweep's
    probe are checkpointed too); nan_policy: stop or skip a step whose loss is not finite;
    precision: bf16 (or fp16, loss-scaled) autocasts the forward passes (weights and optimizer stay
    fp32), auto picks bf16 where the device runs it natively and fp32 elsewhere
    (attnlab.training.setup.precision). tensorboard, compile, activation_checkpointing: as the `train`
    section's fields of the same names.
    lora: train LoRA adapters instead of the backbone's weights (attnlab.training.config.LoraConfig:
    rank, alpha, dropout, target_modules); the new task head trains in full beside them.
    """

    lr: float = 5e-5
    layer_decay: float = 1.0
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    schedule: str = "cosine"  # constant | cosine (attnlab.training.optim.lr_factor)
    warmup_ratio: float = 0.1
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    batch_size: int = 32
    grad_accum: int = 1
    max_length: int = 128
    max_steps: int = 200
    reinit_layers: int = 0
    freeze_embeddings: bool = False
    freeze_layers: int = 0
    lm_loss_weight: float = 0.0
    padding_side: str = "right"
    label_position: str = "first"  # token classification: the sub-token of a word that carries its label
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (see above)
    checkpoint_every: int = 200
    nan_policy: str = "stop"
    device: str = "auto"  # auto | cpu | cuda
    lora: LoraConfig | None = None  # e.g. {rank: 8, alpha: 16, target_modules: [q, v]}
    tensorboard: bool = False  # event files in each run folder's tensorboard/ (pip install 'attnlab[tensorboard]')
    compile: bool = False  # torch.compile each layer (attnlab.training.setup.speedups)
    activation_checkpointing: bool = False  # recompute each layer in backward: less memory, one more forward

    def __post_init__(self):
        s = "recipe."
        check_types(self, "recipe")  # every field by its annotation (betas: a list becomes a tuple)
        for name in ("lr", "layer_decay"):
            positive(s + name, getattr(self, name))
        for name in ("batch_size", "max_length", "max_steps", "grad_accum", "checkpoint_every"):
            positive(s + name, getattr(self, name), integer=True)
        for name in ("reinit_layers", "freeze_layers"):
            non_negative(s + name, getattr(self, name), integer=True)
        choice(s + "schedule", self.schedule, ("constant", "cosine"))
        in_range(s + "warmup_ratio", self.warmup_ratio, 0, 1, high_open=True)
        # AdamW's and the schedule's: refused here by their recipe names, not by the trainer's
        # optim.* ones after the data is read and the model loaded
        for i, beta in enumerate(self.betas):
            in_range(f"{s}betas[{i}]", beta, 0, 1, high_open=True)
        positive(s + "eps", self.eps)
        non_negative(s + "weight_decay", self.weight_decay)
        non_negative(s + "grad_clip", self.grad_clip, optional=True)  # 0, like None: no clipping
        in_range(s + "min_lr_ratio", self.min_lr_ratio, 0, 1)
        non_negative(s + "lm_loss_weight", self.lm_loss_weight)
        choice(s + "padding_side", self.padding_side, ("left", "right"))
        choice(s + "label_position", self.label_position, ("first", "last"))
        choice(s + "precision", self.precision, PRECISIONS)
        choice(s + "nan_policy", self.nan_policy, NAN_POLICIES)
        choice(s + "device", self.device, DEVICES)
        if self.lora is not None and self.reinit_layers:
            raise ConfigError(s + "reinit_layers", f"{self.reinit_layers} with recipe.lora: the base weights are "
                              "frozen under LoRA, so re-initialised layers would stay random; use 0")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Recipe":
        """Raises ConfigError naming `recipe.FIELD`: unknown, of the wrong type or out of range."""
        return sub_config(cls, "recipe", data)

    def train_config(self, out_dir: str | Path, seed: int) -> TrainConfig:
        """The Trainer's run config of this recipe (every step logged; validation left to the sweep).
        Its `model` and `data` sections stay at their defaults: the Trainer gets the model and
        the task (the run's config.json records the model's own config beside it).

        Raises:
            ValueError: a recipe value the trainer rejects (betas, eps ...), naming the field.
        """
        return TrainConfig.from_dict({
            "optim": {"name": "adamw", "lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                      "weight_decay": self.weight_decay, "grad_clip": self.grad_clip or None},
            "schedule": {"name": self.schedule, "warmup_steps": int(self.warmup_ratio * self.max_steps),
                         "min_lr_ratio": self.min_lr_ratio},
            "train": {"out_dir": str(out_dir), "max_steps": self.max_steps, "grad_accum": self.grad_accum,
                      "precision": self.precision, "device": self.device, "seed": seed, "log_every": 1,
                      "eval_every": self.max_steps, "checkpoint_every": self.checkpoint_every, "keep_last": 1,
                      "nan_policy": self.nan_policy, "bleu_samples": 0, "tensorboard": self.tensorboard,
                      "compile": self.compile, "activation_checkpointing": self.activation_checkpointing},
            "lora": self._lora_section(),
        })

    def _lora_section(self) -> dict[str, Any] | None:
        """recipe.lora with the task head (new, randomly initialised) in its train_modules."""
        if self.lora is None:
            return None
        section = to_dict(self.lora)
        section["train_modules"] = list(dict.fromkeys([*section["train_modules"], "head"]))
        return section


class Finetuner:
    """One seeded fine-tuning run of a model with a task head: `train(steps)`, `evaluate(...)`.

    Args:
        model: an attnlab Encoder/Decoder with a classification or regression head.
        tokenizer: its tokenizer.
        train_examples: the training examples; train_labels: their ids (or floats).
        recipe: a Recipe.
        seed: seeds re-initialisation, dropout and the data order.
        pad_id: the padding id (default: the tokenizer's, else 0).
        out_dir: the run's folder (checkpoints/, metrics.jsonl, config.json); default a temporary one.
        resume: continue from the latest checkpoint in out_dir when there is one.
        log: where the trainer's lines go (default: nowhere).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, train_examples: Sequence[Example],
                 train_labels: Sequence[float], recipe: Recipe, *, seed: int = 0, pad_id: int | None = None,
                 out_dir: str | Path | None = None, resume: bool = False, log: Callable[[str], None] | None = None):
        self.tokenizer, self.recipe, self.seed = tokenizer, recipe, seed
        self.pad_id = pad_id if pad_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0)
        self._tmp = tempfile.TemporaryDirectory(prefix="attnlab-finetune-") if out_dir is None else None
        out = Path(self._tmp.name) if self._tmp is not None else Path(out_dir)
        self.task = FinetuneTask(train_examples, train_labels, self.encode_training, recipe, seed=seed)
        self.trainer = Trainer(recipe.train_config(out, seed), task=self.task, model=model,
                               log=log or (lambda text: None), show_progress=False)
        if resume:
            self.trainer.resume()
        self.target_step = self.trainer.step  # the step the caller has asked to reach (a pause point)

    @property
    def model(self) -> nn.Module:
        return self.trainer.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.trainer.optimizer

    @property
    def precision(self) -> str:
        """What this run computes in, "bf16" or "fp32": the recipe's precision as its Trainer resolved it."""
        return self.trainer.precision

    @property
    def step_count(self) -> int:
        return self.trainer.step

    @property
    def history(self) -> list[dict[str, float]]:
        """Per step: {"step", "loss", its parts ("cls", "lm"), "lr"}, from the run's metrics.jsonl."""
        path = self.trainer.out / "metrics.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            record = {k: float("nan") if v is None else v for k, v in json.loads(line).items()}  # null: NaN
            if "train_loss" in record:
                parts = {k: v for k, v in record.items() if k in ("cls", "lm")}
                out.append({"step": record["step"], "loss": record["train_loss"], **parts, "lr": record["lr"]})
        return out

    def encode_training(self, examples: Sequence[Example], labels: Sequence[float]) -> dict[str, Tensor]:
        """A training batch: the examples encoded as the model expects, with their labels."""
        batch = encode_batch(self.tokenizer, examples, max_length=self.recipe.max_length, pad_id=self.pad_id,
                             padding_side=self.recipe.padding_side)
        is_reg = self.model.config.head == "regression"
        batch["labels"] = torch.tensor(list(labels), dtype=torch.float if is_reg else torch.long)
        return batch

    def train(self, steps: int, on_step: Callable[[dict], None] | None = None) -> None:
        """Take `steps` more optimisation steps (up to recipe.max_steps); `on_step(record)` is
        called after each. The run is checkpointed where it stops."""
        self.target_step = min(self.target_step + steps, self.recipe.max_steps)
        self.trainer.fit(stop_at=self.target_step, on_step=on_step)

    @torch.no_grad()
    def predict(self, examples: Sequence[Example], batch_size: int = 64) -> Tensor:
        """Head outputs for examples, in order: (N, K) logits, or (N,) for regression (eagerly
        under recipe.compile: a compiled layer would compile again for eval mode)."""
        with self.trainer.eager():
            return predict(self.model, self.tokenizer, examples, max_length=self.recipe.max_length,
                           pad_id=self.pad_id, padding_side=self.recipe.padding_side, batch_size=batch_size,
                           precision=self.precision)

    def evaluate(self, examples: Sequence[Example], labels: Sequence[int]) -> dict:
        """accuracy, macro-F1, MCC and n (classification); mse (regression)."""
        out = self.predict(examples)
        if self.model.config.head == "regression":
            return {"mse": float(((out.float() - torch.tensor(labels, dtype=torch.float)) ** 2).mean()),
                    "n": len(labels)}
        return classification_report(labels, out.argmax(-1).tolist(), self.model.config.num_labels)


@torch.no_grad()
def predict(model: nn.Module, tokenizer: Any, examples: Sequence[Example], *, max_length: int = 128,
            pad_id: int = 0, padding_side: str = "right", batch_size: int = 64, precision: str = "fp32") -> Tensor:
    """Head outputs of a fine-tuned model for examples, in order (eval mode; mode restored).

    `precision` "bf16" runs the forward passes under bf16 autocast, "auto" where the device runs
    bf16 natively (attnlab.training.setup.precision). The default stays fp32: the full-precision
    outputs `attnlab predict` writes; a Finetuner passes the precision its run resolved."""
    was_training = model.training
    model.eval()
    outs = []
    device = next(model.parameters()).device
    try:
        for i in range(0, len(examples), batch_size):
            enc = encode_batch(tokenizer, examples[i:i + batch_size], max_length=max_length, pad_id=pad_id,
                               padding_side=padding_side)
            enc = {k: v.to(device) for k, v in enc.items()}
            with autocast(precision, device):
                hidden = model.features(enc["input_ids"], **model_inputs(model, enc))
                outs.append(model.apply_head(hidden, enc["attention_mask"]).float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(outs)
