"""`attnlab convert SRC DST [--to hf|attnlab]`: weights between attnlab and Hugging Face folders.

A Hugging Face folder has config.json (with `model_type`) and model.safetensors or
pytorch_model.bin; an attnlab folder has config.json (a ModelConfig) and model.safetensors.
Without --to, the output is the other kind. A tokenizer beside the weights (tokenizer.json,
or BERT's vocab.txt) is carried over as tokenizer.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.io.files import read_json


def _kind(folder: Path) -> str:
    data = read_json(folder / "config.json")
    if "arch" in data:
        return "attnlab"
    if "model_type" in data:
        return "hf"
    raise ValueError(f"{folder / 'config.json'} is neither an attnlab config (no 'arch') nor a Hugging Face "
                     "config (no 'model_type')")


def _tokenizer(folder: Path):
    for name in ("tokenizer.json", "vocab.txt"):
        if (folder / name).is_file():
            from attnlab.tokenizers import Tokenizer

            return Tokenizer.load(folder / name)
    return None


def _run(args: argparse.Namespace) -> int:
    from attnlab.interop import from_hf, save_hf
    from attnlab.io.serialization import load, save

    src, dst = Path(args.src), Path(args.dst)
    if not src.is_dir():
        raise FileNotFoundError(f"SRC {src} is not a folder")
    if src.resolve() == dst.resolve():
        raise ValueError("DST must differ from SRC")
    kind = _kind(src)
    to = args.to or ("attnlab" if kind == "hf" else "hf")
    model = from_hf(src) if kind == "hf" else load(src)
    tokenizer = None if args.no_tokenizer else _tokenizer(src)
    print(model.config.to_json())
    if to == "attnlab":
        save(model, dst, tokenizer=tokenizer)
    else:
        save_hf(model, dst, family=args.family, tokenizer=tokenizer)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    print(f"converted {kind} {src} -> {to} {dst} ({n:,} parameters"
          f"{', with tokenizer.json' if tokenizer is not None else ''})", file=sys.stderr)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert weights between attnlab and Hugging Face folders",
        description="Convert a model folder between attnlab's format and Hugging Face's (GPT-2, BERT, BART, "
                    "Marian, T5). Weights are read without unpickling objects and written atomically.",
        epilog="example: attnlab convert hf-gpt2/ gpt2-attnlab/   (then: attnlab convert gpt2-attnlab/ back/ --to hf)")
    parser.add_argument("src", metavar="SRC", help="a Hugging Face or attnlab model folder")
    parser.add_argument("dst", metavar="DST", help="the folder to write (replaced if it is a model folder)")
    parser.add_argument("--to", choices=("hf", "attnlab"), default=None,
                        help="output format (default: the other one)")
    parser.add_argument("--family", choices=("gpt2", "bert", "bart", "marian", "t5"), default=None,
                        help="with --to hf: the Hugging Face family (default: picked from the config)")
    parser.add_argument("--no-tokenizer", action="store_true", help="do not carry a tokenizer over")
    parser.set_defaults(func=_run)
