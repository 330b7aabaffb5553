"""Quality at equal compute time: attnlab's char-level Shakespeare recipe vs a nanoGPT-style
baseline written here (nanoGPT's published CPU scaling of train_shakespeare_char: 4 layers,
4 heads, 128 wide, context 64, batch 12, dropout 0, AdamW lr 1e-3 -> 1e-4 cosine over the run,
warmup 100, betas (0.9, 0.99), weight decay 0.1, clipping 1.0).

Built for a shared machine. The two trainings run in one process, interleaved step by step
(A, B, A, B, ...), and each is charged only the time of its own steps against its budget, so
a change in load hits both alike. Each side sets its schedule length the way `attnlab demo`
does: time a few throwaway steps (interleaved too, after one warm-up step), then run as many
steps as fit in the budget; a side whose charged time reaches the budget first stops there.
attnlab's steps are exactly the trainer's (`Trainer._train_step`, then the schedule), with the
recipe of examples/shakespeare_char.json (`attnlab.cli.demo.demo_config`). Both models are
then evaluated in float32 on the same held-out windows: all of The Tempest, in windows of 65
characters (the baseline's context + 1), mean NLL in nats per character.

    python benchmarks/quality_shakespeare_char.py                       # 2 and 4 minutes, seeds 0 and 1
    python benchmarks/quality_shakespeare_char.py --minutes 2 --seeds 0 --set data.batch_size=8

Prints one JSON line per duel and a summary; `--threads` defaults to 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from machine import loadavg

EVAL_WINDOW = 65  # the baseline's context (64) + 1


class Block(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))  # (B, H, T, Dh)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class BaselineGPT(nn.Module):
    def __init__(self, vocab: int, d: int = 128, layers: int = 4, heads: int = 4, context: int = 64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def loss(self, x, y):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(self.head(self.ln(h)).flatten(0, 1), y.flatten())


def cosine(step: int, total: int, warmup: int, lr: float, min_lr: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


class Baseline:
    """The nanoGPT-style run: `step()` does one optimisation step of the schedule."""

    def __init__(self, pipe, seed: int, total_steps: int):
        torch.manual_seed(seed)
        self.model = BaselineGPT(pipe.tokenizer.vocab_size)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        keep = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}],
                                     lr=1e-3, betas=(0.9, 0.99))
        self.g = torch.Generator().manual_seed(seed)
        self.pipe, self.total, self.done, self.tokens_per_step = pipe, total_steps, 0, 12 * 64

    def step(self) -> None:
        for group in self.opt.param_groups:
            group["lr"] = cosine(self.done, self.total, 100, 1e-3, 1e-4)
        w = self.pipe.train.random_windows(12, 65, self.g)
        loss = self.model.loss(w[:, :-1], w[:, 1:])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.done += 1

    def val_loss(self, windows: torch.Tensor) -> float:
        return _mean_nll(self.model, self.model.loss, windows)


class Attnlab:
    """The recipe through attnlab's trainer: `step()` is what `Trainer.fit` does per step."""

    def __init__(self, pipe, seed: int, total_steps: int, overrides: list[tuple[str, object]], out_dir: str):
        from attnlab.cli.demo import demo_config
        from attnlab.training import TrainConfig, Trainer
        from attnlab.training.config import apply_overrides

        cfg = apply_overrides(demo_config(total_steps, out_dir, seed), overrides)
        cfg["train"]["threads"] = None  # the benchmark sets threads once for both
        config = TrainConfig.from_dict(cfg)
        pipe = dataclasses.replace(pipe, cfg=config.data)  # the recipe's batch size and context
        self.trainer = Trainer(config, pipeline=pipe, show_progress=False, log=lambda _: None)
        self.trainer.model.train()
        self.total, self.done = total_steps, 0
        self.tokens_per_step = cfg["data"]["batch_size"] * cfg["data"]["seq_len"] * cfg["train"].get("grad_accum", 1)
        self.config = cfg

    def step(self) -> None:
        t = self.trainer
        _, _, skipped = t._train_step()
        if skipped:
            raise RuntimeError(f"attnlab: non-finite loss at step {t.step + 1}")
        t.schedule.step()
        t.step += 1
        self.done += 1

    def val_loss(self, windows: torch.Tensor) -> float:
        from attnlab.training.tasks.batch_loss import batch_loss

        model = self.trainer.model
        return _mean_nll(model, lambda x, y: batch_loss(model, {"input_ids": x, "labels": y}), windows)


