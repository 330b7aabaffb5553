"""The one training loop, for every task (pretraining objectives, fine-tuning heads): gradient
accumulation weighted by tokens, bf16 autocast or fp16 with loss scaling, clipping, schedules,
periodic evaluation, early stopping, the NaN policy, checkpoints and exact resume, data parallel
under torchrun (and tensor and pipeline parallel: the `parallel` section, through the hooks given
as `mesh=`, attnlab.parallel.mesh.MeshTraining), torch.compile, activation checkpointing and
TensorBoard logging.

The loop reads the same for every layout: what depends on where the model lives is the
strategy's (attnlab.training.strategy: one process, data parallel, a tensor x pipeline mesh), and
what the run leaves on disk is the run folder's (attnlab.training.run.folder).

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

import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from attnlab.config.validate import ConfigError
from attnlab.io.checkpoints import list_checkpoints, resolve_checkpoint
from attnlab.training.config import TrainConfig
from attnlab.training.data.batches import DataPipeline
from attnlab.training.optim import Schedule, build_optimizer
from attnlab.training.run.folder import RunFolder
from attnlab.training.run.progress import StepResult, StepWindow, setup_line
from attnlab.training.run.signals import StopRequest, TrainingInterrupted, deferred_stop
from attnlab.training.run.tensorboard import require_tensorboard
from attnlab.training.setup.adapters import apply_lora, export_lora
from attnlab.training.setup.memory import check_training_memory
from attnlab.training.setup.precision import autocast, resolve_precision, uses_grad_scaler
from attnlab.training.setup.rng import RunRandom
from attnlab.training.setup.speedups import CompileClock, checkpoint_activations, compile_layers, eager, has_cxx_compiler
from attnlab.training.setup.threads import set_threads
from attnlab.training.strategy import choose_strategy
from attnlab.training.tasks.batch_loss import count_tokens, to_device
from attnlab.training.tasks.protocol import as_task, with_balance_loss


class NonFiniteLossError(RuntimeError):
    """The loss (or gradient norm) became NaN or infinite and nan_policy is "stop"."""


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
        task: what to train on (attnlab.training.tasks.protocol); default: the pretraining
            objective of `config.data` (a PretrainTask over `pipeline`).
        pipeline: prepared data for the default task (built from `config.data` when None).
        model: a model to train (default: from `config.model` — built, or loaded from
            `model.init_from` — with the data's vocabulary).
        log: where progress lines go (print to stdout by default).
        show_progress: progress lines for tokenisation and steps.
        mesh: the hooks of a model split over processes, needed when `parallel.tp` or
            `parallel.pp` is above 1 (unused otherwise): `attnlab.parallel.mesh.MeshTraining`,
            which `attnlab train` passes (attnlab.training.strategy.choose_strategy).

    Raises:
        ValueError: `parallel.tp` or `parallel.pp` above 1 without `mesh`; `task` without `model`.
        TypeError: a task without the methods of attnlab.training.tasks.protocol.Task.
        ConfigError: a step that cannot fit in the memory there is (train.check_memory; attnlab.training.setup.memory).
    """

    def __init__(self, config: TrainConfig, *, task: Any = None, pipeline: DataPipeline | None = None,
                 model: torch.nn.Module | None = None, log: Callable[[str], None] | None = None,
                 show_progress: bool = True, mesh: Any = None):
        run, o, s = config.train, config.optim, config.schedule
        self.config, self.show_progress = config, show_progress
        self.log = log or (lambda text: print(text, flush=True))
        if run.tensorboard:
            require_tensorboard()  # before any data is prepared
        set_threads("train.threads", run.threads)  # capped to the CPUs, with a warning (setup.threads)
        device = pick_device(run.device)
        if run.compile and device.type == "cpu" and not has_cxx_compiler():
            raise ConfigError("train.compile", "true on a CPU needs a C++ compiler for torch.compile's code (g++ or "
                              "clang++ on PATH, or $CXX); install one or set train.compile to false")
        self.strategy = choose_strategy(config, device, mesh)  # checks a split layout before any data is prepared
        self.device, self.parallel = self.strategy.device, self.strategy.ctx
        self.folder = RunFolder(run.out_dir, writes=self.parallel.is_main)
        self.out, self.checkpoint_dir, self.history = self.folder.out, self.folder.checkpoints, self.folder.history
        self.log = self.log if self.parallel.is_main else (lambda text: None)
        self._setup_logged = False
        self.precision = resolve_precision(run.precision, self.device)  # once: "auto" decided, emulated bf16 warned
        torch.manual_seed(run.seed)
        self.pipeline = pipeline
        if task is None:
            from attnlab.training.setup.start import pretrain_setup

            with self.strategy.rank0_first():  # rank 0 prepares the data cache first
                task, model = pretrain_setup(config, self.out, pipeline=pipeline, model=model,
                                             show_progress=show_progress, log=self.log)
            self.pipeline = task.pipeline
        elif model is None:
            raise ValueError("Trainer(task=...) needs the model to train (model=...)")
        if run.activation_checkpointing:
            checkpoint_activations(model)  # each layer recomputed in backward (setup.speedups)
        self.compiled_layers = compile_layers(model) if run.compile else 0  # in place; compiled at the first call
        task = as_task(task)
        self.task = self.strategy.shard(task)  # each data-parallel rank its own batches
        task.prepare(model)  # freezing, re-initialisation: before the optimizer sees the parameters
        model = apply_lora(model, config.lora, seed=run.seed, log=self.log)  # LoRA adapters (config.lora), base frozen
        check_training_memory(model, config, self.device, precision=self.precision, task=task)  # before any batch
        if self.pipeline is not None:
            self.pipeline.check_batches()  # data too short for one batch: refused now, not at the first evaluation
        self.model = self.strategy.place(model, config, task)
        self.strategy.set_loss(with_balance_loss(task.loss, self.model))  # + the experts' balance (MoE models)
        groups = self.strategy.param_groups(task.param_groups(self.model, o.lr, o.weight_decay), o.weight_decay)
        self.optimizer = build_optimizer(self.model, o.name, o.lr, o.betas, o.eps, o.weight_decay, groups=groups)
        self.schedule = Schedule(self.optimizer, s.name, o.lr, total_steps=run.max_steps, warmup_steps=s.warmup_steps,
                                 min_lr_ratio=s.min_lr_ratio, d_model=self.model.config.d_model)
        # fp16: the loss scaled before backward, the gradients unscaled before clipping (a no-op otherwise)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=uses_grad_scaler(self.precision))
        self.data_generator = torch.Generator().manual_seed(run.seed + 1)
        self.random = RunRandom(self.device)  # this run's dropout stream (see the module docstring)
        self.step, self.best, self.bad_evals = 0, None, 0
        self._stop = StopRequest()  # a first Ctrl-C / stop signal during fit sets it (run.signals)

    @property
    def mesh(self) -> Any:
        """The hooks of a split model (tp / pp), None otherwise."""
        return getattr(self.strategy, "hooks", None)

    # ---------------------------------------------------------------- checkpoints
    def save(self, metric: float | None = None) -> Path:
        """A checkpoint of this step (the whole model: a split one sent to rank 0, which writes; the others wait)."""
        extra = {"best": self.best, "bad_evals": self.bad_evals, "task": self.task.state_dict()}
        if self.scaler.is_enabled():
            extra["grad_scaler"] = self.scaler.state_dict()  # fp16: the loss scale, its growth count (numbers)
        path = self.strategy.save(self.folder, optimizer=self.optimizer, step=self.step,
                                  schedule_state=self.schedule.state_dict(), data_generator=self.data_generator,
                                  extra=extra, metric=metric, keep_last=self.config.train.keep_last)
        self.parallel.barrier()
        return path

    def resume(self, path: str | os.PathLike | None = None) -> bool:
        """Load the latest checkpoint of this run (or `path`); False when there is none."""
        if path is None and not list_checkpoints(self.checkpoint_dir):
            return False
        ckpt = resolve_checkpoint(path or self.checkpoint_dir, "latest")
        state = self.strategy.load(ckpt, optimizer=self.optimizer, data_generator=self.data_generator)
        self.random.take_current()  # the checkpoint set the RNG states
        self.schedule.load_state_dict(state["schedule"])
        self.step = int(state["step"])
        self.best = state["extra"].get("best")
        self.bad_evals = int(state["extra"].get("bad_evals", 0))
        self.task.load_state_dict(state["extra"].get("task", {}))
        if self.scaler.is_enabled() and "grad_scaler" in state["extra"]:  # (from a non-fp16 run: a new scale)
            self.scaler.load_state_dict(state["extra"]["grad_scaler"])
        self.folder.trim_metrics(self.step)
        self.log(f"resumed from {ckpt} at step {self.step}")
        return True

    # ---------------------------------------------------------------- evaluation
    def autocast(self):
        return autocast(self.precision, self.device)

    def eager(self):
        """The context evaluation and decoding run in (setup.speedups.eager)."""
        return eager(self.compiled_layers)

    def evaluate(self) -> dict[str, float]:
        """The task's validation metrics (`val_loss` first); {} for a task without validation."""
        return self.strategy.evaluate(self.task, self.precision, self.eager)

    def samples(self) -> str | None:
        """Greedy samples of the task's validation data as Markdown (attnlab.training.run.tensorboard.
        text_samples), None where the task has none or the model is split (tp, pp); draws no random number."""
        return self.strategy.samples(self.task, self.autocast, self.eager)

    # ---------------------------------------------------------------- one step
    def accumulate(self, batches: list[dict[str, torch.Tensor]]) -> tuple[float, dict[str, float], bool]:
        """Forward and backward over the micro-batches of one step (the strategy's `backward`):
        (step loss, its named parts, non-finite); under data parallel over all ranks."""
        loss, parts, problem = self.strategy.backward(batches, self.task, autocast=self.autocast,
                                                      scale=self.scaler.scale,
                                                      label_smoothing=self.config.optim.label_smoothing)
        return (self._non_finite(problem), {}, True) if problem is not None else (loss, parts, False)

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
            norm = self.strategy.clip(self.config.optim.grad_clip)
            if not math.isfinite(norm):
                if not self.scaler.is_enabled():
                    return StepResult(self._non_finite(f"gradient norm is {norm}"), {}, tokens, True)
                norm = None  # fp16: an overflow, the scaler's to handle
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        if self.strategy.optimizer_step(self.optimizer, self.scaler):
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

    # ---------------------------------------------------------------- the run
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
        with self.folder.lock():
            return self._fit(resume, stop_at, on_step)

    def _fit(self, resume: bool, stop_at: int | None, on_step: Callable[[dict[str, Any]], None] | None) -> dict:
        run = self.config.train
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
        self.folder.start(resumed=resume or self.step > 0)  # (a trainer already resumed with .resume(path) goes on)
        end = run.max_steps if stop_at is None else min(stop_at, run.max_steps)
        self.folder.write_config(self.config.to_dict(), self.model.config.to_dict(), seed=run.seed,
                                 precision=self.precision)
        if not self._setup_logged:  # once per Trainer, not per fit(stop_at=...) chunk
            self.log(self.setup_line())
            self._setup_logged = True
        if run.tensorboard:
            self.folder.open_tensorboard(self.config.to_dict(), self.step, fresh=not resume and self.step == 0)
        self.model.train()
        try:
            with self.random.own(), deferred_stop(run.stop_signals) as self._stop:
                summary = self._loop(end, on_step)
                stopped = self.strategy.agree(bool(self._stop))  # pressed after the loop's last look: not lost
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt:  # a second Ctrl-C (or one where it cannot be deferred): mid-step, save nothing
            raise self._interrupted(saved=False) from None
        finally:
            self.folder.close()
        if stopped:
            raise self._interrupted(saved=True)
        if self.parallel.is_main:  # a LoRA run: OUT/adapter/, and OUT/merged/ when the run is over (setup.adapters)
            export_lora(self.model, self.out, merged=summary["stop_reason"] != "stop_at", settings=self.config.lora)
        if summary["stop_reason"] != "stop_at":  # a pause (a sweep's probe) draws nothing: plotting costs a second
            self.plot()
        return summary

    def _loop(self, end: int, on_step: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        run = self.config.train
        window = StepWindow(self.step, run.max_steps, run.max_minutes)
        clock = CompileClock() if self.compiled_layers else None
        last_eval: dict[str, float] = {}
        stop_reason = "max_steps"
        while self.step < end:
            began = time.perf_counter()
            with self.strategy.guard("a training step"):
                result = self._train_step()
            lr = self.schedule.lr()
            self.schedule.step()
            self.step += 1
            window.add(result)
            if clock is not None:  # compiling (the first step, a new shape): kept out of tok/s and the ETA
                self._compiled(clock, clock.lap(time.perf_counter() - began), window)
            if on_step is not None:
                on_step({"step": self.step, "loss": result.loss, **result.parts, "lr": lr, "skipped": result.skipped})
            if self.step % run.log_every == 0 or self.step == run.max_steps:
                scale = {"loss_scale": self.scaler.get_scale()} if self.scaler.is_enabled() else {}
                record, line = window.report(self.step, lr, result.parts, scale, result.skipped)
                self.folder.record(record)
                self.history["train"].append((self.step, record["train_loss"]))
                self.log(line)
            aside = time.perf_counter()  # evaluation and checkpoints: kept out of the next window's tok/s
            timed_out = run.max_minutes is not None and self.strategy.agree(window.elapsed > 60 * run.max_minutes)
            metric, improved = None, False
            if self.step % run.eval_every == 0 or self.step == run.max_steps or timed_out:
                last_eval = self.evaluate() or last_eval
                if "val_loss" in last_eval:
                    metric, improved = last_eval["val_loss"], self._judge(last_eval)
                    if run.early_stopping_patience is not None and self.bad_evals >= run.early_stopping_patience:
                        stop_reason = "early_stopping"
            stop_reason = "max_minutes" if timed_out else stop_reason
            saved = None
            if (self.step % run.checkpoint_every == 0 or self.step in (run.max_steps, end)
                    or stop_reason != "max_steps" or improved):  # the best weights are always on disk
                saved = self.save(metric)
            window.aside(time.perf_counter() - aside)
            if self.strategy.agree(bool(self._stop)):  # Ctrl-C or a stop signal: the step is complete, save, stop
                raise TrainingInterrupted(self.out, self.step, saved or self.save(metric), saved=True,
                                          signal=self._stop.signal or "SIGINT")
            if stop_reason != "max_steps":
                self.log(f"stopping at step {self.step}: {stop_reason}")
                break
        if stop_reason == "max_steps" and self.step < run.max_steps:
            stop_reason = "stop_at"  # paused: fit() again goes on
        train_loss = window.last_loss
        if math.isnan(train_loss) and self.history["train"]:  # no step ran (a complete run resumed): the last logged
            train_loss = self.history["train"][-1][1]
        compiled = {"compile_seconds": clock.total} if clock is not None else {}
        return {"steps": self.step, "stop_reason": stop_reason, "first_loss": window.first_loss,
                "train_loss": train_loss, "best_val_loss": self.best, **last_eval, "seconds": window.elapsed,
                **compiled, "out_dir": str(self.out), "best_checkpoint": self.folder.best()}

    def _compiled(self, clock: CompileClock, seconds: float, window: StepWindow) -> None:
        window.aside(seconds, compiling=True)
        if clock.laps == 1:
            self.log(f"compile: {seconds:.1f} s (torch.compile of {self.compiled_layers} transformer layer(s), "
                     "in the first step)")

    def _judge(self, metrics: dict[str, float]) -> bool:
        """Record an evaluation (metrics.jsonl, the log, TensorBoard samples, loss.png) and keep the
        best score; returns whether it improved on the best so far."""
        metric = metrics["val_loss"]
        self.folder.record({"step": self.step, **metrics})
        self.history["valid"].append((self.step, metric))
        self.log("eval  " + " | ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if self.folder.tensorboard is not None and (samples := self.samples()) is not None:
            self.folder.text("samples", samples, self.step)
        improved = self.best is None or metric < self.best
        self.best, self.bad_evals = (metric, 0) if improved else (self.best, self.bad_evals + 1)
        self.plot()
        return improved

    def plot(self) -> None:
        """loss.png beside metrics.jsonl (train in blue, validation in red)."""
        self.folder.plot()

    def _interrupted(self, saved: bool) -> TrainingInterrupted:
        """The interruption, naming the run's latest checkpoint (where a resume goes on from)."""
        latest = self.folder.latest()
        return TrainingInterrupted(self.out, self.step, latest, saved=saved and latest is not None,
                                   signal=self._stop.signal or "SIGINT")

    def setup_line(self) -> str:
        """The resolved setup in one line (what `attnlab train` prints first; the whole config is
        OUT/config.json, or `--print-config`): model and parameters, data, steps, precision, device."""
        return setup_line(self.config, self.model, self.strategy, self.precision, self.scaler,
                          task=None if self.pipeline is not None else self.task)
