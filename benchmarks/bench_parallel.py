"""Data-parallel scaling on this machine: 2 processes x 1 thread (DDP over gloo) against
1 process x 2 threads, the same model, global batch and number of Adam steps. Prints JSON with
each side's tokens/s and the ratio (> 1: data parallel is faster).

Model (defaults): decoder, 4 layers, d_model 256, 4 heads, d_ff 1024, vocab 4,096, seq_len 128,
global batch 16 (8 per rank). Timing starts after warm-up steps and a barrier; each side
reports the median step time of `--repeats` timed windows. Tensor-parallel throughput needs
GPUs (on CPU the two ranks compete for the same cores); it is not measured here.

    python benchmarks/bench_parallel.py            # ~1 minute on 2 cores
    python benchmarks/bench_parallel.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import attnlab
from attnlab.parallel import shard_batch, spawn, wrap_model


def _config(args) -> attnlab.ModelConfig:
    return attnlab.ModelConfig.from_dict(dict(arch="decoder", vocab_size=4096, d_model=args["d_model"],
                                              num_layers=args["layers"], num_heads=4, d_ff=4 * args["d_model"],
                                              dropout=0.0, norm_placement="pre", head="lm"))


def _batch(args, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 4096, (args["batch"], args["seq_len"] + 1), generator=g)


def _train(ctx, args: dict) -> list[float]:
    """Seconds per step of `repeats` windows of `steps` steps each, after `warmup` steps."""
    torch.manual_seed(0)
    model = attnlab.build_model(_config(args))
    ddp = wrap_model(model, ctx)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(i: int) -> None:
        ids = shard_batch(_batch(args, i), ctx)
        opt.zero_grad(set_to_none=True)
        logits = ddp(ids[:, :-1])
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
        opt.step()

    for i in range(args["warmup"]):
        step(i)
    times = []
    for r in range(args["repeats"]):
        ctx.barrier()
        start = time.perf_counter()
        for i in range(args["steps"]):
            step(1000 + r * args["steps"] + i)
        ctx.barrier()
        times.append((time.perf_counter() - start) / args["steps"])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller model, fewer steps")
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    args = dict(d_model=256, layers=4, seq_len=128, batch=16, warmup=2, steps=5, repeats=opts.repeats)
    if opts.quick:
        args.update(d_model=128, layers=2, seq_len=64, steps=3, repeats=2)
    from attnlab.training.strategy.distributed import ParallelContext

    torch.set_num_threads(2)
    before = _train(ParallelContext(), args)  # the single process runs before and after the DDP
    dp_times = spawn(_train, 2, args=(args,), threads=1, timeout_s=600, collective_timeout_s=300)
    after = _train(ParallelContext(), args)  # one, so that a change of load shows up as a spread
    single = statistics.median(before + after)
    dp = statistics.median(max(window) for window in zip(*dp_times))  # a step ends when both ranks are done
    tokens = args["batch"] * args["seq_len"]
    print(json.dumps({
        "benchmark": "data_parallel_scaling", "config": args,
        "single_process_2_threads": {"s_per_step": single, "tokens_per_s": tokens / single,
                                     "windows_s_per_step": before + after},
        "ddp_2_processes_1_thread": {"s_per_step": dp, "tokens_per_s": tokens / dp,
                                     "windows_s_per_step": [max(w) for w in zip(*dp_times)]},
        "ratio_ddp_over_single": single / dp,
        "tensor_parallel": "not measured: no GPU in this environment (on 2 CPU cores the ranks share the cores)",
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                    "note": "shared, loaded machine: numbers vary between runs"},
    }, indent=2))


if __name__ == "__main__":
    main()
