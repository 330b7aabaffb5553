"""`attnlab finetune CONFIG`: fine-tune a pretrained model on a labelled CSV/JSONL task.

The config (YAML or JSON) names the model (`minilm`, an attnlab or Hugging Face folder, or an
`attnlab train` run folder), the data files and columns, the recipe (lr, layer_decay,
reinit_layers, freeze_embeddings, freeze_layers, lm_loss_weight, ...) and the seed sweep; see
attnlab.finetune.job. Relative paths are relative to the working folder. The output
folder gets the fine-tuned model (attnlab.save, with tokenizer and labels.json), summary.json,
metrics.jsonl and a confusion matrix (text and PNG). With `head: token_classification` the
data rows hold words and one label per word (JSONL lists, or space-separated CSV columns);
metrics are over words (token accuracy, macro-F1) and words cut by max_length are counted.
Each seed trains on the one training loop with checkpoints under out_dir/runs/; `--resume`
continues an interrupted job and ends as the uninterrupted one would (with no checkpoint there
yet it warns and starts afresh). Ctrl-C (or SIGTERM / SIGUSR1: a scheduler's preemption) saves the
current seed's checkpoint after its step, prints the command that resumes the job and exits with
128 + the signal's number (130, 143, 138). One line tells the setup; `--print-config` prints the
resolved config and stops. An out_dir that holds an earlier
job's model or checkpoints is refused unless `--overwrite`; a job running on the out_dir refuses a
second one (out_dir/.attnlab.lock).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "finetune", help="fine-tune a pretrained model on a classification or tagging task", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: attnlab finetune examples/finetune/translation_pairs_minilm.json --out-dir runs/pairs")
    parser.add_argument("config", help="finetune config (.json, .yaml or .yml)")
    parser.add_argument("--out-dir", default=None, help="override the config's out_dir (relative to the cwd)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on a busy machine)")
    parser.add_argument("--max-steps", type=int, default=None, help="override recipe.max_steps")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted job from its checkpoints (out_dir/runs), exactly")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (every field, defaults included) and stop")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the fine-tuned model and checkpoints of an earlier job in out_dir")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from attnlab.finetune.job import run_finetune
    from attnlab.training.config import load_config_file
    from attnlab.training.run.signals import TrainingInterrupted

    path = Path(args.config)
    config = load_config_file(path)
    if args.out_dir is not None:
        config["out_dir"] = str(Path(args.out_dir).resolve())
    if args.threads is not None:
        config["threads"] = args.threads
    if args.max_steps is not None:
        config.setdefault("recipe", {})["max_steps"] = args.max_steps
    from attnlab.config.load import to_dict
    from attnlab.finetune.job import FinetuneJobConfig

    job = FinetuneJobConfig.from_dict(config)  # every field checked before anything is read or written
    if args.print_config:
        print(json.dumps(to_dict(job), indent=2))
        return 0
    print(f"finetune: {job.model} | {job.head} | train {job.data.train} | {job.recipe.max_steps:,} steps x "
          f"{len(job.seeds)} seed(s) | out {job.out_dir}", flush=True)
    again = ["attnlab", "finetune", args.config,
             *(["--out-dir", args.out_dir] if args.out_dir is not None else []),
             *(["--max-steps", str(args.max_steps)] if args.max_steps is not None else []),
             *(["--threads", str(args.threads)] if args.threads is not None else [])]
    try:
        run_finetune(config, resume=args.resume, overwrite=args.overwrite,
                     command=shlex.join(again + ["--resume"] * args.resume + ["--overwrite"] * args.overwrite))
    except TrainingInterrupted as err:
        print(f"attnlab finetune: {err}\nresume with: {shlex.join(again + ['--resume'])}", file=sys.stderr, flush=True)
        return err.exit_status  # 128 + the signal's number: 130 Ctrl-C, 143 SIGTERM
    return 0
