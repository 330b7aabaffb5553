"""How one optimisation step runs: the strategy the Trainer's loop hands every choice that depends
on where the model lives. The loop reads the same whatever the strategy:

    batches -> strategy.backward(...)      forward and backward of the step's micro-batches
            -> strategy.clip(max_norm)     the gradient norm over everything this run trains
            -> strategy.optimizer_step()   the update (fp16: through the loss scaler)
    evaluation: strategy.evaluate(task)    checkpoints: strategy.save / strategy.load

    SingleProcess   one process: the model on its device, the task's loss as it is
    DataParallel    torchrun with dp > 1 replicas: the loss inside DDP (gradients averaged over the
                    ranks), every rank its own batches, sums and stop decisions taken together
    MeshStrategy    tp / pp > 1: the model split over processes (attnlab.training.strategy.mesh,
                    over the hooks of attnlab.parallel.mesh)

Weighting: one step's loss is sum_i weight_i loss_i / sum_i weight_i over all micro-batches of all
ranks (attnlab.training.tasks.protocol), so each micro-batch's backward is scaled by its share;
DDP's mean over dp ranks is undone by a factor dp.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from attnlab.io.checkpoints import load_checkpoint
from attnlab.training.run.tensorboard import text_samples
from attnlab.training.strategy.distributed import (ParallelContext, all_reduce_sum, any_rank, data_parallel_loss,
                                                   rank0_first, shard_task)
from attnlab.training.tasks.protocol import Task


class SingleProcess:
    """A run in one process (also the base of the others: see the module docstring).

    Attributes:
        ctx: this process's place (a one-process context alone).
        device: where it computes.
        model: the model as placed (`place`); `held` the part of it this rank trains.
    """

    name = "one process"
    pipelined = False  # whether a step runs through a pipeline's schedule rather than micro-batch by micro-batch

    def __init__(self, ctx: ParallelContext, device: torch.device):
        self.ctx, self.device = ctx, device
        self.model: nn.Module | None = None
        self.train_loss: Callable[..., Any] | None = None

    # ---------------------------------------------------------------- setup
    def rank0_first(self) -> AbstractContextManager:
        """The block runs on rank 0 first (it prepares the data cache), then on the others."""
        return rank0_first(self.ctx)

    def shard(self, task: Task) -> Task:
        """The task as this rank draws it (its own batches under data parallel)."""
        return shard_task(task, self.ctx)

    def place(self, model: nn.Module, config: Any, task: Task) -> nn.Module:
        """The model on this rank's device, as it trains here."""
        self.model = model.to(self.device)
        return self.model

    @property
    def held(self) -> nn.Module:
        """The module whose parameters this rank holds and updates."""
        return self.model

    def set_loss(self, loss: Callable[..., Any]) -> None:
        """The step loss, `loss(model, batch, label_smoothing=...)` -> StepLoss."""
        self.train_loss = data_parallel_loss(self.model, self.ctx, loss)

    def param_groups(self, groups: list[dict] | None, weight_decay: float) -> list[dict] | None:
        """The optimizer's parameter groups (None: attnlab.training.optim's decay groups)."""
        return groups

    # ---------------------------------------------------------------- a step
    def backward(self, batches: list[dict[str, torch.Tensor]], task: Task, *, autocast: Callable[[], Any],
                 scale: Callable[[torch.Tensor], torch.Tensor],
                 label_smoothing: float) -> tuple[float, dict[str, float], str | None]:
        """Forward and backward of one step's micro-batches, each scaled by its share of the
        step's weight. Returns (the step's loss, its named parts, None), or (NaN, {}, what went
        wrong) at the first non-finite loss or when the step has no label tokens; `scale` is the
        fp16 loss scaler's (the identity otherwise)."""
        weights = [task.weight(b) for b in batches]
        total = self.total(float(sum(weights)))
        if total == 0:
            return float("nan"), {}, "no label tokens in the step's batches"
        loss_sum, parts_sum = 0.0, {}
        for batch, weight in zip(batches, weights):
            share = weight / total * self.ctx.dp_size  # DDP averages over ranks: undo its 1/dp
            with autocast():
                loss, parts = self.train_loss(batch, label_smoothing=label_smoothing)
            if not torch.isfinite(loss):
                return float("nan"), {}, f"loss is {float(loss.detach())}"
            scale(loss * share).backward()
            loss_sum += float(loss.detach()) * share
            for key, value in parts.items():
                parts_sum[key] = parts_sum.get(key, 0.0) + value * share
        sums = self.mean_over_ranks({"loss": loss_sum, **parts_sum})  # each rank holds its share of the sums
        return sums.pop("loss"), sums, None

    def total(self, value: float) -> float:
        """`value` summed over the data-parallel ranks."""
        return value

    def mean_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        """Each number averaged over the data-parallel ranks."""
        return dict(values)

    def clip(self, max_norm: float) -> float:
        """Clip the gradients to a global norm of `max_norm`; returns the norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
        """Update the weights; False where fp16's scaler found inf/NaN gradients and skipped the
        update (the scale is then halved; 2,000 clean steps double it)."""
        if not scaler.is_enabled():
            optimizer.step()
            return True
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        return scaler.get_scale() >= scale

    def agree(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any (stop decisions taken together)."""
        return any_rank(flag, self.ctx)

    def guard(self, what: str) -> AbstractContextManager:
        """A communication failure inside the block named as this rank's, doing `what`."""
        return nullcontext()

    # ---------------------------------------------------------------- evaluation and files
    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """The block runs in eval mode without gradients; the model's mode is put back after."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.train(was_training)

    def evaluate(self, task: Task, precision: str, eager: Callable[[], Any]) -> dict[str, float]:
        """The task's validation metrics (`val_loss` first; {} for a task without validation)."""
        with self.evaluating(), eager():
            return task.evaluate(self.model, self.device, precision)

    def samples(self, task: Task, autocast: Callable[[], Any], eager: Callable[[], Any]) -> str | None:
        """Greedy samples of the task's validation data as Markdown (run.tensorboard.text_samples);
        None where the task has none."""
        with self.evaluating(), eager(), autocast():
            return text_samples(task, self.model, self.device)

    def save(self, folder: Any, *, optimizer: torch.optim.Optimizer, **state: Any) -> Path:
        """Write checkpoint `state["step"]` into the run folder (a RunFolder: rank 0 writes, the
        others return its checkpoints folder); `state` is RunFolder.save's (schedule, generator, ...)."""
        return folder.save(model=self.model, optimizer=optimizer, **state)

    def load(self, path: Any, *, optimizer: torch.optim.Optimizer, data_generator: torch.Generator) -> dict:
        """Read a checkpoint into this rank's model and optimizer; returns its state.json."""
        return load_checkpoint(path, model=self.model, optimizer=optimizer, data_generator=data_generator)

    def describe(self) -> str:
        """Where the model lives, for the setup line ('' alone)."""
        return ""


class DataParallel(SingleProcess):
    """torchrun with dp > 1 replicas of the whole model (DDP over the data-parallel group)."""

    name = "data parallel"

    def total(self, value: float) -> float:
        return all_reduce_sum(value, self.ctx)

    def mean_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        return self.ctx.all_reduce_mean(values)

    def describe(self) -> str:
        return f" x {self.ctx.dp_size} data-parallel replicas" if self.ctx.dp_size > 1 else ""
