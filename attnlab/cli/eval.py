"""`attnlab eval CKPT`: evaluate a training checkpoint on its run's validation data.

CKPT is a run folder (its best checkpoint by default), a `checkpoints/` folder or one
checkpoint folder. Prints the validation loss and perplexity (and BLEU/chrF for seq2seq) as JSON.
"""

from __future__ import annotations

import argparse


def evaluate_checkpoint(path: str, which: str = "best", batches: int | None = None) -> dict:
    """Rebuild the run of checkpoint `path` from its config.json and evaluate it.

    Raises:
        FileNotFoundError: no checkpoint or no config.json beside it.
        CheckpointError: a corrupted checkpoint.
        ValueError: a config.json that is not a run's.
    """
    from attnlab.config import ModelConfig
    from attnlab.io.files import read_json
    from attnlab.models import build_model
    from attnlab.io.checkpoints import load_checkpoint, resolve_checkpoint
    from attnlab.training.config import TrainConfig
    from attnlab.training.trainer import Trainer

    ckpt = resolve_checkpoint(path, which)
    run_dir = ckpt.parent.parent
    config_file = run_dir / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"{config_file} is missing; eval needs the run folder written by `attnlab train`")
    saved = read_json(config_file)
    if not isinstance(saved.get("config"), dict) or not isinstance(saved.get("model"), dict):
        raise ValueError(f"{config_file}: expected the config.json of an `attnlab train` run (with 'config' and "
                         "'model' sections)")
    cfg = TrainConfig.from_dict(saved["config"])
    cfg.train.out_dir = str(run_dir)  # the tokenizer lives there, whatever the working folder
    if batches is not None:
        cfg.train.eval_batches = batches
    model = build_model(ModelConfig.from_dict(saved["model"]))
    state = load_checkpoint(ckpt, model=model)
    trainer = Trainer(cfg, model=model, show_progress=False, log=lambda _: None)
    return {"checkpoint": str(ckpt), "step": state["step"], **trainer.evaluate()}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a training checkpoint", description=__doc__,
                                   epilog="example: attnlab eval runs/shakespeare-char --which latest")
    parser.add_argument("checkpoint", help="run folder, checkpoints/ folder or checkpoint folder")
    parser.add_argument("--which", choices=("best", "latest"), default="best",
                        help="which checkpoint of a run folder (default best)")
    parser.add_argument("--batches", type=int, default=None, help="evaluation batches (default: the run's)")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.batches is not None and args.batches <= 0:
        raise ValueError(f"--batches must be positive, got {args.batches}")
    from attnlab.io.files import json_text

    print(json_text(evaluate_checkpoint(args.checkpoint, args.which, args.batches), indent=2))
    return 0
