"""Does attention give alignment for free? (analysis part written below the training part)"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import cpu_clock_training, cpu_minutes, loadavg, read_json, run_workers, shared_tokenizer, write_json  # noqa: E402
from attnlab.cli.argtypes import positive_int  # noqa: E402

CORPUS = "bible-en-es"
MODELS = ("transformer", "lstm+attention", "lstm+luong")
LABELS = {"transformer": "Transformer (translation_en_es.yaml)", "lstm+attention": "LSTM + Bahdanau attention",
          "lstm+luong": "LSTM + Luong attention"}


def study(name: str):
    """Another study's run.py as a module (its model configurations are reused, not copied)."""
    spec = importlib.util.spec_from_file_location(f"study_{name}", HERE.parent / name / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_dir(out: Path, name: str) -> Path:
    return out / name.replace("+", "_")


def marks_of(name: str, args: argparse.Namespace) -> list[float]:
    return sorted(args.marks if name == "transformer" else args.rnn_marks)


def train_config(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The translation study's recipe for the Transformer; rnn_vs_transformer's configurations
    (and its shared tokenizer) for the two LSTMs."""
    out = Path(args.out)
    if name == "transformer":
        translation = study("translation")
        return translation.run_config(CORPUS, run_dir(out, name), Path(args.recipe))
    rnn = study("rnn_vs_transformer")
    ns = argparse.Namespace(corpus=CORPUS, batch_tokens=None)
    return rnn.run_config(name, run_dir(out, name), out / "tokenizer.json", ns)


def train(name: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = run_dir(Path(args.out), name)
    folder.mkdir(parents=True, exist_ok=True)
    return cpu_clock_training(train_config(name, args), folder, marks_of(name, args), name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/alignment-study")
    p.add_argument("--recipe", default=str(HERE.parents[1] / "translation_en_es.yaml"))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--marks", type=cpu_minutes, nargs="+", default=[15, 20, 25],
                   help="CPU minutes at which the Transformer is saved (the last is its budget)")
    p.add_argument("--rnn-marks", type=cpu_minutes, nargs="+", default=[5, 10, 15],
                   help="CPU minutes at which each LSTM is saved (the last is its budget)")
    p.add_argument("--jobs", type=positive_int, default=3)
    p.add_argument("--train-only", action="store_true")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.worker:
        train(args.worker, args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if any(m != "transformer" for m in args.models):
        shared_tokenizer(out, CORPUS, "seq2seq")
    base = [sys.executable, __file__, "--out", args.out, "--recipe", args.recipe, "--marks", *map(str, args.marks),
            "--rnn-marks", *map(str, args.rnn_marks)]
    run_workers({m: base + ["--worker", m] for m in args.models}, args.jobs)


if __name__ == "__main__":
    main()
