"""The strategy of a model split over processes (`parallel.tp` or `parallel.pp` above 1).

What the split itself does — cut the layers into stages, shard the heads and the vocabulary,
write the checkpoint — is attnlab.parallel.mesh.MeshTraining, a package above this one: the
command line passes it in (`Trainer(config, mesh=MeshTraining)`) and this strategy calls it.

    tp only    the Trainer's micro-batch loop (DataParallel.backward) over the vocabulary-parallel loss
    pp > 1     the step's batches through the pipeline's schedule (GPipe / 1F1B), gradients summed
               over dp by the pipeline itself
    clipping, evaluation, saving and loading: the hooks' own, over every shard and stage;
               under pp the model is built on the meta device and the hooks make this rank's stage alone
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from attnlab.training.strategy.base import DataParallel
from attnlab.training.strategy.distributed import ParallelContext
from attnlab.training.tasks.protocol import Task


class MeshStrategy(DataParallel):
    """tp x pp x dp ranks over the hooks `mesh` (attnlab.parallel.mesh.MeshTraining)."""

    name = "mesh"

    def __init__(self, ctx: ParallelContext, device: torch.device, mesh: Any):
        super().__init__(ctx, device)
        self.factory = mesh
        self.hooks: Any = None  # the hooks made for this rank's model (`place`)

    def place(self, model: nn.Module, config: Any, task: Task) -> nn.Module:
        # pp: a model built on the meta device stays there; the hooks make this rank's stage on its device
        self.model = model if any(p.is_meta for p in model.parameters()) else model.to(self.device)
        self.hooks = self.factory(self.model, self.ctx, config, task)
        return self.model

    @property
    def pipelined(self) -> bool:
        return self.hooks is not None and self.hooks.pipelined

    @property
    def held(self) -> nn.Module:
        return self.hooks.module  # tp: the sharded model; pp: this rank's stage

    def set_loss(self, loss: Callable[..., Any]) -> None:
        if self.pipelined:  # the pipeline's last stage computes the loss itself
            self.train_loss = None
        else:  # tp: the cross-entropy over the vocabulary's shards, in place of the task's
            super().set_loss(self.hooks.loss)

    def param_groups(self, groups: list[dict] | None, weight_decay: float) -> list[dict]:
        return self.hooks.param_groups(weight_decay)  # a stage's share of the whole model's groups

    def backward(self, batches: list[dict[str, torch.Tensor]], task: Task, *, autocast: Callable[[], Any],
                 scale: Callable[[torch.Tensor], torch.Tensor],
                 label_smoothing: float) -> tuple[float, dict[str, float], str | None]:
        if not self.pipelined:
            return super().backward(batches, task, autocast=autocast, scale=scale, label_smoothing=label_smoothing)
        with autocast():
            loss = self.hooks.pipeline_step(batches)  # one batch of k b rows, in m micro-batches
        return (loss, {}, None) if math.isfinite(loss) else (float("nan"), {}, f"loss is {loss}")

    def clip(self, max_norm: float) -> float:
        return float(self.hooks.clip_grad_norm(max_norm))  # over every shard and stage

    def guard(self, what: str) -> AbstractContextManager:
        return self.hooks.guard(what)

    def evaluate(self, task: Task, precision: str, eager: Callable[[], Any]) -> dict[str, float]:
        with self.evaluating():  # forward only through the shards and stages
            return self.hooks.evaluate(task, self.device, precision)

    def samples(self, task: Task, autocast: Callable[[], Any], eager: Callable[[], Any]) -> None:
        return None  # a split model does not decode

    def save(self, folder: Any, *, optimizer: torch.optim.Optimizer, **state: Any) -> Path:
        # every rank sends its part (tp shards gathered, pp stages streamed); rank 0 writes the whole layout
        return self.hooks.save(folder.checkpoints, optimizer=optimizer, **state) or folder.checkpoints

    def load(self, path: Any, *, optimizer: torch.optim.Optimizer, data_generator: torch.Generator) -> dict:
        return self.hooks.load_checkpoint(path, model=self.model, optimizer=optimizer, data_generator=data_generator)

    def describe(self) -> str:
        c = self.ctx
        return f" on rank 0 of tp={c.tp_size} x pp={c.pp_size} x dp={c.dp_size}"
