"""RNN vs LSTM vs LSTM + attention vs Transformer on the same data and budget.

The task is synthetic: reverse a random sequence of symbols (a copy task where the first output
depends on the last input and the last output on the first), at growing lengths. Every model
sees the same batches for the same number of steps with the same optimiser; we report the
exact-match and token accuracy of greedy (teacher-forced argmax) outputs on held-out sequences.
What the lecture predicts: the fixed-size bottleneck (RNN, LSTM without attention) degrades as
the length grows; attention (LSTM + Bahdanau/Luong, Transformer) does not.

    python examples/rnn_vs_transformer/run.py --lengths 8 16 --steps 400

The same comparison on real translation, at equal CPU time, through `attnlab train`'s pipeline,
is the study `examples/studies/rnn_vs_transformer/run.py` (`--corpus de-en` for English->German).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from attnlab import ModelConfig, build_model

PAD, BOS, FIRST = 0, 1, 2  # symbols are FIRST .. FIRST + num_symbols - 1


def batch(n: int, length: int, num_symbols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(FIRST, FIRST + num_symbols, (n, length), generator=gen)
    tgt = torch.cat([torch.full((n, 1), BOS), src.flip(1)], 1)  # BOS + reversed source
    return src, tgt


def configs(vocab: int, d: int, hidden: int) -> dict[str, ModelConfig]:
    def rnn(cell: str, attention: str) -> ModelConfig:
        return ModelConfig(arch="rnn_encoder_decoder", vocab_size=vocab, d_model=d, dropout=0.0,
                           rnn={"cell": cell, "attention": attention, "hidden_size": hidden})

    return {
        "rnn": rnn("rnn", "none"),
        "lstm": rnn("lstm", "none"),
        "lstm+attention (Luong general)": rnn("lstm", "general"),
        "lstm+attention (Bahdanau)": rnn("lstm", "additive"),
        "transformer": ModelConfig(arch="encoder_decoder", vocab_size=vocab, d_model=d, num_layers=2, num_heads=4,
                                   d_ff=2 * d, dropout=0.0, norm_placement="pre",
                                   position={"scheme": "learned", "max_len": 256}),
    }


def evaluate(model, src, tgt) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        pred = model(src, tgt[:, :-1]).argmax(-1)
    model.train()
    right = pred == tgt[:, 1:]
    return float(right.float().mean()), float(right.all(1).float().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[8, 16])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--symbols", type=int, default=10)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--models", nargs="*", help="a subset of the model names")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    vocab = FIRST + args.symbols
    results = []
    for length in args.lengths:
        test = batch(500, length, args.symbols, torch.Generator().manual_seed(args.seed + 1000))
        for name, cfg in configs(vocab, args.d_model, args.hidden).items():
            if args.models and name not in args.models:
                continue
            torch.manual_seed(args.seed)
            model = build_model(cfg)
            params = sum(p.numel() for p in model.parameters())
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            gen = torch.Generator().manual_seed(args.seed)  # the same batches for every model
            start = time.time()
            for _ in range(args.steps):
                src, tgt = batch(args.batch_size, length, args.symbols, gen)
                loss = F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
                opt.zero_grad()
                loss.backward()
                opt.step()
            tok_acc, exact = evaluate(model, *test)
            row = {"length": length, "model": name, "params": params, "steps": args.steps, "train_loss": loss.item(),
                   "token_accuracy": round(tok_acc, 4), "exact_match": round(exact, 4),
                   "seconds": round(time.time() - start, 1)}
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        from attnlab.io.files import atomic_write_text

        atomic_write_text(args.out, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
