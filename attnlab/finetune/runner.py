"""A fine-tuning run: config, the loss (with GPT's auxiliary LM term), training, evaluation.

    L = L_cls + lambda * L_lm          (Radford et al. 2018, GPT, eq. 5;
                                        https://cdn.openai.com/research-covers/language-unsupervised/language_understanding_paper.pdf)

L_cls is the cross-entropy of the head's logits (B, K); L_lm the mean next-token cross-entropy
over real (non-padding) target positions, the logits being hidden (B, T, D) @ E^T with E the
tied token embedding (B, T, V). lambda = `lm_loss_weight` (0 = off; decoders only).

Notation: B batch, T tokens, D d_model, K labels, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.finetune.data import Example, encode_batch
from attnlab.finetune.metrics import classification_report
from attnlab.finetune.recipes import freeze, llrd_param_groups, reinit_top_layers
from attnlab.training.config import PRECISIONS
from attnlab.training.optim import adam_kernel, lr_factor
from attnlab.training.steps import autocast


@dataclass
class Recipe:
    """Optimisation and recipe options of one fine-tuning run (plain data).

    lr: the head's learning rate; layer_decay: LLRD factor (1 = off); reinit_layers: top layers
    re-initialised; freeze_embeddings / freeze_layers: frozen bottom; lm_loss_weight: lambda.
    """

    lr: float = 5e-5
    layer_decay: float = 1.0
    weight_decay: float = 0.01
    schedule: str = "cosine"  # constant | cosine (attnlab.training.optim.lr_factor)
    warmup_ratio: float = 0.1
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    batch_size: int = 32
    max_length: int = 128
    max_steps: int = 200
    reinit_layers: int = 0
    freeze_embeddings: bool = False
    freeze_layers: int = 0
    lm_loss_weight: float = 0.0
    padding_side: str = "right"
    label_position: str = "first"  # token classification: the sub-token of a word that carries its label
    precision: str = "fp32"  # fp32 | bf16 (autocast for the forward passes; weights and optimizer stay fp32)

    def __post_init__(self):
        for name in ("lr", "layer_decay", "batch_size", "max_length", "max_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a number > 0, got {v!r}")
        for name in ("batch_size", "max_length", "max_steps", "reinit_layers", "freeze_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an int >= 0, got {getattr(self, name)!r}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be one of constant, cosine, got {self.schedule!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.lm_loss_weight < 0:
            raise ValueError(f"lm_loss_weight must be >= 0, got {self.lm_loss_weight}")
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be left or right, got {self.padding_side!r}")
        if self.label_position not in ("first", "last"):
            raise ValueError(f"label_position must be first or last, got {self.label_position!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be {' or '.join(PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Recipe":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown recipe option(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


def model_inputs(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The keyword arguments `model.features` takes for this batch (segments for encoders with them)."""
    kwargs = {"attention_mask": batch["attention_mask"]}
    if model.config.arch == "encoder" and model.config.type_vocab_size:
        kwargs["token_type_ids"] = batch["token_type_ids"]
    return kwargs


