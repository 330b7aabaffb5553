"""Segment-level recurrence (Transformer-XL, Dai et al. 2019) against context fragmentation,
measured on the built-in Shakespeare corpus.

A char-level decoder with rotary positions reads the training text as B parallel streams, in
consecutive segments of T characters (`attnlab.training.tasks.recurrence`), through the one Trainer:

- `memory`: each segment also attends over the previous segment's layer inputs (memory_len M = T,
  detached), as Transformer-XL trains;
- `no memory` (the baseline, unless --no-baseline): the same batches, every segment on its own.

Both are then scored on the validation text read segment by segment at T in --eval-lens, with a
memory of M = T and without one: the same tokens, the same segment length, only the memory
differs. Without it every segment starts from nothing (the first characters of a segment see
almost no context: `first` vs `last` columns).

    OMP_NUM_THREADS=1 python examples/segment_recurrence/run.py --minutes 4 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from attnlab import ModelConfig, build_model
from attnlab.data import corpora
from attnlab.tokenizers import Tokenizer
from attnlab.training.config import TrainConfig
from attnlab.training.tasks.recurrence import RecurrenceTask, batchify, stream_loss
from attnlab.training.trainer import Trainer


def load_corpus(train_chars: int | None) -> tuple[Tokenizer, torch.Tensor, torch.Tensor]:
    """The char tokenizer of the training text and both splits as token streams."""
    paths = corpora.split_files("shakespeare")
    train_text = paths["train"].read_text(encoding="utf-8")[:train_chars]
    valid_text = paths["valid"].read_text(encoding="utf-8")
    tok = Tokenizer.train([train_text], kind="char")
    return tok, torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(valid_text))


def model_config(args: argparse.Namespace, vocab_size: int) -> ModelConfig:
    return ModelConfig(arch="decoder", vocab_size=vocab_size, d_model=args.d_model, num_layers=args.layers,
                       num_heads=args.heads, d_ff=4 * args.d_model, dropout=args.dropout, norm_placement="pre",
                       position={"scheme": "rotary"}, memory_len=args.seq_len, pad_token_id=None)


def train(args: argparse.Namespace, name: str, mem_len: int, vocab_size: int, train_ids: torch.Tensor,
          valid_ids: torch.Tensor, out: Path, minutes: float | None) -> tuple[torch.nn.Module, dict]:
    """One model trained for `minutes` (or --steps) on consecutive segments, with a memory of
    mem_len (0: none)."""
    cfg = model_config(args, vocab_size)
    config = TrainConfig.from_dict({
        "model": cfg.to_dict(),
        "optim": {"lr": args.lr, "weight_decay": 0.1},
        "schedule": {"name": "constant", "warmup_steps": 100},
        "train": {"out_dir": str(out / name.replace(" ", "_")), "max_steps": args.steps or 10**7,
                  "max_minutes": None if args.steps else minutes,
                  "eval_every": 10**7, "log_every": 200, "checkpoint_every": 10**7, "seed": args.seed,
                  "threads": args.threads, "device": "cpu", "precision": "fp32"}})
    torch.manual_seed(args.seed)
    model = build_model(config.model_config())
    task = RecurrenceTask(train_ids, valid_ids, batch_size=args.batch_size, seq_len=args.seq_len, mem_len=mem_len,
                          eval_segments=20)
    print(f"== {name}: {sum(p.numel() for p in model.parameters()):,} parameters, T={args.seq_len}, "
          f"M={mem_len}, " + (f"{args.steps} steps" if args.steps else f"{minutes:g} min"), flush=True)
    summary = Trainer(config, task=task, model=model, show_progress=False).fit()
    summary["tokens_seen"] = summary["steps"] * args.batch_size * args.seq_len
    summary["epochs"] = task.epoch + task.position / task.streams.shape[1]
    return model, summary


def evaluate(model: torch.nn.Module, valid_ids: torch.Tensor, eval_lens: list[int], batch_size: int) -> list[dict]:
    """Validation loss at each segment length T, read with a memory of T and without, plus the
    mean loss over the first and the last eighth of a segment's positions."""
    streams = batchify(valid_ids, batch_size)
    rows = []
    for T in eval_lens:
        for mem_len in (T, 0):
            start = time.perf_counter()
            result = stream_loss(model, streams, T, mem_len)
            k = max(1, T // 8)
            by_pos = result["by_position"]
            rows.append({"T": T, "M": mem_len, "loss": result["loss"], "tokens": result["tokens"],
                         "first": sum(by_pos[:k]) / k, "last": sum(by_pos[-k:]) / k,
                         "seconds": time.perf_counter() - start})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=4.0, help="training time in all (split between the models)")
    p.add_argument("--steps", type=int, default=None, help="train each model this many steps instead (equal steps)")
    p.add_argument("--seq-len", type=int, default=64, help="T of training (memory_len M = T)")
    p.add_argument("--eval-lens", type=int, nargs="+", default=[32, 64])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-batch-size", type=int, default=16)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--train-chars", type=int, default=None, help="use only the first N training characters")
    p.add_argument("--no-baseline", action="store_true", help="train the memory model only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    start = time.perf_counter()
    tok, train_ids, valid_ids = load_corpus(args.train_chars)
    print(f"shakespeare: {len(train_ids):,} train / {len(valid_ids):,} valid characters, vocabulary {tok.vocab_size}")
    runs = [("memory", args.seq_len)] + ([] if args.no_baseline else [("no memory", 0)])
    results = {"args": vars(args), "load_average_start": load_start, "models": []}
    with tempfile.TemporaryDirectory(prefix="segment-recurrence-") as folder:
        for name, mem_len in runs:
            model, summary = train(args, name, mem_len, tok.vocab_size, train_ids, valid_ids, Path(folder),
                                   args.minutes / len(runs))
            rows = evaluate(model, valid_ids, args.eval_lens, args.eval_batch_size)
            keep = ("steps", "seconds", "train_loss", "tokens_seen", "epochs")
            results["models"].append({"name": name, "trained_mem_len": mem_len,
                                      **{k: summary[k] for k in keep}, "eval": rows})
    results["load_average_end"] = os.getloadavg()
    results["wall_seconds"] = time.perf_counter() - start
    print("\n| trained | steps | train s | eval T | loss, memory M = T | loss, no memory | first 1/8: memory / none"
          " | last 1/8: memory / none |")
    print("|---|---|---|---|---|---|---|---|")
    for m in results["models"]:
        for T in args.eval_lens:
            with_m, without = [next(r for r in m["eval"] if r["T"] == T and r["M"] == M) for M in (T, 0)]
            print(f"| {m['name']} | {m['steps']} | {m['seconds']:.0f} | {T} | {with_m['loss']:.4f} | "
                  f"{without['loss']:.4f} | {with_m['first']:.3f} / {without['first']:.3f} | "
                  f"{with_m['last']:.3f} / {without['last']:.3f} |")
    print(f"\nload average {load_start} at the start, {results['load_average_end']} at the end; "
          f"{results['wall_seconds']:.0f} s wall-clock in all")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
