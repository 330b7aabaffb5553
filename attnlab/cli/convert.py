"""`attnlab convert SRC DST [--to hf|attnlab]`: weights between attnlab and Hugging Face folders.

SRC is one of:

    a Hugging Face folder     config.json (with `model_type`) + model.safetensors or pytorch_model.bin
    an attnlab folder         config.json (a ModelConfig, with `arch`) + model.safetensors
    an `attnlab train` run    config.json (with `model`) + checkpoints/: its best checkpoint
    a checkpoint              checkpoints/step-N/ of a run (or the checkpoints/ folder: its best),
                              read with its run's config.json and tokenizer.json
    hf:NAME[@REVISION]        a Hugging Face Hub model: its snapshot in huggingface_hub's cache,
                              downloaded there when online, the cache alone with HF_HUB_OFFLINE=1
                              (safetensors weights only; attnlab.interop.hub)

Without --to, the output is the other kind (a run or checkpoint becomes a Hugging Face folder).
A tokenizer beside the weights (tokenizer.json, BERT's vocab.txt, a run's tokenizer.json) is
carried over as tokenizer.json; a Hugging Face output also gets tokenizer_config.json and
config.json token ids taken from it (`attnlab.interop.special`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attnlab.io.files import read_json

CONFIG = "config.json"
_NOT_A_MODEL = ("expected config.json (an attnlab or Hugging Face model folder, or an `attnlab train` run folder "
                "with checkpoints/) or a checkpoint folder (state.json + model.safetensors, as in "
                "RUN/checkpoints/step-N/)")


def source_kind(folder: Path) -> str:
    """What SRC is: "hf", "attnlab" or "run" (a run, checkpoints/ or checkpoint folder).

    Raises:
        FileNotFoundError: not a folder, or a folder with none of the files looked for (named).
        ValueError: a config.json of none of the three kinds.
    """
    from attnlab.io.checkpoints import list_checkpoints

    if not folder.exists():
        raise FileNotFoundError(f"SRC {folder} does not exist")
    if not folder.is_dir():
        raise FileNotFoundError(f"SRC {folder} is a file, not a model folder: {_NOT_A_MODEL}")
    if (folder / CONFIG).is_file():
        data = read_json(folder / CONFIG)
        for key, kind in (("arch", "attnlab"), ("model_type", "hf"), ("model", "run")):
            if key in data:
                return kind
        raise ValueError(f"{folder / CONFIG} is neither an attnlab config (no 'arch'), a Hugging Face config "
                         "(no 'model_type') nor an `attnlab train` run config (no 'model')")
    if (folder / "state.json").is_file() or list_checkpoints(folder):
        return "run"
    raise FileNotFoundError(f"SRC {folder} is not a model folder: {_NOT_A_MODEL}")


def read_run(folder: Path) -> tuple[Any, Path, Path]:
    """(model in eval mode, checkpoint read, run folder) of a run, checkpoints/ or checkpoint
    folder; the checkpoint is found as `attnlab eval` and `attnlab.load` find it (the best)."""
    from attnlab.config import ModelConfig
    from attnlab.models import build_model
    from attnlab.io.checkpoints import load_checkpoint, resolve_checkpoint

    checkpoint = resolve_checkpoint(folder, "best")
    run = checkpoint.parent.parent
    config = run / CONFIG
    if not config.is_file():
        raise FileNotFoundError(f"{config} is missing: a checkpoint is read with the config.json of its run "
                                "(RUN/config.json beside RUN/checkpoints/)")
    data = read_json(config)
    if not isinstance(data.get("model"), dict):
        raise ValueError(f"{config} has no 'model' section; expected the config.json `attnlab train` writes")
    model = build_model(ModelConfig.from_dict(data["model"]))
    load_checkpoint(checkpoint, model=model)  # checks both files' sha256 and that every tensor fits
    return model.eval(), checkpoint, run


def _tokenizer(folder: Path):
    for name in ("tokenizer.json", "vocab.txt"):
        if (folder / name).is_file():
            from attnlab.tokenizers import Tokenizer

            return Tokenizer.load(folder / name)
    return None


def _run(args: argparse.Namespace) -> int:
    from attnlab.interop import from_hf, save_hf
    from attnlab.interop.serialization import load, save

    from attnlab.interop.hub import is_hub_name, resolve_model_path

    src, dst = resolve_model_path(args.src), Path(args.dst)  # an hf:NAME: its snapshot folder in the cache
    kind = source_kind(src)
    if src.resolve() == dst.resolve():
        raise ValueError("DST must differ from SRC")
    tokenizer_folder, origin = src, f"{kind} {src}"
    if is_hub_name(args.src):
        origin = f"{args.src} (commit {src.name})"
    if kind == "run":
        model, checkpoint, tokenizer_folder = read_run(src)
        origin = f"run {tokenizer_folder} (checkpoint {checkpoint.name})"
    else:
        model = from_hf(src) if kind == "hf" else load(src)
    to = args.to or ("attnlab" if kind == "hf" else "hf")
    tokenizer = None if args.no_tokenizer else _tokenizer(tokenizer_folder)
    if args.print_config:  # the model's config as it will be written, and nothing written
        print(model.config.to_json())
        return 0
    if to == "attnlab":
        save(model, dst, tokenizer=tokenizer)
    else:
        save_hf(model, dst, family=args.family, tokenizer=tokenizer)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    print(f"converted {origin} -> {to} {dst} ({n:,} parameters"
          f"{', with tokenizer.json' if tokenizer is not None else ''})", file=sys.stderr)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert weights between attnlab and Hugging Face folders",
        description="Convert a model folder between attnlab's format and Hugging Face's (GPT-2, BERT, BART,\n"
                    "Marian, T5); an `attnlab train` run folder (its best checkpoint) or one checkpoint folder\n"
                    "converts too. Weights are read without unpickling objects and written atomically.",
        epilog="examples: attnlab convert runs/char-gpt hf-char/   (a run's best checkpoint -> Hugging Face)\n"
               "          attnlab convert hf-gpt2/ gpt2-attnlab/   (then: attnlab convert gpt2-attnlab/ back/ --to hf)\n"
               "          attnlab convert hf:gpt2 gpt2-attnlab/    (a Hub model, through huggingface_hub's cache;\n"
               "                                                   with HF_HUB_OFFLINE=1 from the cache alone)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", metavar="SRC",
                        help="a Hugging Face or attnlab model folder, an `attnlab train` run folder, a checkpoint "
                             "folder (RUN/checkpoints/step-N), or a Hugging Face Hub model hf:NAME[@REVISION]")
    parser.add_argument("dst", metavar="DST", help="the folder to write (replaced if it is a model folder)")
    parser.add_argument("--to", choices=("hf", "attnlab"), default=None,
                        help="output format (default: the other one; hf for a run or checkpoint)")
    parser.add_argument("--family", choices=("gpt2", "bert", "bart", "marian", "t5"), default=None,
                        help="with --to hf: the Hugging Face family (default: picked from the config)")
    parser.add_argument("--no-tokenizer", action="store_true", help="do not carry a tokenizer over")
    parser.add_argument("--print-config", action="store_true",
                        help="print the model's config (JSON) and stop, writing nothing")
    parser.set_defaults(func=_run)
