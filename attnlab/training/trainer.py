"""The one training loop, for every task (pretraining objectives, fine-tuning heads): gradient
accumulation weighted by tokens, bf16 autocast or fp16 with loss scaling, clipping, schedules,
periodic evaluation, early stopping, the NaN policy, checkpoints and exact resume, data parallel
under torchrun (and tensor and pipeline parallel: the `parallel` section, through the hooks given
as `mesh=`, attnlab.parallel.mesh.MeshTraining), torch.compile, activation checkpointing and
TensorBoard logging.

    trainer = Trainer(TrainConfig.from_dict(load_config_file("examples/shakespeare_char.json")))
    summary = trainer.fit()                  # or fit(resume=True) after an interruption
    Trainer(config, task=task, model=model)  # any task (attnlab.training.tasks.protocol), e.g. a fine-tuning head
    Trainer(config, mesh=MeshTraining)       # parallel.tp / parallel.pp > 1 (attnlab.parallel.mesh)

One optimisation step = `grad_accum` micro-batches. Its loss is the sum of the micro-batches'
token losses over the step's label tokens (attnlab.training.tasks.protocol). A resumed run restores
weights, optimizer moments, the schedule, the trainer's RNG states, the data generator and the
task's data position, so it takes the same batches and dropout masks as a run that was never
stopped, and ends bitwise equal on CPU. Each trainer draws dropout from its own RNG state (saved
and restored around `fit`), so several runs in one process (a seed sweep) do not disturb each
other.

Lifecycle: `fit` holds the run folder's lock (attnlab.io.lock: a second run on the folder is
refused, naming the first). A first Ctrl-C — or SIGTERM / SIGUSR1, what schedulers send before
they kill a job (`train.stop_signals`, attnlab.training.run.signals) — lets the current step finish,
saves a checkpoint and raises `TrainingInterrupted` (a KeyboardInterrupt) naming it and the
signal, even on the last step (so a seed sweep stops too); a second one stops at once and names
the checkpoint a resume would go on from. Under torchrun the ranks agree after each step, so they
all stop after the same one. Resuming from the interruption's checkpoint ends bitwise equal to a
run that was never stopped, like any other checkpoint.

The best weights are always on disk: an evaluation that beats the best so far writes a
checkpoint, so `best_checkpoint` (checkpoints/index.json, the summary) holds the weights that
scored `best_val_loss`, whatever `eval_every` and `checkpoint_every` are.

Switches of the `train` section (attnlab.training.config.RunConfig):

    precision: fp16     fp16 autocast and a gradient scaler (attnlab.training.setup.precision): a step
                        whose gradients overflow is skipped and the scale halved (logged); the
                        scaler's state is checkpointed, so a resume stays exact
    compile: true       torch.compile of each transformer layer in place (attnlab.training.
                        speedups: the state dict keeps its names, no `_orig_mod.`); the loss, the
                        embeddings and evaluation (decoding included) run eagerly. The compile
                        time is logged after the first step, kept out of tokens/s and the ETA,
                        and returned in the summary (`compile_seconds`)
    activation_checkpointing: true
                        each layer's activations are recomputed in backward instead of kept
                        (attnlab.models.transformer; same gradients, dropout masks included)
    tensorboard: true   metrics.jsonl's scalars and text samples in OUT/tensorboard/
                        (attnlab.training.run.tensorboard)
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import torch

from attnlab.config.validate import ConfigError
from attnlab.io.progress import format_seconds
from attnlab.training.setup.adapters import apply_lora, export_lora
from attnlab.io.checkpoints import list_checkpoints, load_checkpoint, read_index, resolve_checkpoint, save_checkpoint
from attnlab.training.config import TrainConfig, absolute_paths
from attnlab.training.strategy.distributed import (all_reduce_sum, any_rank, data_parallel_loss, init_from_env, rank0_first,
                                          shard_task)
from attnlab.training.setup.memory import check_training_memory
from attnlab.training.optim import Schedule, build_optimizer
from attnlab.training.data.batches import DataPipeline
from attnlab.training.run.loss_curve import write_loss_curve
from attnlab.training.setup.precision import autocast, native_bf16, native_fp16, resolve_precision, uses_grad_scaler
from attnlab.training.run.signals import StopRequest, deferred_stop, exit_status
from attnlab.training.setup.speedups import CompileClock, checkpoint_activations, compile_layers, has_cxx_compiler
from attnlab.training.tasks.batch_loss import count_tokens, to_device
from attnlab.training.tasks.protocol import with_balance_loss
from attnlab.training.run.tensorboard import TensorBoardLog, require_tensorboard, text_samples
from attnlab.training.setup.threads import set_threads
from attnlab.io.files import append_line, atomic_write_json, atomic_write_text, json_text
from attnlab.io.lock import RunLock


class StepResult(NamedTuple):
    """One optimisation step: its loss (NaN when skipped by the NaN policy), named parts, input
    tokens, whether the weights were left as they were (NaN policy, or an fp16 overflow), and
    the gradient norm before clipping (None without optim.grad_clip, or when not finite)."""

    loss: float
    parts: dict[str, float]
    tokens: int
    skipped: bool
    grad_norm: float | None = None


class NonFiniteLossError(RuntimeError):
    """The loss (or gradient norm) became NaN or infinite and nan_policy is "stop"."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a stop signal: attnlab.training.run.signals) stopped `fit`. `checkpoint`: where a
    resume goes on from (None: from step 0); `saved`: written at the interruption (else an
    earlier checkpoint, the run's latest); `signal`: its name; `exit_status`: 128 + its number."""

    def __init__(self, out: Path, step: int, checkpoint: Path | None, saved: bool, signal: str = "SIGINT"):
        self.out, self.step, self.checkpoint, self.saved, self.signal = out, step, checkpoint, saved, signal
        what = "interrupted" if signal == "SIGINT" else f"stopped by {signal}"
        if saved:
            text = f"{what} after step {step}; checkpoint saved: {checkpoint}"
        elif checkpoint is not None:
            text = f"{what} at step {step} (stopped at once, nothing saved); a resume goes on from {checkpoint}"
        else:
            text = f"{what} at step {step}, before the first checkpoint; a resume starts from step 0"
        super().__init__(text)

    @property
    def exit_status(self) -> int:
        return exit_status(self.signal)


def versions() -> dict[str, str]:
    """Versions a run records beside its config."""
    import numpy

    from attnlab._version import __version__

    return {"attnlab": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


class Trainer:
    """Runs a TrainConfig on a task.

    Args:
        config: the run (`data` is read only when the task is built from it).
        task: what to train on (attnlab.training.tasks.protocol); default: the pretraining objective of
            `config.data` (a PretrainTask over `pipeline`).
        pipeline: prepared data for the default task (built from `config.data` when None).
        model: a model to train (default: from `config.model` — built, or loaded from
            `model.init_from` — with the data's vocabulary).
        log: where progress lines go (print to stdout by default).
        show_progress: progress lines for tokenisation and steps.
        mesh: the hooks of a model split over processes, needed when `parallel.tp` or
            `parallel.pp` is above 1 (unused otherwise): `attnlab.parallel.mesh.MeshTraining`,
            which `attnlab train` passes. The loop calls `mesh.check_layout(config, world_size)`
            before the data is prepared, then `mesh(model, ctx, config, task)` for this rank's
            part; given rather than imported, since attnlab.parallel sits above training.

    Raises:
        ValueError: `parallel.tp` or `parallel.pp` above 1 without `mesh`; `task` without `model`.
        ConfigError: a step that cannot fit in the memory there is (train.check_memory; attnlab.training.setup.memory).
    """

    def __init__(self, config: TrainConfig, *, task: Any = None, pipeline: DataPipeline | None = None,
                 model: torch.nn.Module | None = None, log: Callable[[str], None] | None = None,
                 show_progress: bool = True, mesh: Any = None):
        self.config = config
        self.out = Path(config.train.out_dir)
        self.log = log or (lambda text: print(text, flush=True))
        self.show_progress = show_progress
        run = config.train
        if run.tensorboard:
            require_tensorboard()  # before any data is prepared
        set_threads("train.threads", run.threads)  # capped to the CPUs, with a warning (training.threads)
        self.device = pick_device(run.device)
        if run.compile and self.device.type == "cpu" and not has_cxx_compiler():
            raise ConfigError("train.compile", "true on a CPU needs a C++ compiler for torch.compile's code (g++ or "
                              "clang++ on PATH, or $CXX); install one or set train.compile to false")
        par = config.parallel
        if par.sharded and mesh is None:
            raise ValueError(f"parallel.tp={par.tp}, parallel.pp={par.pp} split the model over processes: pass the "
                             "mesh hooks, Trainer(config, mesh=attnlab.parallel.mesh.MeshTraining) (attnlab train "
                             "--nproc N does)")
        mesh = mesh if par.sharded else None  # [parallel] tp / pp split the model: the caller's hooks do the rest
        self.parallel = init_from_env(par.tp, pp=par.pp, dp=par.dp)  # [parallel] under torchrun: rank 0 writes
        if mesh is not None:
            mesh.check_layout(config, self.parallel.world_size)  # before any data is prepared
        if self.parallel.distributed:
            self.device = self.parallel.device if self.device.type == "cuda" else self.device
            self.log = self.log if self.parallel.is_main else (lambda text: None)
        self.precision = resolve_precision(run.precision, self.device)  # once: "auto" decided, emulated bf16 warned
        torch.manual_seed(run.seed)
        self.pipeline = pipeline
        if task is None:
            from attnlab.training.setup.start import pretrain_setup

            with rank0_first(self.parallel):  # [parallel] rank 0 prepares the data cache first
                task, model = pretrain_setup(config, self.out, pipeline=pipeline, model=model,
                                             show_progress=show_progress, log=self.log)
            self.pipeline = task.pipeline
        elif model is None:
            raise ValueError("Trainer(task=...) needs the model to train (model=...)")
        self.task = shard_task(task, self.parallel)  # [parallel] each rank its own batches
        if hasattr(task, "prepare"):
            task.prepare(model)  # freezing, re-initialisation: before the optimizer sees the parameters
        model = apply_lora(model, config.lora, seed=run.seed, log=self.log)  # LoRA adapters (config.lora), base frozen
        check_training_memory(model, config, self.device, precision=self.precision, task=task)  # before any batch
        if self.pipeline is not None:
            self.pipeline.check_batches()  # data too short for one batch: refused now, not at the first evaluation
        # [parallel] pp: a model built on the meta device; the mesh hooks make this rank's stage, on its device
        self.model = model if any(p.is_meta for p in model.parameters()) else model.to(self.device)
        self.mesh = mesh(self.model, self.parallel, config, task) if mesh is not None else None
        if run.activation_checkpointing:
            checkpoint_activations(self.model)  # (attnlab.training.setup.speedups)
        self.compiled_layers = compile_layers(self.model) if run.compile else 0
        loss = with_balance_loss(task.loss, self.model)  # + the experts' load balance (MoE models)
        loss = self.mesh.loss if self.mesh is not None else loss  # [parallel] tp: over the vocabulary's shards
        # [parallel] DDP when dp > 1; a pipeline sums its gradients over dp itself
        pipelined = self.mesh is not None and self.mesh.pipelined
        self.train_loss = None if pipelined else data_parallel_loss(self.model, self.parallel, loss)
        o = config.optim
        groups = task.param_groups(self.model, o.lr, o.weight_decay) if hasattr(task, "param_groups") else None
        groups = self.mesh.param_groups(o.weight_decay) if self.mesh is not None else groups  # [parallel] pp: a stage's
        self.optimizer = build_optimizer(self.model, o.name, o.lr, o.betas, o.eps, o.weight_decay, groups=groups)
        s = config.schedule
        self.schedule = Schedule(self.optimizer, s.name, o.lr, total_steps=run.max_steps, warmup_steps=s.warmup_steps,
                                 min_lr_ratio=s.min_lr_ratio, d_model=self.model.config.d_model)
        # fp16: the loss scaled before backward, the gradients unscaled before clipping (a no-op otherwise)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=uses_grad_scaler(self.precision))
        self.data_generator = torch.Generator().manual_seed(run.seed + 1)
        self._rng = self._rng_now()  # this run's dropout stream (see the module docstring)
        self.step = 0
        self.best: float | None = None
        self.bad_evals = 0
        self._stop = StopRequest()  # a first Ctrl-C / stop signal during fit sets it (training.signals)
        self.history: dict[str, list[tuple[int, float]]] = {"train": [], "valid": []}
        self._tensorboard: TensorBoardLog | None = None  # open during fit (train.tensorboard, rank 0)

    def _rng_now(self) -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    @contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run the block on this trainer's RNG state, then put the caller's back."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self._rng["cpu"])
            if "cuda" in self._rng:
                torch.cuda.set_rng_state(self._rng["cuda"], self.device)
            try:
                yield
            finally:
                self._rng = self._rng_now()

    # ---------------------------------------------------------------- files
    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def _write_config(self) -> None:
        if not self.parallel.is_main:  # [parallel]
            return
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"config": absolute_paths(self.config.to_dict()), "model": self.model.config.to_dict(),  # any cwd
                "seed": self.config.train.seed, "precision": self.precision, "versions": versions(),
                "command": " ".join(sys.argv)}
        atomic_write_json(self.out / "config.json", data, indent=2)

    def _metrics(self, record: dict[str, Any]) -> None:
        if not self.parallel.is_main:  # [parallel]
            return
        append_line(self.out / "metrics.jsonl", json_text(record))  # whole lines; NaN as null
        if self._tensorboard is not None:
            self._tensorboard.record(record)

    def _trim_metrics(self) -> None:
        """After a resume, drop records of steps the checkpoint had not reached (they will be redone)."""
        path = self.out / "metrics.jsonl"
        if not path.exists() or not self.parallel.is_main:  # [parallel] rank 0 owns the file
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = {k: math.nan if v is None else v for k, v in json.loads(line).items()}  # null: NaN
            except (json.JSONDecodeError, AttributeError):  # a line cut by the crash
                continue
            if record.get("step", 0) <= self.step:
                kept.append(line)
                if "train_loss" in record:
                    self.history["train"].append((record["step"], record["train_loss"]))
                if "val_loss" in record:
                    self.history["valid"].append((record["step"], record["val_loss"]))
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    def save(self, metric: float | None = None) -> Path:
        extra = {"best": self.best, "bad_evals": self.bad_evals}
        if hasattr(self.task, "state_dict"):
            extra["task"] = self.task.state_dict()  # the data position beyond the generator (epochs)
        if self.scaler.is_enabled():
            extra["grad_scaler"] = self.scaler.state_dict()  # fp16: the loss scale, its growth count (numbers)
        path = self.checkpoint_dir
        run = dict(step=self.step, schedule_state=self.schedule.state_dict(), data_generator=self.data_generator,
                   extra=extra, metric=metric, keep_last=self.config.train.keep_last)
        if self.mesh is not None:  # [parallel] tp / pp: every rank sends its part, rank 0 writes the whole layout
            path = self.mesh.save(self.checkpoint_dir, optimizer=self.optimizer, **run) or path
        elif self.parallel.is_main:  # [parallel] one writer; the others wait for the checkpoint
            path = save_checkpoint(self.checkpoint_dir, model=self.model, optimizer=self.optimizer, **run)
        self.parallel.barrier()
        return path

    def resume(self, path: str | os.PathLike | None = None) -> bool:
        """Load the latest checkpoint of this run (or `path`); False when there is none."""
        if path is None and not list_checkpoints(self.checkpoint_dir):
            return False
        ckpt = resolve_checkpoint(path or self.checkpoint_dir, "latest")
        load = self.mesh.load_checkpoint if self.mesh is not None else load_checkpoint  # [parallel] shard on load
        state = load(ckpt, model=self.model, optimizer=self.optimizer, data_generator=self.data_generator)
        self._rng = self._rng_now()  # load_checkpoint set the RNG states to the checkpoint's
        self.schedule.load_state_dict(state["schedule"])
        self.step = int(state["step"])
        self.best = state["extra"].get("best")
        self.bad_evals = int(state["extra"].get("bad_evals", 0))
        if hasattr(self.task, "load_state_dict"):
            self.task.load_state_dict(state["extra"].get("task", {}))
        if self.scaler.is_enabled() and "grad_scaler" in state["extra"]:  # (from a non-fp16 run: a new scale)
            self.scaler.load_state_dict(state["extra"]["grad_scaler"])
        self._trim_metrics()
        self.log(f"resumed from {ckpt} at step {self.step}")
        return True

    # ---------------------------------------------------------------- evaluation
    def autocast(self):
        return autocast(self.precision, self.device)

    def eager(self):
        """The context evaluation and decoding run in: eagerly where the layers are compiled
        (train.compile), since a compiled layer would compile again for eval mode and for every
        length of a decoding cache (torch < 2.6, which has no compiler stances, compiles them)."""
        stance = getattr(torch.compiler, "set_stance", None)
        return stance("force_eager") if self.compiled_layers and stance is not None else nullcontext()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The task's validation metrics (`val_loss` first); {} for a task without validation."""
        was_training = self.model.training
        self.model.eval()
        try:
            if self.mesh is not None:  # [parallel] forward only through the shards and stages
                return self.mesh.evaluate(self.task, self.device, self.precision)
            with self.eager():
                return self.task.evaluate(self.model, self.device, self.precision)
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def samples(self) -> str | None:
        """Greedy samples of the task's validation data as Markdown (attnlab.training.run.tensorboard.
        text_samples), None where the task has none or the model is split (tp, pp); draws no random number."""
        if self.mesh is not None:
            return None
        was_training = self.model.training
        self.model.eval()
        try:
            with self.eager(), self.autocast():
                return text_samples(self.task, self.model, self.device)
        finally:
            self.model.train(was_training)

    # ---------------------------------------------------------------- the loop
    def accumulate(self, batches: list[dict[str, torch.Tensor]]) -> tuple[float, dict[str, float], bool]:
        """Forward and backward over the micro-batches of one step, each scaled by its share of
        the step's weight (label tokens), so the gradients are those of sum(token losses) /
        tokens. Returns (step loss, its named parts, non-finite); under data parallel the loss
        and parts are over all ranks. Under pipeline parallel the pipeline runs the micro-batches."""
        if self.mesh is not None and self.mesh.pipelined:  # [parallel] pp: one batch of k b rows, in m micro-batches
            with self.autocast():
                loss = self.mesh.pipeline_step(batches)
            return (loss, {}, False) if math.isfinite(loss) else (self._non_finite(f"loss is {loss}"), {}, True)
        weights = [self.task.weight(b) for b in batches]
        total = all_reduce_sum(float(sum(weights)), self.parallel)  # [parallel] the tokens of all ranks
        if total == 0:
            return self._non_finite("no label tokens in the step's batches"), {}, True
        loss_sum, parts_sum = 0.0, {}
        for batch, weight in zip(batches, weights):
            share = weight / total * self.parallel.dp_size  # DDP averages over ranks: undo its 1/dp
            with self.autocast():
                loss, parts = self.train_loss(batch, label_smoothing=self.config.optim.label_smoothing)  # [parallel]
            if not torch.isfinite(loss):
                return self._non_finite(f"loss is {float(loss.detach())}"), {}, True
            self.scaler.scale(loss * share).backward()  # fp16: times the loss scale (else as it is)
            loss_sum += float(loss.detach()) * share
            for key, value in parts.items():
                parts_sum[key] = parts_sum.get(key, 0.0) + value * share
        if self.parallel.distributed:  # [parallel] each rank holds its share of the global sums
            sums = self.parallel.all_reduce_mean({"loss": loss_sum, **parts_sum})
            loss_sum, parts_sum = sums.pop("loss"), sums
        return loss_sum, parts_sum, False

    def _train_step(self) -> StepResult:
        """One optimisation step (see StepResult)."""
        run = self.config.train
        self.optimizer.zero_grad(set_to_none=True)
        batches = [to_device(self.task.train_batch(self.data_generator), self.device) for _ in range(run.grad_accum)]
        tokens = sum(count_tokens(b) for b in batches) * self.parallel.dp_size
        loss, parts, skipped = self.accumulate(batches)
        if skipped:
            return StepResult(loss, parts, tokens, True)
        self.scaler.unscale_(self.optimizer)  # fp16: the true gradients, and whether any overflowed
        norm = None
        if self.config.optim.grad_clip is not None:
            clip = self.config.optim.grad_clip  # [parallel] tp / pp: the norm over every shard and stage
            norm = float(self.mesh.clip_grad_norm(clip) if self.mesh is not None else
                         torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
            if not math.isfinite(norm):
                if not self.scaler.is_enabled():
                    return StepResult(self._non_finite(f"gradient norm is {norm}"), {}, tokens, True)
                norm = None  # fp16: an overflow, the scaler's to handle
        if not self.scaler.is_enabled():
            self.optimizer.step()
            return StepResult(loss, parts, tokens, False, norm)
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)  # skipped where the unscaled gradients hold inf or NaN
        self.scaler.update()  # such a step halves the scale; 2,000 clean ones double it
        if self.scaler.get_scale() >= scale:
            return StepResult(loss, parts, tokens, False, norm)
        self.log(f"fp16: the gradients overflowed at step {self.step + 1}; step skipped, loss scale {scale:g} -> "
                 f"{self.scaler.get_scale():g}")
        return StepResult(loss, parts, tokens, True, None)

    def _non_finite(self, what: str) -> float:
        step = self.step + 1
        if self.config.train.nan_policy == "stop":
            raise NonFiniteLossError(f"{what} at step {step}; stopping (set train.nan_policy=skip to skip such steps, "
                                     "or lower optim.lr)")
        self.optimizer.zero_grad(set_to_none=True)
        self.log(f"warning: {what} at step {step}; step skipped (train.nan_policy=skip)")
        return float("nan")

    def fit(self, resume: bool = False, *, stop_at: int | None = None,
            on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Train to `train.max_steps` (or early stopping, or `max_minutes`, or `stop_at`),
        holding the run folder's lock.

        Args:
            resume: continue from the run's latest checkpoint when there is one (a warning, and a
                fresh start, when there is none).
            stop_at: pause after this step (checkpointed); a later `fit()` goes on from there.
            on_step: called after every step with {"step", "loss", its parts, "lr", "skipped"}.

        Returns:
            a summary: steps, final train loss, best and last validation metrics, seconds.

        Raises:
            NonFiniteLossError: a NaN/inf loss with nan_policy "stop" (message names the step).
            ValueError: a fresh run (resume=False) in an out_dir that already holds checkpoints.
            RunLockedError: another live run writes to train.out_dir (attnlab.io.lock).
            TrainingInterrupted: Ctrl-C (see the module docstring).
        """
        lock = RunLock(self.out, what="train.out_dir") if self.parallel.is_main else nullcontext()  # [parallel]
        with lock:
            return self._fit(resume, stop_at, on_step)

    def _fit(self, resume: bool, stop_at: int | None, on_step: Callable[[dict[str, Any]], None] | None) -> dict:
        run = self.config.train
        self.out.mkdir(parents=True, exist_ok=True)
        if resume and not self.resume():
            warnings.warn(f"resume: {self.checkpoint_dir} holds no checkpoint; the run starts from step 0",
                          stacklevel=3)
            resume = False
        if resume and self.step > run.max_steps:
            raise ValueError(f"train.max_steps={run.max_steps}, but the run in {str(self.out)!r} is at step "
                             f"{self.step} already; give a larger --train.max_steps to train on")
        if resume and self.step == run.max_steps and stop_at is None:
            self.log(f"the run is complete: step {self.step} of train.max_steps={run.max_steps}; nothing to train "
                     "(a larger --train.max_steps trains on)")
        if not resume and self.step == 0:  # (a trainer already resumed with .resume(path) goes on)
            if list_checkpoints(self.checkpoint_dir):
                raise ValueError(f"train.out_dir={str(self.out)!r} already holds checkpoints; continue that run with "
                                 f"`attnlab train --resume {self.out}`, or choose another train.out_dir")
            if (self.out / "metrics.jsonl").exists() and self.parallel.is_main:  # [parallel]
                (self.out / "metrics.jsonl").unlink()
        end = run.max_steps if stop_at is None else min(stop_at, run.max_steps)
        self._write_config()
        self.log(self.setup_line())
        if run.tensorboard and self.parallel.is_main:  # [parallel] rank 0 writes
            fresh = not resume and self.step == 0
            self._tensorboard = TensorBoardLog(self.out / "tensorboard", start_step=self.step, fresh=fresh)
            self._tensorboard.config(self.config.to_dict(), self.step)
        self.model.train()
        try:
            with self._own_rng(), deferred_stop(run.stop_signals) as self._stop:
                summary = self._loop(end, on_step)
                stopped = self._stop_agreed()  # pressed after the loop's last look: not lost (a sweep goes on)
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt:  # a second Ctrl-C (or one where it cannot be deferred): mid-step, save nothing
            raise self._interrupted(saved=False) from None
        finally:
            if self._tensorboard is not None:
                self._tensorboard.close()
                self._tensorboard = None
        if stopped:
            raise self._interrupted(saved=True)
        if self.parallel.is_main:  # a LoRA run: OUT/adapter/, and OUT/merged/ when the run is over (training.adapters)
            export_lora(self.model, self.out, merged=summary["stop_reason"] != "stop_at", settings=self.config.lora)
        if summary["stop_reason"] != "stop_at":  # a pause (a sweep's probe) draws nothing: plotting costs a second
            self.plot()
        return summary

    def setup_line(self) -> str:
        """The resolved setup in one line (what `attnlab train` prints first; the whole config is
        OUT/config.json, or `--print-config`): model and parameters, data, steps, precision, device."""
        held = self.mesh.module if self.mesh is not None else self.model  # [parallel] tp / pp: this rank's part
        n_params = sum(p.numel() for p in {id(p): p for p in held.parameters()}.values())
        ctx, run, data = self.parallel, self.config.train, self.config.data
        where = "" if self.mesh is None else f" on rank 0 of tp={ctx.tp_size} x pp={ctx.pp_size} x dp={ctx.dp_size}"
        where = where or (f" x {ctx.dp_size} data-parallel replicas" if ctx.dp_size > 1 else "")
        kind = getattr(self.model.config, "arch", None) or type(self.model).__name__  # (a ViT's config has no arch)
        model = f"{kind}, {n_params:,} parameters{where}"
        if self.pipeline is not None:  # the pretraining task of config.data
            batch = f"{data.batch_tokens} tokens" if data.batch_tokens else f"{data.batch_size}"
            task = f"{data.objective} on {data.source}, seq_len {data.seq_len}, batch {batch} x {run.grad_accum}"
        else:
            task = type(self.task).__name__
        return (f"setup: {model} | {task} | {run.max_steps:,} steps | {self._precision_line()} | device "
                f"{self.device} | out {self.out}")

    def _precision_line(self) -> str:
        """`precision: bf16 (auto on cpu)`; fp16 names its loss scale; auto on a GPU with fp16 but
        without bf16 (V100, T4) says that fp16 would be faster."""
        line = f"precision: {self.precision}"
        if self.config.train.precision == "auto":
            line += f" (auto on {self.device.type})"
            if self.precision == "fp32" and self.device.type == "cuda" and native_fp16(self.device) \
                    and not native_bf16(self.device):
                line += "; this GPU has no bf16 but fast fp16: train.precision=fp16 (loss-scaled) is faster"
        if self.scaler.is_enabled():
            line += f", loss scaling from {self.scaler.get_scale():g}"
        return line

    def _interrupted(self, saved: bool) -> TrainingInterrupted:
        """The interruption, naming the run's latest checkpoint (where a resume goes on from)."""
        latest = read_index(self.checkpoint_dir).get("latest")
        return TrainingInterrupted(self.out, self.step, self.checkpoint_dir / latest if latest else None,
                                   saved=saved and latest is not None, signal=self._stop.signal or "SIGINT")

    def _stop_agreed(self) -> bool:
        """Whether a stop was asked for; under torchrun, on any rank (one collective: the ranks
        got the signal at different moments, but they all stop after the same step)."""
        return any_rank(bool(self._stop), self.parallel) if self.parallel.distributed else bool(self._stop)

    def _loop(self, end: int, on_step: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        run = self.config.train
        start = time.perf_counter()
        first_step = self.step
        window_loss, window_norms, window_tokens, window_start = [], [], 0, time.perf_counter()
        last_eval: dict[str, float] = {}
        stop_reason = "max_steps"
        train_loss = first_loss = float("nan")
        clock = CompileClock() if self.compiled_layers else None
        while self.step < end:
            step_start = time.perf_counter()
            with self.mesh.guard("a training step") if self.mesh is not None else nullcontext():  # [parallel]
                loss, parts, tokens, skipped, norm = self._train_step()
            lr = self.schedule.lr()
            self.schedule.step()
            self.step += 1
            window_tokens += tokens
            if not math.isnan(loss):  # (an fp16 overflow skips the update, not the loss)
                window_loss.append((loss, parts))
                train_loss = loss
                first_loss = loss if math.isnan(first_loss) else first_loss
            if norm is not None:
                window_norms.append(norm)
            if clock is not None:  # compiling (the first step, a new shape): kept out of tok/s and the ETA
                newly = clock.lap(time.perf_counter() - step_start)
                window_start += newly
                if clock.laps == 1:
                    self.log(f"compile: {newly:.1f} s (torch.compile of {self.compiled_layers} transformer layer(s), "
                             "in the first step)")
            if on_step is not None:
                on_step({"step": self.step, "loss": loss, **parts, "lr": lr, "skipped": skipped})
            if self.step % run.log_every == 0 or self.step == run.max_steps:
                elapsed = time.perf_counter() - window_start
                mean = sum(x for x, _ in window_loss) / len(window_loss) if window_loss else float("nan")
                means = {k: sum(p.get(k, 0.0) for _, p in window_loss) / len(window_loss) for k in parts}
                tps = window_tokens / max(elapsed, 1e-9)
                done = time.perf_counter() - start
                steady = done - (clock.total if clock is not None else 0.0)
                eta = steady / max(self.step - first_step, 1) * (run.max_steps - self.step)
                if run.max_minutes is not None:  # the time limit may come first
                    eta = min(eta, max(0.0, 60 * run.max_minutes - done))
                norms = {"grad_norm": sum(window_norms) / len(window_norms)} if window_norms else {}  # before clipping
                scale = {"loss_scale": self.scaler.get_scale()} if self.scaler.is_enabled() else {}
                self._metrics({"step": self.step, "train_loss": mean, **means, "lr": lr, **norms, **scale,
                               "tokens_per_s": tps, "elapsed_s": done, "skipped": skipped})
                self.history["train"].append((self.step, mean))
                self.log(f"step {self.step:>6}/{run.max_steps} | loss {mean:.4f} | lr {lr:.2e}"
                         f" | {tps:,.0f} tok/s | ETA {format_seconds(eta)}")
                window_loss, window_norms, window_tokens, window_start = [], [], 0, time.perf_counter()
            aside = time.perf_counter()  # evaluation and checkpoints: kept out of the next window's tok/s
            timed_out = run.max_minutes is not None and aside - start > 60 * run.max_minutes
            timed_out = any_rank(timed_out, self.parallel) if run.max_minutes is not None else timed_out  # [parallel]
            metric, improved = None, False
            if self.step % run.eval_every == 0 or self.step == run.max_steps or timed_out:
                last_eval = self.evaluate() or last_eval
                if "val_loss" in last_eval:
                    metric = last_eval["val_loss"]
                    self._metrics({"step": self.step, **last_eval})
                    self.history["valid"].append((self.step, metric))
                    self.log("eval  " + " | ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
                    if self._tensorboard is not None and (samples := self.samples()) is not None:
                        self._tensorboard.text("samples", samples, self.step)
                    improved = self.best is None or metric < self.best
                    if improved:
                        self.best, self.bad_evals = metric, 0
                    else:
                        self.bad_evals += 1
                    if run.early_stopping_patience is not None and self.bad_evals >= run.early_stopping_patience:
                        stop_reason = "early_stopping"
                    self.plot()
            if timed_out:
                stop_reason = "max_minutes"
            saved = None
            if (self.step % run.checkpoint_every == 0 or self.step in (run.max_steps, end)
                    or stop_reason != "max_steps" or improved):  # the best weights are always on disk
                saved = self.save(metric)
            window_start += time.perf_counter() - aside
            if self._stop_agreed():  # Ctrl-C or a stop signal: the step is complete, checkpoint it and stop
                raise TrainingInterrupted(self.out, self.step, saved or self.save(metric), saved=True,
                                          signal=self._stop.signal or "SIGINT")
            if stop_reason != "max_steps":
                self.log(f"stopping at step {self.step}: {stop_reason}")
                break
        if stop_reason == "max_steps" and self.step < run.max_steps:
            stop_reason = "stop_at"  # paused: fit() again goes on
        if math.isnan(train_loss) and self.history["train"]:  # no step ran (a complete run resumed): the last logged
            train_loss = self.history["train"][-1][1]
        seconds = time.perf_counter() - start
        compiled = {"compile_seconds": clock.total} if clock is not None else {}
        return {"steps": self.step, "stop_reason": stop_reason, "first_loss": first_loss, "train_loss": train_loss,
                "best_val_loss": self.best, **last_eval, "seconds": seconds, **compiled, "out_dir": str(self.out),
                "best_checkpoint": read_index(self.checkpoint_dir).get("best")}

    def plot(self) -> None:
        """loss.png beside metrics.jsonl (train in blue, validation in red)."""
        if (self.history["train"] or self.history["valid"]) and self.parallel.is_main:  # [parallel]
            write_loss_curve(self.out / "loss.png", self.history)
