"""Entry point of the `attnlab` command.

Each subcommand lives in its own module of this package and exposes
``add_parser(subparsers)``, which registers an ``argparse`` parser whose
``func`` default is called with the parsed arguments. To add a subcommand,
write the module and list it in ``SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ["convert", "data", "demo", "embed", "eval", "finetune", "generate", "inspect", "model", "parallel", "predict", "tokenizer", "train", "translate"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="Build, pretrain, fine-tune, decode and inspect Transformers and their recurrent ancestors.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"attnlab.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"attnlab {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
