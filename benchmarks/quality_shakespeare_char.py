"""Quality at equal wall-clock: attnlab's char-level Shakespeare recipe vs a nanoGPT-style
baseline written here (the published train_shakespeare_char settings scaled to CPU: 4 layers,
4 heads, 128 wide, context 64, batch 12, dropout 0, AdamW lr 1e-3 -> 1e-4 cosine, warmup 100).

Both train on the same token file (the `shakespeare` corpus, char tokenizer) for the same
number of seconds (each run times 10 steps first and sets its step count to fit the budget, so
both schedules finish), then are evaluated on the same held-out windows (The Tempest, 64
characters). Prints JSON with both validation losses and their difference.

    python benchmarks/quality_shakespeare_char.py --minutes 3
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


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


def train_baseline(pipe, seconds: float, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = BaselineGPT(pipe.tokenizer.vocab_size)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    keep = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(seed)

    def step(i, total):
        for group in opt.param_groups:
            group["lr"] = cosine(i, total, 100, 1e-3, 1e-4)
        w = pipe.train.random_windows(12, 65, g)
        loss = model.loss(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    t = time.perf_counter()
    for i in range(10):
        step(i, 10_000)
    total = max(20, int(seconds / ((time.perf_counter() - t) / 10)))
    for i in range(10, total):
        step(i, total)
    model.steps = total
    return model


def train_attnlab(seconds: float, seed: int, out_dir: str):
    from attnlab.cli.demo import demo_config
    from attnlab.training import TrainConfig, Trainer

    probe = Trainer(TrainConfig.from_dict(demo_config(10, out_dir + "-probe", seed)), show_progress=False,
                    log=lambda _: None)
    t = time.perf_counter()
    probe.fit()
    per_step = (time.perf_counter() - t) / 10  # includes one evaluation and checkpoint: a slight underestimate of steps
    steps = max(20, int(seconds / per_step))
    cfg = demo_config(steps, out_dir, seed)
    cfg["train"]["max_minutes"] = None
    cfg["train"]["eval_every"] = cfg["train"]["checkpoint_every"] = steps
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda _: None)
    trainer.fit()
    trainer.model.steps = steps
    return trainer


@torch.no_grad()
def val_loss(loss_fn, pipe, batches: int = 40) -> float:
    windows = pipe.valid.sequential_windows(65, limit=batches * 12)
    losses = [float(loss_fn(windows[i: i + 12, :-1], windows[i: i + 12, 1:])) for i in range(0, len(windows), 12)]
    return sum(losses) / len(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0, help="training budget of each model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="runs/bench-quality")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from attnlab.training.steps import batch_loss

    trainer = train_attnlab(60 * args.minutes, args.seed, args.out)
    pipe = trainer.pipeline
    model = trainer.model.eval()
    ours = val_loss(lambda x, y: batch_loss(model, {"input_ids": x, "labels": y}), pipe)
    base = train_baseline(pipe, 60 * args.minutes, args.seed).eval()
    theirs = val_loss(base.loss, pipe)
    print(json.dumps({"budget_minutes": args.minutes, "threads": torch.get_num_threads(),
                      "attnlab_val_loss": ours, "attnlab_steps": model.steps,
                      "baseline_val_loss": theirs, "baseline_steps": base.steps,
                      "difference_attnlab_minus_baseline": ours - theirs,
                      "eval": "The Tempest, 64-character windows, mean NLL in nats/char"}, indent=1))


if __name__ == "__main__":
    main()
