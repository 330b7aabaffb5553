"""`attnlab parallel`: plan a tensor/pipeline/data-parallel run.

`attnlab parallel cost CONFIG --tp 2 --dp 2 --seq-len 512 --batch 8` prints what each layer
communicates per training step: the tensor-parallel all-reduces (forward and backward) and the
data-parallel gradient all-reduce.

`attnlab parallel plan CONFIG --nproc 8 --tp 2 --pp 2 --micro-batches 8` prints, for each
pipeline stage, the memory of one rank (weights, gradients, Adam states, activations held at
once under GPipe and 1F1B) and the bytes it sends per step on each axis, with the pipeline
bubble (P-1)/(m+P-1). To train on several processes, use `attnlab train CONFIG --nproc N` (or
`torchrun --nproc-per-node N -m attnlab.cli.main train CONFIG`).
"""

from __future__ import annotations

import argparse
import json

from attnlab.cli.model import resolve_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("parallel", help="data/tensor/pipeline-parallel planning: memory per rank, communication, pipeline bubble",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="example: attnlab parallel cost gpt2-small --tp 2 --dp 2 --seq-len 1024 --batch 8")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("cost", help="bytes all-reduced per layer and step (tensor parallel) and per step (data parallel)",
                       epilog="example: attnlab parallel cost vaswani-base --tp 2 --dp 2 --seq-len 256 --batch 16")
    p.add_argument("config", help="a preset name or a config.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel size (default 1)")
    p.add_argument("--seq-len", type=int, default=512, help="sequence length (the source's for encoder-decoders)")
    p.add_argument("--tgt-len", type=int, default=None, help="target length of an encoder-decoder (default --seq-len)")
    p.add_argument("--batch", type=int, default=8, help="rows per data-parallel rank")
    p.add_argument("--bytes", type=int, default=4, dest="bytes_per_value", help="bytes per value: 4 fp32, 2 bf16")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cost)
    p = sub.add_parser("plan", help="memory per rank and bytes per step of a tp x pp x dp layout, and the "
                       "pipeline bubble",
                       epilog="example: attnlab parallel plan gpt2-small --set vocab_size=50304 --nproc 8 --tp 2 "
                              "--pp 2 --micro-batches 8 --seq-len 1024 --batch 16")
    p.add_argument("config", help="a preset name or a config.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--nproc", type=int, required=True, help="number of processes N = tp x pp x dp")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size: stages (default 1)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel size (default N / (tp x pp))")
    p.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step, m (default 1)")
    p.add_argument("--seq-len", type=int, default=512, help="sequence length (the source's for encoder-decoders)")
    p.add_argument("--tgt-len", type=int, default=None, help="target length of an encoder-decoder (default --seq-len)")
    p.add_argument("--batch", type=int, default=8, help="rows per data-parallel rank and step (m micro-batches)")
    p.add_argument("--bytes", type=int, default=4, dest="bytes_per_value",
                   help="bytes per activation value and message: 4 fp32, 2 bf16")
    p.add_argument("--fsdp", action="store_true", help="the data axis shards weights, gradients and Adam states")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_plan)


def _cost(args: argparse.Namespace) -> int:
    from attnlab.parallel.cost import communication_cost, format_cost

    config = resolve_config(args.config, args.set)
    cost = communication_cost(config, tp=args.tp, dp=args.dp, seq_len=args.seq_len, batch=args.batch,
                              tgt_len=args.tgt_len, bytes_per_value=args.bytes_per_value)
    print(json.dumps(cost, indent=2) if args.json else format_cost(cost))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from attnlab.parallel.plan import format_plan, plan_layout

    config = resolve_config(args.config, args.set)
    plan = plan_layout(config, nproc=args.nproc, tp=args.tp, pp=args.pp, dp=args.dp, micro_batches=args.micro_batches,
                       seq_len=args.seq_len, batch=args.batch, tgt_len=args.tgt_len,
                       bytes_per_value=args.bytes_per_value, fsdp=args.fsdp)
    print(json.dumps(plan, indent=2) if args.json else format_plan(plan))
    return 0