def lm_loss(model: nn.Module, hidden: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean next-token cross-entropy with logits hidden @ E^T (tied embedding), over positions
    t whose token t and target t + 1 are both real."""
    scale = model.config.lm_head_scale
    logits = (hidden[:, :-1] * scale) @ model.embed.token.weight.T  # (B, T-1, V)
    keep = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()  # (B, T-1)
    return F.cross_entropy(logits[keep].float(), input_ids[:, 1:][keep])


def task_loss(model: nn.Module, batch: dict[str, Tensor], labels: Tensor, lm_weight: float = 0.0
              ) -> tuple[Tensor, dict[str, float]]:
    """L = L_task + lambda * L_lm (see the module docstring); L_task is cross-entropy for
    classification heads and MSE for regression.

    Returns:
        (loss, {"cls": L_task, "lm": L_lm (when lambda > 0)}).

    Raises:
        ValueError: lm_weight > 0 on an encoder.
    """
    hidden = model.features(batch["input_ids"], **model_inputs(model, batch))  # (B, T, D)
    out = model.apply_head(hidden, batch["attention_mask"])
    if model.config.head == "regression":
        main = F.mse_loss(out.float(), labels.float())
    elif model.config.head == "token_classification":  # (B, T, K) vs (B, T) with IGNORE = -100 skipped
        main = F.cross_entropy(out.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
    else:
        main = F.cross_entropy(out.float(), labels)
    parts = {"cls": main.item()}
    if lm_weight > 0:
        if model.config.arch != "decoder":
            raise ValueError("lm_loss_weight > 0 needs a decoder (the auxiliary LM loss is GPT's)")
        aux = lm_loss(model, hidden, batch["input_ids"], batch["attention_mask"])
        parts["lm"] = aux.item()
        return main + lm_weight * aux, parts
    return main, parts


class Finetuner:
    """One seeded fine-tuning run of a model with a task head: `train(steps)`, `evaluate(...)`.

    Args:
        model: an attnlab Encoder/Decoder with a classification or regression head.
        tokenizer: its tokenizer.
        train_examples: the training examples; train_labels: their ids (or floats).
        recipe: a Recipe.
        seed: seeds re-initialisation, dropout and the data order.
        pad_id: the padding id (default: the tokenizer's, else 0).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, train_examples: Sequence[Example],
                 train_labels: Sequence[float], recipe: Recipe, *, seed: int = 0, pad_id: int | None = None):
        if not train_examples:
            raise ValueError("train_examples is empty")
        self.model, self.tokenizer, self.recipe, self.seed = model, tokenizer, recipe, seed
        self.examples, self.labels = list(train_examples), list(train_labels)
        self.pad_id = pad_id if pad_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0)
        if recipe.reinit_layers:
            reinit_top_layers(model, recipe.reinit_layers, seed=seed)
        if recipe.freeze_embeddings or recipe.freeze_layers:
            freeze(model, embeddings=recipe.freeze_embeddings, layers=recipe.freeze_layers)
        groups = llrd_param_groups(model, recipe.lr, recipe.layer_decay, recipe.weight_decay)
        self.optimizer = torch.optim.AdamW([{k: g[k] for k in ("params", "lr", "weight_decay")} for g in groups],
                                           lr=recipe.lr, betas=(0.9, 0.999), eps=1e-8,
                                           **adam_kernel(p for g in groups for p in g["params"]))
        warmup = int(recipe.warmup_ratio * recipe.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(  # each group's lr times the shared factor
            self.optimizer, lambda s: lr_factor(recipe.schedule, s, total_steps=recipe.max_steps,
                                                warmup_steps=warmup, min_lr_ratio=recipe.min_lr_ratio))
        self.generator = torch.Generator().manual_seed(seed)
        self.step_count, self._order, self._pos = 0, [], 0
        self.history: list[dict[str, float]] = []

    def _next_indices(self) -> list[int]:
        out = []
        while len(out) < self.recipe.batch_size:
            if self._pos >= len(self._order):
                self._order = torch.randperm(len(self.examples), generator=self.generator).tolist()
                self._pos = 0
            take = self._order[self._pos:self._pos + self.recipe.batch_size - len(out)]
            self._pos += len(take)
            out.extend(take)
        return out

    def batch(self, examples: Sequence[Example]) -> dict[str, Tensor]:
        """Encode examples as the model expects (padding side and length from the recipe)."""
        device = next(self.model.parameters()).device
        enc = encode_batch(self.tokenizer, examples, max_length=self.recipe.max_length, pad_id=self.pad_id,
                           padding_side=self.recipe.padding_side)
        return {k: v.to(device) for k, v in enc.items()}

    def training_batch(self, indices: Sequence[int]) -> tuple[dict[str, Tensor], Tensor]:
        """(model inputs, labels) of the training examples at `indices`."""
        batch = self.batch([self.examples[i] for i in indices])
        is_reg = self.model.config.head == "regression"
        labels = torch.tensor([self.labels[i] for i in indices], dtype=torch.float if is_reg else torch.long)
        return batch, labels

    def train(self, steps: int, on_step: Callable[[dict], None] | None = None) -> None:
        """Take `steps` optimisation steps (stops at recipe.max_steps); `on_step(history entry)`
        is called after each."""
        self.model.train()
        for _ in range(steps):
            if self.step_count >= self.recipe.max_steps:
                return
            batch, labels = self.training_batch(self._next_indices())
            with torch.random.fork_rng(devices=[]):  # dropout from this run's seed, not the global RNG
                torch.manual_seed(self.seed * 1_000_003 + self.step_count)
                with autocast(self.recipe.precision, batch["input_ids"].device):
                    loss, parts = task_loss(self.model, batch, labels.to(batch["input_ids"].device),
                                            self.recipe.lm_loss_weight)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            if not math.isfinite(loss.item()):
                raise ValueError(f"loss is {float(loss)} at step {self.step_count}; lower the learning rate")
            if self.recipe.grad_clip:
                nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]],
                                         self.recipe.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.step_count += 1
            self.history.append({"step": self.step_count, "loss": loss.item(), **parts,
                                 "lr": self.optimizer.param_groups[-1]["lr"]})
            if on_step is not None:
                on_step(self.history[-1])

    @torch.no_grad()
    def predict(self, examples: Sequence[Example], batch_size: int = 64) -> Tensor:
        """Head outputs for examples, in order: (N, K) logits, or (N,) for regression."""
        return predict(self.model, self.tokenizer, examples, max_length=self.recipe.max_length,
                       pad_id=self.pad_id, padding_side=self.recipe.padding_side, batch_size=batch_size,
                       precision=self.recipe.precision)

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
    """Head outputs of a fine-tuned model for examples, in order (eval mode; mode restored;
    `precision` "bf16" runs the forward passes under bf16 autocast)."""
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