@torch.no_grad()
def _mean_nll(model: nn.Module, loss_fn, windows: torch.Tensor, batch: int = 64) -> float:
    """Mean per-character NLL over all windows (every window has the same length)."""
    was = model.training
    model.eval()
    losses = [float(loss_fn(windows[i: i + batch, :-1], windows[i: i + batch, 1:])) * len(windows[i: i + batch])
              for i in range(0, len(windows), batch)]
    model.train(was)
    return sum(losses) / len(windows)


def _timed(side) -> float:
    t = time.perf_counter()
    side.step()
    return time.perf_counter() - t


def duel(pipe, seconds: float, seed: int, overrides, out_dir: str, probe_steps: int = 8) -> dict:
    """One interleaved race of `seconds` of charged step time each; returns the JSON record."""
    from attnlab.cli.demo import RECIPE

    most = int(dict(overrides).get("train.max_steps", RECIPE["train"]["max_steps"]))
    # 1. calibrate: one warm-up and `probe_steps` timed steps each, interleaved, on throwaway runs
    probes = [Attnlab(pipe, seed, most, overrides, out_dir), Baseline(pipe, seed, 10_000)]
    times = [[], []]
    for i in range(probe_steps + 1):
        for k, side in enumerate(probes):
            dt = _timed(side)
            if i:
                times[k].append(dt)
    per_step = [statistics.median(ts) for ts in times]
    planned = [max(20, min(most, int(seconds / per_step[0]))), max(20, int(seconds / per_step[1]))]
    # 2. the race, fresh models with schedules of the planned lengths
    sides = [Attnlab(pipe, seed, planned[0], overrides, out_dir), Baseline(pipe, seed, planned[1])]
    spent = [0.0, 0.0]
    load = [loadavg()]
    while True:
        active = [k for k, side in enumerate(sides) if side.done < side.total and spent[k] < seconds]
        if not active:
            break
        for k in active:
            spent[k] += _timed(sides[k])
            if sides[k].done % 500 == 0:
                load.append(loadavg())
    windows = pipe.valid.sequential_windows(EVAL_WINDOW)
    ours, theirs = (side.val_loss(windows) for side in sides)
    names = ("attnlab", "baseline")
    out = {"budget_minutes": seconds / 60, "seed": seed, "threads": torch.get_num_threads()}
    for k, name in enumerate(names):
        side = sides[k]
        out.update({f"{name}_val_loss": (ours, theirs)[k], f"{name}_steps": side.done, f"{name}_planned_steps": side.total,
                    f"{name}_seconds": round(spent[k], 1), f"{name}_probe_ms_per_step": round(1000 * per_step[k], 1),
                    f"{name}_tokens": side.done * side.tokens_per_step,
                    f"{name}_tokens_per_s": round(side.done * side.tokens_per_step / max(spent[k], 1e-9))})
    out["difference_attnlab_minus_baseline"] = ours - theirs
    out["eval"] = (f"The Tempest, all {len(windows)} windows of {EVAL_WINDOW} characters, float32, mean NLL in "
                   "nats/char")
    out["loadavg"] = load
    return out



def _parse_set(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE (e.g. data.batch_size=8), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, nargs="+", default=[2.0, 4.0], help="budgets (charged step time)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both (default 1)")
    parser.add_argument("--set", dest="overrides", type=_parse_set, action="append", default=[],
                        help="override the recipe, dotted KEY=VALUE (repeatable), for tuning")
    parser.add_argument("--out", default="runs/bench-quality", help="where the tokenizer is kept (no checkpoints are written)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from attnlab.cli.demo import demo_config
    from attnlab.training import TrainConfig
    from attnlab.training.data.batches import DataPipeline

    pipe = DataPipeline.build(TrainConfig.from_dict(demo_config(10, args.out)).data, args.out, show_progress=False)
    records = []
    for minutes in args.minutes:
        for seed in args.seeds:
            record = duel(pipe, 60 * minutes, seed, args.overrides, args.out)
            records.append(record)
            print(json.dumps(record), flush=True)
    summary = {"overrides": dict(args.overrides), "threads": args.threads}
    for minutes in args.minutes:
        rs = [r for r in records if r["budget_minutes"] == minutes]
        summary[f"{minutes:g}min"] = {
            "attnlab_mean": statistics.mean(r["attnlab_val_loss"] for r in rs),
            "baseline_mean": statistics.mean(r["baseline_val_loss"] for r in rs),
            "worst_difference": max(r["difference_attnlab_minus_baseline"] for r in rs),
            "attnlab_no_worse_every_seed": all(r["difference_attnlab_minus_baseline"] <= 0 for r in rs)}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
