"""Find the needle: classify a long sequence by the one "needle" token hidden in it.

Each example is [CLS] followed by T - 1 noise tokens; one position, uniformly at random,
holds a needle token n_c (c = 0..3), and the label is c. Pooling reads the [CLS] state only,
so the model must carry information from anywhere in the sequence to position 0:
- dense attention (`auto`) can, at O(T^2) cost;
- a sliding window (`sliding_window`) cannot: [CLS] sees only its first `window` neighbours
  per layer, so accuracy falls to chance once the needle is usually out of reach;
- Longformer (`longformer`, [CLS] global by token id) can, at O(T w) cost.

Positions are not needed (scheme `none`): the needle is found by content, so a model trained
on short sequences is evaluated on long ones (train at 256, test at 256, 8k and 16k).

    python examples/long_inputs/needle.py --threads 1 --out results.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from attnlab import ModelConfig, build_model

CLS, NEEDLES, NOISE_LOW, VOCAB = 1, (4, 5, 6, 7), 10, 64


def make_batch(batch: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, T), labels (B,)): [CLS], noise, and one needle at a random position >= 1."""
    ids = torch.randint(NOISE_LOW, VOCAB, (batch, length), generator=gen)
    ids[:, 0] = CLS
    labels = torch.randint(0, len(NEEDLES), (batch,), generator=gen)
    where = torch.randint(1, length, (batch,), generator=gen)
    ids[torch.arange(batch), where] = torch.tensor(NEEDLES)[labels]
    return ids, labels


def config(kernel: str, window: int, layers: int) -> ModelConfig:
    return ModelConfig(arch="encoder", vocab_size=VOCAB, d_model=64, num_layers=layers, num_heads=2, d_ff=128,
                       dropout=0.0, norm_placement="pre", position={"scheme": "none"}, head="classification",
                       num_labels=len(NEEDLES), classifier_pooling="first",
                       attention={"kernel": kernel, "kernel_options": KERNEL_OPTIONS[kernel](window)})


KERNEL_OPTIONS = {  # attention.kernel_options of each kernel compared, for a window w
    "auto": lambda w: {},
    "sliding_window": lambda w: {"window": w},
    "longformer": lambda w: {"window": w, "global_token_id": CLS},  # [CLS] global by token id
}


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def evaluate(model, length: int, samples: int, batch: int, seed: int) -> dict:
    """Accuracy on fresh samples, seconds per forward batch, peak extra resident memory."""
    gen = torch.Generator().manual_seed(seed)
    correct, seconds, peak = 0, 0.0, 0
    with torch.no_grad():
        for _ in range(samples // batch):
            ids, labels = make_batch(batch, length, gen)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = _rss("VmRSS")
            start = time.perf_counter()
            logits = model(ids)
            seconds += time.perf_counter() - start
            peak = max(peak, _rss("VmHWM") - before)
            correct += int((logits.argmax(-1) == labels).sum())
    n = (samples // batch) * batch
    return {"length": length, "accuracy": correct / n, "samples": n,
            "seconds_per_batch": round(seconds / (samples // batch), 3), "batch": batch,
            "peak_extra_mib": round(peak / 2**20, 1)}


def run(kernel: str, args) -> dict:
    torch.manual_seed(args.seed)
    model = build_model(config(kernel, args.window, args.layers))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 1)
    start = time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        ids, labels = make_batch(args.batch, args.train_len, gen)
        loss = F.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == args.steps:
            print(f"  {kernel:>14} step {step:4d} loss {loss.item():.3f}", file=sys.stderr, flush=True)
    train_seconds = time.perf_counter() - start
    model.eval()
    evals = [evaluate(model, n, args.eval_samples, max(1, min(args.eval_samples, args.eval_tokens // n)), args.seed + 100)
             for n in args.eval_lens]
    return {"kernel": kernel, "train_seconds": round(train_seconds, 1), "final_loss": round(loss.item(), 4),
            "eval": evals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Needle retrieval across long inputs: dense vs sparse attention.",
                                     epilog="example: python examples/long_inputs/needle.py --steps 200 "
                                            "--eval-lens 256,8192,16384")
    parser.add_argument("--kernels", default="auto,sliding_window,longformer")
    parser.add_argument("--train-len", type=int, default=256)
    parser.add_argument("--eval-lens", default="256,8192,16384")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-samples", type=int, default=32)
    parser.add_argument("--eval-tokens", type=int, default=16384, help="tokens per evaluation batch")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results JSON here (atomically)")
    args = parser.parse_args(argv)
    args.eval_lens = [int(n) for n in args.eval_lens.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {"task": "needle", "args": {k: v for k, v in vars(args).items() if k != "out"},
               "torch": torch.__version__, "runs": [run(k, args) for k in args.kernels.split(",")]}
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        from attnlab.io.files import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
