"""The lecture's "RNN passes cannot be parallelized; Transformers can", measured: the training step
time of the RNN-vs-Transformer study's models at 1 and 2 threads, and the speed-up each gets from
the second core.

Models: the study's Transformer (3 + 3 layers of 256), the LSTM with Luong attention (its decoder
LSTM runs over the whole target at once, attention after it) and the LSTM with Bahdanau attention
(its decoder steps one target token at a time, attending before each step), from
examples/studies/rnn_vs_transformer/run.py's MODELS, vocabulary 8,000. One step: forward,
cross-entropy, backward and an Adam update on a batch of `--batch` pairs of `--src-len` source and
`--tgt-len` target tokens (about a padded random batch of Bible verses), dropout as trained.
Interleaved rounds (each round times every model at every thread count), medians per model and
thread count; the load average is recorded before and after.

    python benchmarks/bench_rnn_threads.py                  # prints one JSON object
    python benchmarks/bench_rnn_threads.py --rounds 7 --out benchmarks/results/rnn-threads.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.cli.argtypes import positive_int
from machine import loadavg, write_result

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "examples" / "studies" / "rnn_vs_transformer" / "run.py"
NAMES = ("transformer", "lstm+luong", "lstm+attention")


@functools.cache
def study_models() -> dict:
    """The study's MODELS table (model sections of its configurations)."""
    sys.path.insert(0, str(STUDY.parents[1]))  # the studies' common.py
    spec = importlib.util.spec_from_file_location("rnn_vs_transformer_run", STUDY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MODELS


def build(name: str, vocab: int):
    from attnlab import ModelConfig, build_model
    from attnlab.training.config import TrainModelConfig

    section = TrainModelConfig.expand_dict(study_models()[name]["model"])  # a preset's fields filled in
    torch.manual_seed(0)
    config = ModelConfig.from_dict({**section, "vocab_size": vocab, "pad_token_id": 0})
    return build_model(config).train()


def step_fn(model, batch: int, src_len: int, tgt_len: int, vocab: int):
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (batch, src_len), generator=generator)
    tgt = torch.randint(4, vocab, (batch, tgt_len + 1), generator=generator)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=2, help="steps per timing")
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--src-len", type=positive_int, default=48)
    parser.add_argument("--tgt-len", type=positive_int, default=56)
    parser.add_argument("--vocab", type=positive_int, default=8000)
    parser.add_argument("--models", nargs="+", default=list(NAMES), choices=NAMES)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()

    steps = {}
    for name in args.models:
        model = build(name, args.vocab)
        steps[name] = step_fn(model, args.batch, args.src_len, args.tgt_len, args.vocab)
        steps[name]()  # warm-up: allocator, first-call paths
    times: dict[str, dict[int, list[float]]] = {name: {t: [] for t in args.threads} for name in args.models}
    load_before = loadavg()
    for _ in range(args.rounds):
        for name in args.models:
            for threads in args.threads:
                torch.set_num_threads(threads)
                start = time.perf_counter()
                for _ in range(args.steps):
                    steps[name]()
                times[name][threads].append((time.perf_counter() - start) / args.steps)
    medians = {name: {str(t): statistics.median(v) for t, v in by.items()} for name, by in times.items()}
    low, high = str(min(args.threads)), str(max(args.threads))
    result = {
        "benchmark": "rnn_threads", "args": vars(args), "torch": torch.__version__,
        "step_seconds": medians,
        "speedup": {name: m[low] / m[high] for name, m in medians.items()},
        "rounds": {name: {str(t): v for t, v in by.items()} for name, by in times.items()},
        "loadavg": {"before": load_before, "after": loadavg()},
    }
    write_result(result, args.out)


if __name__ == "__main__":
    main()
