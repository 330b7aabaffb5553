"""The training loop: gradient accumulation, bf16 autocast, clipping, schedules, periodic
evaluation, early stopping, checkpoints and exact resume.

    trainer = Trainer(TrainConfig.from_dict(load_config_file("examples/shakespeare_char.json")))
    summary = trainer.fit()                  # or fit(resume=True) after an interruption

One optimisation step = `grad_accum` micro-batches of `data.batch_size`. A resumed run restores
weights, optimizer moments, the schedule, every RNG state and the data generator, so it takes
the same batches and dropout masks as a run that was never stopped, and ends bitwise equal on
CPU.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from attnlab.data.progress import format_seconds
from attnlab.evaluation import bleu_chrf, greedy_decode, perplexity
from attnlab.training.checkpoint import list_checkpoints, load_checkpoint, read_index, resolve_checkpoint, save_checkpoint
from attnlab.training.config import TrainConfig
from attnlab.training.optim import Schedule, build_optimizer
from attnlab.training.pipeline import Pipeline
from attnlab.training.plot import write_loss_curve
from attnlab.training.steps import autocast, count_tokens, eval_sums, to_device
from attnlab.utils import atomic_write_text

from attnlab.parallel import init_from_env  # [parallel] torchrun hooks, see attnlab/parallel/training.py
from attnlab.parallel.training import any_rank, data_parallel_loss, rank0_first, shard_pipeline


class NonFiniteLossError(RuntimeError):
    """The loss (or gradient norm) became NaN or infinite and nan_policy is "stop"."""


def versions() -> dict[str, str]:
    """Versions a run records beside its config."""
    import numpy
    import attnlab

    return {"attnlab": attnlab.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' but no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


class Trainer:
    """Runs a TrainConfig.

    Args:
        config: the run.
        pipeline: prepared data (built from `config.data` when None).
        model: a model to train (built from `config.model` and the tokenizer when None).
        log: where progress lines go (print to stdout by default).
        show_progress: progress lines for tokenisation and steps.
    """

    def __init__(self, config: TrainConfig, *, pipeline: Pipeline | None = None, model: torch.nn.Module | None = None,
                 log: Callable[[str], None] | None = None, show_progress: bool = True):
        self.config = config
        self.out = Path(config.train.out_dir)
        self.log = log or (lambda text: print(text, flush=True))
        self.show_progress = show_progress
        run = config.train
        if run.threads:
            torch.set_num_threads(run.threads)
        self.device = pick_device(run.device)
        self.parallel = init_from_env()  # [parallel] under torchrun: DDP, rank 0 writes; alone: no-ops
        if self.parallel.distributed:
            self.device = self.parallel.device if self.device.type == "cuda" else self.device
            self.log = self.log if self.parallel.is_main else (lambda text: None)
        torch.manual_seed(run.seed)
        with rank0_first(self.parallel):  # [parallel] rank 0 prepares the data cache first
            self.pipeline = shard_pipeline(pipeline or Pipeline.build(config.data, self.out, show_progress=show_progress),
                                           self.parallel)
        if model is None:
            from attnlab.models import build_model

            model_cfg = config.model_config()
            model_cfg = model_cfg.replace(**self.pipeline.model_overrides(model_cfg.arch))
            model = build_model(model_cfg)
        self.model = model.to(self.device)
        self.train_loss = data_parallel_loss(self.model, self.parallel)  # [parallel] DDP(batch_loss) when dp > 1
        o = config.optim
        self.optimizer = build_optimizer(self.model, o.name, o.lr, o.betas, o.eps, o.weight_decay)
        s = config.schedule
        self.schedule = Schedule(self.optimizer, s.name, o.lr, total_steps=run.max_steps, warmup_steps=s.warmup_steps,
                                 min_lr_ratio=s.min_lr_ratio, d_model=self.model.config.d_model)
        self.data_generator = torch.Generator().manual_seed(run.seed + 1)
        self.step = 0
        self.best: float | None = None
        self.bad_evals = 0
        self.history: dict[str, list[tuple[int, float]]] = {"train": [], "valid": []}

    # ---------------------------------------------------------------- files
    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def _write_config(self) -> None:
        if not self.parallel.is_main:  # [parallel]
            return
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"config": self.config.to_dict(), "model": self.model.config.to_dict(), "seed": self.config.train.seed,
                "versions": versions(), "command": " ".join(sys.argv)}
        atomic_write_text(self.out / "config.json", json.dumps(data, indent=2) + "\n")

    def _metrics(self, record: dict[str, Any]) -> None:
        if not self.parallel.is_main:  # [parallel]
            return
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _trim_metrics(self) -> None:
        """After a resume, drop records of steps the checkpoint had not reached (they will be redone)."""
        path = self.out / "metrics.jsonl"
        if not path.exists() or not self.parallel.is_main:  # [parallel] rank 0 owns the file
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the crash
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
        path = self.checkpoint_dir
        if self.parallel.is_main:  # [parallel] one writer; the others wait for the checkpoint
            path = save_checkpoint(self.checkpoint_dir, step=self.step, model=self.model, optimizer=self.optimizer,
                                   schedule_state=self.schedule.state_dict(), data_generator=self.data_generator,
                                   extra=extra, metric=metric, keep_last=self.config.train.keep_last)
        self.parallel.barrier()
        return path

    def resume(self, path: str | os.PathLike | None = None) -> bool:
        """Load the latest checkpoint of this run (or `path`); False when there is none."""
        if path is None and not list_checkpoints(self.checkpoint_dir):
            return False
        ckpt = resolve_checkpoint(path or self.checkpoint_dir, "latest")
        state = load_checkpoint(ckpt, model=self.model, optimizer=self.optimizer, data_generator=self.data_generator)
        self.schedule.load_state_dict(state["schedule"])
        self.step = int(state["step"])
        self.best = state["extra"].get("best")
        self.bad_evals = int(state["extra"].get("bad_evals", 0))
        self._trim_metrics()
        self.log(f"resumed from {ckpt} at step {self.step}")
        return True

    # ---------------------------------------------------------------- evaluation
    def autocast(self):
        return autocast(self.config.train.precision, self.device)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss and perplexity on the fixed eval batches; masked LM adds the accuracy
        on masked positions, NSP runs the MLM and NSP losses (val_loss is their sum, as trained)
        and the NSP accuracy, seq2seq BLEU/chrF."""
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, float] = {}
        for batch in self.pipeline.eval_batches(self.config.train.eval_batches):
            batch = to_device(batch, self.device)
            with self.autocast():
                for key, value in eval_sums(self.model, batch).items():
                    sums[key] = sums.get(key, 0) + value
        count = max(sums.get("tokens", 0), 1)
        result = {"val_loss": sums.get("loss_sum", 0.0) / count}
        result["val_ppl"] = perplexity(result["val_loss"])  # of the token loss (MLM alone in NSP runs)
        if "correct" in sums:
            result["val_mlm_accuracy"] = sums["correct"] / count
        if sums.get("nsp_count"):
            result["val_mlm_loss"] = result["val_loss"]
            result["val_nsp_loss"] = sums["nsp_loss_sum"] / sums["nsp_count"]
            result["val_nsp_accuracy"] = sums["nsp_correct"] / sums["nsp_count"]
            result["val_loss"] = result["val_mlm_loss"] + result["val_nsp_loss"]
        if self.config.data.objective == "seq2seq" and self.config.train.bleu_samples:
            result.update(self.translation_scores(self.config.train.bleu_samples))
        self.model.train(was_training)
        return result

    @torch.no_grad()
    def translation_scores(self, limit: int) -> dict[str, float]:
        tok, cfg = self.pipeline.tokenizer, self.config.data
        src, tgt = self.pipeline.valid
        n = min(limit, src.num_documents)
        max_new = min(cfg.max_pair_len + 1, self.model.config.position.max_len - 1)  # a table's context
        hyps, refs = [], []
        for start in range(0, n, cfg.batch_size):
            batch = self.pipeline._pairs_batch(self.pipeline.valid, list(range(start, min(start + cfg.batch_size, n))))
            out = greedy_decode(self.model, batch["src_ids"].to(self.device), batch["src_mask"].to(self.device),
                                bos_id=tok.bos_token_id, eos_id=tok.eos_token_id, max_new_tokens=max_new)
            for row in out[:, 1:].tolist():
                row = row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
                hyps.append(tok.decode(row, skip_special_tokens=True))
            refs.extend(tok.decode(tgt.document(i).tolist()) for i in range(start, min(start + cfg.batch_size, n)))
        return bleu_chrf(hyps, refs)

    # ---------------------------------------------------------------- the loop
    def _train_step(self) -> tuple[float, int, bool]:
        """One optimisation step; returns (mean loss, tokens, skipped)."""
        run = self.config.train
        self.optimizer.zero_grad(set_to_none=True)
        total, tokens = 0.0, 0
        for _ in range(run.grad_accum):
            batch = to_device(self.pipeline.train_batch(self.data_generator), self.device)
            tokens += count_tokens(batch)
            with self.autocast():
                loss = self.train_loss(batch, label_smoothing=self.config.optim.label_smoothing)  # [parallel]
            if not torch.isfinite(loss):
                return self._non_finite(f"loss is {float(loss.detach())}"), tokens, True
            (loss / run.grad_accum).backward()
            total += float(loss.detach()) / run.grad_accum
        if self.config.optim.grad_clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.grad_clip)
            if not torch.isfinite(norm):
                return self._non_finite(f"gradient norm is {float(norm)}"), tokens, True
        self.optimizer.step()
        if self.parallel.distributed:  # [parallel] the mean over data-parallel ranks, tokens of all
            total, tokens = self.parallel.all_reduce_mean({"loss": total})["loss"], tokens * self.parallel.dp_size
        return total, tokens, False

    def _non_finite(self, what: str) -> float:
        step = self.step + 1
        if self.config.train.nan_policy == "stop":
            raise NonFiniteLossError(f"{what} at step {step}; stopping (set train.nan_policy=skip to skip such steps, "
                                     "or lower optim.lr)")
        self.optimizer.zero_grad(set_to_none=True)
        self.log(f"warning: {what} at step {step}; step skipped (train.nan_policy=skip)")
        return float("nan")

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to `train.max_steps` (or early stopping, or `max_minutes`).

        Args:
            resume: continue from the run's latest checkpoint when there is one.

        Returns:
            a summary: steps, final train loss, best and last validation metrics, seconds.

        Raises:
            NonFiniteLossError: a NaN/inf loss with nan_policy "stop" (message names the step).
            ValueError: a fresh run (resume=False) in an out_dir that already holds checkpoints.
        """
        run = self.config.train
        self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            self.resume()
        elif self.step == 0:  # (a trainer already resumed with .resume(path) goes on)
            if list_checkpoints(self.checkpoint_dir):
                raise ValueError(f"train.out_dir={str(self.out)!r} already holds checkpoints; continue that run with "
                                 "--resume, or choose another train.out_dir")
            if (self.out / "metrics.jsonl").exists() and self.parallel.is_main:  # [parallel]
                (self.out / "metrics.jsonl").unlink()
        self._write_config()
        self.model.train()
        start = time.perf_counter()
        first_step = self.step
        window_loss, window_tokens, window_start = [], 0, time.perf_counter()
        last_eval: dict[str, float] = {}
        stop_reason = "max_steps"
        train_loss = first_loss = float("nan")
        while self.step < run.max_steps:
            loss, tokens, skipped = self._train_step()
            self.schedule.step()
            self.step += 1
            window_tokens += tokens
            if not skipped:
                window_loss.append(loss)
                train_loss = loss
                first_loss = loss if math.isnan(first_loss) else first_loss
            if self.step % run.log_every == 0 or self.step == run.max_steps:
                elapsed = time.perf_counter() - window_start
                mean = sum(window_loss) / len(window_loss) if window_loss else float("nan")
                tps = window_tokens / max(elapsed, 1e-9)
                done = time.perf_counter() - start
                eta = done / max(self.step - first_step, 1) * (run.max_steps - self.step)
                self._metrics({"step": self.step, "train_loss": mean, "lr": self.schedule.lr(self.step - 1),
                               "tokens_per_s": tps, "elapsed_s": done, "skipped": skipped})
                self.history["train"].append((self.step, mean))
                self.log(f"step {self.step:>6}/{run.max_steps} | loss {mean:.4f} | lr {self.schedule.lr(self.step - 1):.2e}"
                         f" | {tps:,.0f} tok/s | ETA {format_seconds(eta)}")
                window_loss, window_tokens, window_start = [], 0, time.perf_counter()
            timed_out = run.max_minutes is not None and time.perf_counter() - start > 60 * run.max_minutes
            timed_out = any_rank(timed_out, self.parallel) if run.max_minutes is not None else timed_out  # [parallel]
            metric = None
            if self.step % run.eval_every == 0 or self.step == run.max_steps or timed_out:
                last_eval = self.evaluate()
                metric = last_eval["val_loss"]
                self._metrics({"step": self.step, **last_eval})
                self.history["valid"].append((self.step, metric))
                self.log("eval  " + " | ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
                if self.best is None or metric < self.best:
                    self.best, self.bad_evals = metric, 0
                else:
                    self.bad_evals += 1
                if run.early_stopping_patience is not None and self.bad_evals >= run.early_stopping_patience:
                    stop_reason = "early_stopping"
                self.plot()
            if timed_out:
                stop_reason = "max_minutes"
            if self.step % run.checkpoint_every == 0 or self.step == run.max_steps or stop_reason != "max_steps":
                self.save(metric)
            if stop_reason != "max_steps":
                self.log(f"stopping at step {self.step}: {stop_reason}")
                break
        self.plot()
        seconds = time.perf_counter() - start
        summary = {"steps": self.step, "stop_reason": stop_reason, "first_loss": first_loss, "train_loss": train_loss, "best_val_loss": self.best,
                   **last_eval, "seconds": seconds, "out_dir": str(self.out),
                   "best_checkpoint": read_index(self.checkpoint_dir).get("best")}
        return summary

    def plot(self) -> None:
        """loss.png beside metrics.jsonl (train in blue, validation in red)."""
        if (self.history["train"] or self.history["valid"]) and self.parallel.is_main:  # [parallel]
            write_loss_curve(self.out / "loss.png", self.history)
