"""What the Trainer trains on: a task = batches + loss + metrics (+ parameter groups, model
preparation, data position). Pretraining objectives (`training.tasks.pretrain.PretrainTask`) and
fine-tuning heads (`finetune.tasks_run`) are tasks of the one loop.

    class MyTask:
        def train_batch(self, generator) -> dict[str, Tensor]       # one micro-batch, drawn with generator
        def weight(self, batch) -> int                               # units the loss is a mean over
        def loss(self, model, batch, *, label_smoothing) -> StepLoss  # that mean (+ named parts)
        def evaluate(self, model, device, precision) -> dict[str, float]  # {} = no validation

    optional:
        def prepare(self, model) -> None                # freeze, re-initialise (before the optimizer)
        def param_groups(self, model, lr, weight_decay) -> list[dict]   # e.g. layer-wise lr decay
        def state_dict(self) -> dict / load_state_dict(state)          # data position beyond the generator

Weighting (gradient accumulation, data parallel): `loss` is the mean over the batch's `weight`
units (label tokens for language modelling, examples for sequence classification). The loss of
a step over micro-batches i is

    L = sum_i weight_i * loss_i / sum_i weight_i      (= sum of token losses / tokens of the step)

so every token counts the same however the micro-batches are padded or masked (not the mean of
micro-batch means); under data parallel the sum runs over all ranks' micro-batches.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from attnlab.nn.moe import MoEFeedForward, balance_loss


class StepLoss(NamedTuple):
    """A micro-batch's loss: `loss` the mean over the batch's `weight` units; `parts` its named
    components (floats: the classification and auxiliary LM terms ...), for the log."""

    loss: Tensor
    parts: dict[str, float]


class Task(Protocol):
    """What the Trainer trains on (module docstring). The first four methods are required; the
    others have defaults here, which a task gets by subclassing `Task` (the tasks of attnlab do)
    or through `as_task` (any object with the four)."""

    ordered: bool = False  # batches read in order (a segment memory's streams): not shardable over ranks

    def train_batch(self, generator: torch.Generator) -> dict[str, Tensor]: ...

    def weight(self, batch: dict[str, Tensor]) -> int: ...

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> StepLoss: ...

    def evaluate(self, model: nn.Module, device: torch.device, precision: str) -> dict[str, float]: ...

    def prepare(self, model: nn.Module) -> None:
        """Freeze or re-initialise parts of the model, before the optimizer sees its parameters."""

    def param_groups(self, model: nn.Module, lr: float, weight_decay: float) -> list[dict] | None:
        """The optimizer's parameter groups (e.g. layer-wise lr decay); None: the usual decay groups."""
        return None

    def state_dict(self) -> dict:
        """The data position beyond the data generator (an epoch's order), for a checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""


REQUIRED = ("train_batch", "weight", "loss", "evaluate")
OPTIONAL = ("prepare", "param_groups", "state_dict", "load_state_dict")


class _WithDefaults(Task):
    """A task object lacking some of Task's optional methods, given Task's defaults for them;
    every attribute it has is its own."""

    def __init__(self, task: object):
        self.task = task
        for name in OPTIONAL:
            if callable(getattr(task, name, None)):
                setattr(self, name, getattr(task, name))

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def train_batch(self, generator):
        return self.task.train_batch(generator)

    def weight(self, batch):
        return self.task.weight(batch)

    def loss(self, model, batch, *, label_smoothing=0.0):
        return self.task.loss(model, batch, label_smoothing=label_smoothing)

    def evaluate(self, model, device, precision):
        return self.task.evaluate(model, device, precision)


def as_task(task: object) -> Task:
    """`task` as a complete Task: itself when it subclasses Task or has every method, else with
    Task's defaults for the optional methods it lacks.

    Raises:
        TypeError: a required method is missing (the message names them).
    """
    missing = [name for name in REQUIRED if not callable(getattr(task, name, None))]
    if missing:
        raise TypeError(f"a training task needs {', '.join(REQUIRED)}; {type(task).__name__} has no "
                        f"{', '.join(missing)} (see attnlab.training.tasks.protocol)")
    if Task in type(task).__mro__ or all(callable(getattr(task, name, None)) for name in OPTIONAL):
        return task
    return _WithDefaults(task)


def with_balance_loss(loss: Callable[..., StepLoss], model: nn.Module) -> Callable[..., StepLoss]:
    """`loss` plus, for a model with mixture-of-experts layers, `moe.balance_weight` times their
    mean load-balance term from the same forward (attnlab.nn.moe), logged as `moe_balance` (and
    the assignments the experts' capacity dropped as `moe_dropped`). Other models: `loss` itself."""
    moe_layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    if not moe_layers:
        return loss
    weight = model.config.moe.balance_weight

    def total(*args, **kwargs) -> StepLoss:
        out = loss(*args, **kwargs)
        balance = balance_loss(model)
        dropped = sum(m.last_stats["dropped"] for m in moe_layers)
        parts = {**out.parts, "moe_balance": balance.item(), "moe_dropped": float(dropped)}
        return StepLoss(out.loss + weight * balance.to(out.loss.dtype), parts)

    return total
