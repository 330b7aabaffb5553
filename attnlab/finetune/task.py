"""A fine-tuning head as a Trainer task: labelled examples in seeded epochs, the head's loss
(with GPT's auxiliary LM term), layer-wise lr decay, re-initialisation and freezing.

    L = L_task + lambda * L_lm          (Radford et al. 2018, GPT, eq. 5;
                                         https://cdn.openai.com/research-covers/language-unsupervised/language_understanding_paper.pdf)

L_task is the cross-entropy of the head's logits (B, K) (per labelled sub-token for token
classification), or the MSE of a regression head; L_lm the mean next-token cross-entropy over
real (non-padding) target positions, the logits being hidden (B, T, D) @ E^T with E the tied token
embedding (B, T, V). lambda = `lm_loss_weight` (0 = off; decoders only).

    task = FinetuneTask(examples, labels, encode, recipe, seed=0)   # encode: (examples, labels) -> batch
    Trainer(recipe.train_config(out_dir, seed), task=task, model=model).fit()

Data order: epoch e visits the examples in the e-th permutation drawn from a generator seeded
with `seed`; a batch that crosses an epoch's end continues in the next one. The position
(permutations drawn, index within the current one) is the task's checkpoint state, so a
resumed run takes the same batches.

Weight of a batch (attnlab.training.tasks.protocol): its examples for sequence classification and
regression, its labelled sub-tokens (one per word) for token classification.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.finetune.recipes import freeze, llrd_param_groups, reinit_top_layers
from attnlab.models.families import family
from attnlab.training.tasks.protocol import StepLoss, Task

IGNORE = -100


def model_inputs(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The keyword arguments `model.features` takes for this batch (segments for encoders with them)."""
    kwargs = {"attention_mask": batch["attention_mask"]}
    if family(model.config).reads("token_type_ids") and model.config.type_vocab_size:
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
    """L = L_task + lambda * L_lm (see the module docstring).

    Returns:
        (loss, {"cls": L_task, "lm": L_lm (when lambda > 0)}).

    Raises:
        ValueError: lm_weight > 0 on an encoder.
    """
    hidden = model.features(batch["input_ids"], **model_inputs(model, batch))  # (B, T, D)
    out = model.apply_head(hidden, batch["attention_mask"])
    if model.config.head == "regression":
        main = F.mse_loss(out.float(), labels.float())
    elif model.config.head == "token_classification":  # (B, T, K) vs (B, T) with IGNORE skipped
        main = F.cross_entropy(out.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
    else:
        main = F.cross_entropy(out.float(), labels)
    parts = {"cls": main.item()}
    if lm_weight > 0:
        if family(model.config).decoding != "prompt":
            raise ValueError("lm_loss_weight > 0 needs a decoder (the auxiliary LM loss is GPT's)")
        aux = lm_loss(model, hidden, batch["input_ids"], batch["attention_mask"])
        parts["lm"] = aux.item()
        return main + lm_weight * aux, parts
    return main, parts


class FinetuneTask(Task):
    """Labelled examples and a task head's loss.

    Args:
        examples: the training examples (any type `encode` takes).
        labels: their labels (ids, floats, or per-word id lists).
        encode: (examples, labels) -> batch dict with input_ids, attention_mask, token_type_ids
            and labels.
        recipe: a finetune Recipe (batch size, lm_loss_weight, layer_decay, reinit, freezing).
        seed: seeds the data order and the re-initialisation.
    """

    def __init__(self, examples: Sequence[Any], labels: Sequence[Any],
                 encode: Callable[[list, list], dict[str, Tensor]], recipe: Any, *, seed: int = 0):
        if not examples:
            raise ValueError("train_examples is empty")
        self.examples, self.labels = list(examples), list(labels)
        self.encode, self.recipe, self.seed = encode, recipe, seed
        self._generator = torch.Generator().manual_seed(seed)
        self._order: list[int] = []
        self._epochs, self._pos = 0, 0

    # ---------------------------------------------------------------- data
    def _next_epoch(self) -> None:
        self._order = torch.randperm(len(self.examples), generator=self._generator).tolist()
        self._epochs, self._pos = self._epochs + 1, 0

    def next_indices(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.recipe.batch_size:
            if self._pos >= len(self._order):
                self._next_epoch()
            take = self._order[self._pos:self._pos + self.recipe.batch_size - len(out)]
            self._pos += len(take)
            out.extend(take)
        return out

    def train_batch(self, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """The next batch in the seeded epoch order (the trainer's generator is not used)."""
        indices = self.next_indices()
        return self.encode([self.examples[i] for i in indices], [self.labels[i] for i in indices])

    def state_dict(self) -> dict[str, int]:
        return {"epochs": self._epochs, "pos": self._pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._generator = torch.Generator().manual_seed(self.seed)
        self._order, self._epochs, self._pos = [], 0, 0
        for _ in range(int(state.get("epochs", 0))):  # replay the permutations drawn so far
            self._next_epoch()
        self._pos = int(state.get("pos", 0))

    # ---------------------------------------------------------------- loss
    def weight(self, batch: dict[str, Tensor]) -> int:
        labels = batch["labels"]
        return int((labels != IGNORE).sum()) if labels.dim() == 2 else len(labels)

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> StepLoss:
        loss, parts = task_loss(model, batch, batch["labels"], self.recipe.lm_loss_weight)
        return StepLoss(loss, parts)

    def evaluate(self, model: nn.Module, device: torch.device, precision: str) -> dict[str, float]:
        """No validation in the loop: the seed sweep evaluates on the validation split (Finetuner.evaluate)."""
        return {}

    # ---------------------------------------------------------------- parameters
    def prepare(self, model: nn.Module) -> None:
        """Re-initialise the top layers, freeze the bottom (recipe), before the optimizer is built."""
        r = self.recipe
        if r.reinit_layers:
            reinit_top_layers(model, r.reinit_layers, seed=self.seed)
        if r.freeze_embeddings or r.freeze_layers:
            freeze(model, embeddings=r.freeze_embeddings, layers=r.freeze_layers)

    def param_groups(self, model: nn.Module, lr: float, weight_decay: float) -> list[dict]:
        """Layer-wise lr decay groups: `lr_scale` = decay^(L + 1 - depth) (attnlab.finetune.recipes)."""
        return llrd_param_groups(model, lr, self.recipe.layer_decay, weight_decay)
