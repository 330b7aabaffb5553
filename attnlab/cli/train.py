"""`attnlab train CONFIG`: train or pretrain a model from a YAML/JSON run config.

Dotted overrides follow the config file: `--model.num_layers 4`, `--optim.lr=3e-4`,
`--train.out_dir runs/x` (values are parsed as JSON when they parse: numbers, true/false,
null, lists). The resolved config is printed and saved as OUT/config.json with the seed and
versions; checkpoints go to OUT/checkpoints/, metrics to OUT/metrics.jsonl, the loss curve to
OUT/loss.png. `--resume` continues from the latest checkpoint exactly.

Start from pretrained weights with `model.init_from`: an `attnlab.save` folder, an `attnlab
train` run folder or a Hugging Face folder (GPT-2, BERT, BART, Marian, T5) — continued pretraining
on your text, or a GPT-2/BART/T5/Marian fine-tuned on your text or sentence pairs. The run then
uses the folder's tokenizer (the data's tokenizer section is not trained);
`model.add_special_tokens: ["[START]", "[DELIM]"]` adds tokens, growing the embeddings and the
tied head (new rows: the mean of the old ones). Example: `--model.init_from hf/gpt2
--data.source my.txt --data.valid my-valid.txt`.
"""

from __future__ import annotations

import argparse
import json

from attnlab.training.config import TrainConfig, apply_overrides, load_config_file, parse_value


def parse_overrides(items: list[str]) -> tuple[list[tuple[str, object]], dict[str, bool]]:
    """`["--model.num_layers", "4", "--optim.lr=3e-4", "--resume"]` -> overrides and flags.

    Raises:
        ValueError: an item that is not `--section.field VALUE` or `--section.field=VALUE`.
    """
    overrides, flags, i = [], {"resume": False, "print_config": False}, 0
    while i < len(items):
        item = items[i]
        if item in ("--resume", "--print-config"):
            flags[item[2:].replace("-", "_")] = True
            i += 1
            continue
        if not item.startswith("--") or "." not in item.split("=")[0]:
            raise ValueError(f"unexpected argument {item!r}; overrides look like --model.num_layers 4 or --optim.lr=3e-4")
        key, sep, raw = item[2:].partition("=")
        if not sep:
            if i + 1 >= len(items):
                raise ValueError(f"override --{key} needs a value")
            raw, i = items[i + 1], i + 1
        overrides.append((key, parse_value(raw)))
        i += 1
    return overrides, flags


def resolve(config_path: str, overrides: list[tuple[str, object]]) -> TrainConfig:
    """Read a config file, apply dotted overrides, validate."""
    return TrainConfig.from_dict(apply_overrides(load_config_file(config_path), overrides))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a model from a YAML/JSON run config", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="example: attnlab train examples/shakespeare_char.json --model.num_layers 4 "
                                          "--train.max_steps 500")
    parser.add_argument("config", help="run config (.yaml, .yml or .json)")
    parser.add_argument("--nproc", type=int, default=1,
                        help="data-parallel processes on this machine: re-launches itself under torchrun "
                             "(DDP; gloo on CPU, NCCL on GPU); also accepted after CONFIG")
    parser.add_argument("overrides", nargs=argparse.REMAINDER,
                        help="--SECTION.FIELD VALUE overrides; --resume continues the run; --print-config stops "
                             "after printing the resolved config")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    import os
    import sys

    from attnlab.parallel.launch import pop_nproc, relaunch

    nproc, rest = pop_nproc(args.overrides)  # [parallel] --nproc N: run this command under torchrun
    nproc = max(nproc, args.nproc)
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        parse_overrides(rest)  # a bad override is an error here, not in N processes
        return relaunch(nproc, ["train", args.config, *rest])
    if os.environ.get("RANK", "0") != "0":
        sys.stdout = open(os.devnull, "w")  # [parallel] rank 0 prints
    overrides, flags = parse_overrides(rest)
    cfg = resolve(args.config, overrides)  # the model section too is validated here, before the data is prepared
    print(json.dumps(cfg.to_dict(), indent=2), flush=True)
    if flags["print_config"]:
        return 0
    from attnlab.training.trainer import NonFiniteLossError, Trainer

    trainer = Trainer(cfg)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    print(f"model: {trainer.model.config.arch}, {n_params:,} parameters; device {trainer.device}", flush=True)
    try:
        summary = trainer.fit(resume=flags["resume"])
    except NonFiniteLossError as err:
        print(f"attnlab train: error: {err}", flush=True)
        return 1
    print("summary: " + json.dumps(summary), flush=True)
    from attnlab.parallel import shutdown

    shutdown()  # [parallel] leave the process group (no-op alone)
    return 0
