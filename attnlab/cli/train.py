"""`attnlab train CONFIG`: train or pretrain a model from a YAML/JSON run config.

Dotted overrides follow the config file: `--model.num_layers 4`, `--optim.lr=3e-4`,
`--train.out_dir runs/x` (values are parsed as JSON when they parse: numbers, true/false,
null, lists). One line tells the resolved setup (model, parameters, data, steps, precision),
after a line per model field the data section set (`implied: model.arch: encoder
(data.objective='masked_lm' implies it)`: a field you set yourself is never replaced, a different
value there is refused); the whole resolved config is saved as OUT/config.json with the seed and
versions (`--print-config` prints it on stdout, the implied lines on stderr, and stops); checkpoints go to OUT/checkpoints/, metrics to OUT/metrics.jsonl, the loss
curve to OUT/loss.png.

Continue a run from its folder alone: `attnlab train --resume OUT` rebuilds it from OUT/config.json
(every override given when it started is in there) and goes on from the latest checkpoint,
ending bitwise equal to a run that was never stopped. Overrides after it apply on top
(`--train.max_steps 2000`), except ones that change the model's shape or the tokenizer, which are
refused. `attnlab train OUT/config.json` (or `attnlab train OUT`) rebuilds the run from that
file too: add `--resume`, or give another `--train.out_dir` for a fresh copy. `attnlab train CONFIG
--resume` also continues, from CONFIG and its overrides as given (a model that differs from the
run's is refused). `--resume` where there is no checkpoint yet warns and starts from step 0.

Ctrl-C, SIGTERM and SIGUSR1 (what SLURM, Kubernetes and `timeout` send before they kill a job;
`train.stop_signals` sets which) finish the current step, save a checkpoint, print the command
that resumes it and exit with 128 + the signal's number: 130 (Ctrl-C), 143 (SIGTERM), 138
(SIGUSR1). A second signal stops at once; the resume then goes on from the latest checkpoint. One run writes to an out_dir at a time: a second `attnlab train` on a folder
that a live run holds is refused, naming it (the lock is OUT/.attnlab.lock, removed at exit; a
lock left by a killed run on this machine is taken over).

Scale out with `--nproc N` (it re-launches the command under torchrun), and over M machines with
`--nnodes M --rdzv-endpoint HOST:PORT` given on each (HOST:PORT: where they meet, on one of them):
N x M data-parallel replicas by default, or the layout of a `parallel` section,
`parallel: {tp: 2, pp: 2, micro_batches: 4, schedule: 1f1b}` (tensor x pipeline x data = N x M,
attnlab.training.config.ParallelConfig). The layout is checked against the model and the data
before any process starts; checkpoints hold the whole model, so a run resumes on another layout:
`attnlab train --resume OUT --parallel.tp 1 --parallel.pp 1` continues it in one process.

Start from pretrained weights with `model.init_from`: an `attnlab.save` folder, an `attnlab
train` run folder, a Hugging Face folder (GPT-2, BERT, BART, Marian, T5) or a Hub model by name
(`hf:gpt2`, `hf:ORG/NAME@REVISION`: through huggingface_hub's cache; offline with
HF_HUB_OFFLINE=1) — continued pretraining on your text, or a GPT-2/BART/T5/Marian fine-tuned on
your text or sentence pairs. The run then uses the model's tokenizer (the data's tokenizer section
is not trained); `model.add_special_tokens: ["[START]", "[DELIM]"]` adds tokens, growing the
embeddings and the tied head (new rows: the mean of the old ones). Example: `--model.init_from
hf:gpt2 --data.source my.txt --data.valid my-valid.txt`.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.config.load import apply_overrides, load_config_file, parse_value

if TYPE_CHECKING:  # the training code (and torch) load when a command runs, not for --help
    from attnlab.training.config import TrainConfig
    from attnlab.training.config_resolve import Resolved


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
            if item == "--resume" and i < len(items) and not items[i].startswith("--"):
                raise ValueError(f"unexpected argument {items[i]!r} after --resume: after CONFIG, --resume takes no "
                                 "value; a run folder goes first: attnlab train --resume RUN_DIR")
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


def resolve(config_path: str, overrides: list[tuple[str, object]], *, resume: bool = False) -> Resolved:
    """Read a run config, apply dotted overrides, validate: the run config, and the model fields
    its data section implied (TrainConfig.resolve; with model.init_from, those set on the folder's model).

    `config_path` is a config file, or a run folder (or its config.json) written by `attnlab
    train`: then the resolved config saved there is the base, with `train.out_dir` that folder.

    Raises:
        ValueError: a bad config (naming the field); with `resume`, a model or tokenizer that
            differs from the one the run in out_dir was trained with (the weights would not fit).
        FileNotFoundError: no such file, or a folder without config.json.
    """
    from attnlab.io.checkpoints import saved_run_config
    from attnlab.training.config import TrainConfig
    from attnlab.training.setup.start import read_init_from

    path = _config_file(Path(config_path))
    data = load_config_file(path)
    saved = saved_run_config(data)
    if saved is not None:  # a run folder's config.json: the run is where the file is
        data = apply_overrides(saved, [("train.out_dir", str(path.parent))])
    resolved = TrainConfig.resolve(data, overrides)
    if resolved.config.model.init_from:  # the model it starts from: its fields, and what the data sets on them
        resolved = read_init_from(resolved.config)
    if resume:
        _check_same_model(resolved.config, from_run=saved is not None)
    return resolved


def _config_file(path: Path) -> Path:
    """A run folder stands for its config.json."""
    if not path.is_dir():
        return path
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: a folder without config.json; expected a run config file (.yaml, "
                                ".yml or .json) or a run folder of attnlab train (it writes config.json when "
                                "training starts)")
    return path / "config.json"


def _check_same_model(cfg: TrainConfig, *, from_run: bool) -> None:
    """Refuse to resume the run in cfg.train.out_dir with a model whose weights have other shapes
    than its own, or another tokenizer: the checkpoint would not load (a size mismatch), or the
    saved tokenizer.json would silently win. Changes that keep every shape (dropout, the attention
    kernel) are allowed."""
    from attnlab.io.checkpoints import saved_run_config
    from attnlab.training.config import TrainConfig, absolute_paths

    out = Path(cfg.train.out_dir)
    try:
        earlier_data = saved_run_config(load_config_file(out / "config.json"))
    except (OSError, ValueError):
        return  # no run there yet: --resume warns and starts afresh
    try:
        earlier = TrainConfig.from_dict(earlier_data)
    except (ValueError, TypeError, AttributeError):
        return  # a config.json this version cannot read: the checkpoint's own check names a mismatch
    old, new = absolute_paths(earlier.to_dict()), absolute_paths(cfg.to_dict())  # as the run recorded its paths
    changed = (_differences(old["model"], new["model"], "model")
               + _differences(old["data"]["tokenizer"], new["data"]["tokenizer"], "data.tokenizer"))
    fixed = [c for c in changed if c[0].startswith("data.") or c[0] in ("model.init_from", "model.add_special_tokens")]
    if not changed or (not fixed and _shapes(earlier) == _shapes(cfg)):
        return
    listed = ", ".join(f"{key}: {old!r} in the run, {new!r} here" for key, old, new in changed[:4])
    if from_run:
        raise ValueError(f"cannot resume {str(out)!r} with another model or tokenizer ({listed}): its checkpoints "
                         "hold the weights of the run's own; resume without those overrides, or start a new run "
                         "with another --train.out_dir")
    raise ValueError(f"train.out_dir={str(out)!r} holds a run of another model or tokenizer ({listed}); resume it "
                     f"from its saved config, which keeps the overrides it started with: attnlab train --resume "
                     f"{shlex.quote(str(out))}; or choose another train.out_dir")


def _differences(a: Any, b: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """Dotted keys whose values differ between two plain-data configs, with (a, b) values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(set(a) | set(b)) for d in _differences(a.get(key), b.get(key), f"{prefix}.{key}")]
    return [] if a == b else [(prefix, a, b)]


def _shapes(cfg: TrainConfig) -> dict[str, tuple[int, ...]]:
    """The model's parameter and buffer shapes, built on the meta device (no memory, no init)."""
    import torch

    from attnlab.models import build_model

    with torch.device("meta"):
        model = build_model(cfg.model_config())
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


# the launcher's flags (attnlab.parallel.launch: passed on to torchrun); also accepted after CONFIG
LAUNCH_FLAGS = (
    ("--nproc", "N", "processes on this machine: re-launches itself under torchrun (gloo on CPU, NCCL on GPU); data "
                     "parallel, or the config's parallel section (tp x pp x dp = N x M); also accepted after CONFIG, "
                     "as are the flags below"),
    ("--nnodes", "M", "machines of the run, each running this command with the same --rdzv-endpoint (default 1)"),
    ("--rdzv-endpoint", "HOST:PORT", "with --nnodes > 1: where the machines meet before starting, the first "
                                     "machine's host name or address and a port open to the others (e.g. node0:29500)"),
    ("--node-rank", "R", "this machine's number, 0 to M-1, 0 being the machine at HOST (torchrun's static "
                         "rendezvous); left out, the machines are numbered as they meet (c10d)"),
    ("--rdzv-id", "NAME", "the name the machines meet under, the same on each (default: $SLURM_JOB_ID, else attnlab)"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a model from a YAML/JSON run config", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="example: attnlab train examples/shakespeare_char.json --model.num_layers 4 "
                                          "--train.max_steps 500; continued after a stop: attnlab train --resume "
                                          "runs/shakespeare-char")
    parser.add_argument("config", nargs="?",
                        help="run config (.yaml, .yml or .json), or a run folder (or its config.json) to rebuild")
    for flag, metavar, text in LAUNCH_FLAGS:
        parser.add_argument(flag, metavar=metavar, help=text)
    parser.add_argument("--resume", nargs=argparse.REMAINDER, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its saved config and latest checkpoint: attnlab "
                             "train --resume RUN_DIR [--SECTION.FIELD VALUE ...]; after CONFIG, continue CONFIG's run")
    parser.add_argument("overrides", nargs=argparse.REMAINDER,
                        help="--SECTION.FIELD VALUE overrides; --resume continues the run; --print-config stops "
                             "after printing the resolved config")
    parser.set_defaults(func=_main)


def _command_line(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(CONFIG, the items after it) from either form: `CONFIG [items]`, or `--resume RUN_DIR
    [items]` (argparse hands `--resume` everything after it; it becomes a trailing --resume).

    Raises:
        ValueError: neither a config nor a run folder given.
    """
    config, items = args.config, list(args.overrides)
    if args.resume is not None:
        tail = list(args.resume)
        if config is None and tail and not tail[0].startswith("-"):
            config = tail.pop(0)
        items = [*items, *tail, "--resume"]
    if config is None:
        raise ValueError("expected a run config (attnlab train CONFIG [--SECTION.FIELD VALUE ...]) or a run folder "
                         "to continue (attnlab train --resume RUN_DIR)")
    return config, items


def _launch_flags(args: argparse.Namespace) -> list[str]:
    """The launcher's flags given before CONFIG, as items (the same flags after CONFIG win)."""
    given = {"--nproc": args.nproc, "--nnodes": args.nnodes, "--node-rank": args.node_rank,
             "--rdzv-endpoint": args.rdzv_endpoint, "--rdzv-id": args.rdzv_id}
    return [f"{flag}={value}" for flag, value in given.items() if value is not None]


def _resume_line(out_dir: str) -> str:
    """The command that continues this run on the processes (and machines) it ran on."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    again = ["attnlab", "train", "--resume", str(out_dir)] + ["--nproc", str(local)] * (world > 1)
    if local < world:  # [parallel] several machines: the same command on each, as it started
        return shlex.join([*again, "--nnodes", str(world // local)]) + " --rdzv-endpoint HOST:PORT (on every machine)"
    return shlex.join(again)


def _main(args: argparse.Namespace) -> int:
    import os
    import sys

    from attnlab.parallel.launch import pop_launch, relaunch

    config, items = _command_line(args)
    nproc, nodes, rest = pop_launch(_launch_flags(args) + items)  # [parallel] --nproc N [--nnodes M ...]: torchrun
    launcher = "WORLD_SIZE" not in os.environ  # not yet one of torchrun's processes
    main_rank = os.environ.get("RANK", "0") == "0"
    if not main_rank:
        sys.stdout = open(os.devnull, "w")  # [parallel] rank 0 prints
    overrides, flags = parse_overrides(rest)
    # the model section too is validated here, before the data is prepared (and before N processes start)
    cfg, implied = resolve(config, overrides, resume=flags["resume"])
    if launcher and not flags["print_config"]:
        from attnlab.parallel.layout import check_layout

        tp = check_layout(cfg, nproc * nodes.count)[0]  # [parallel] against N x M, the model, the data: one error
        if nodes.count > 1 and nproc % tp:
            import warnings

            warnings.warn(f"parallel.tp={tp} does not divide --nproc {nproc}: tensor-parallel groups span machines, "
                          "and every layer then waits on the network; choose a tp that divides the processes on "
                          "one machine")
        if nproc * nodes.count > 1:
            return relaunch(nproc, ["train", config, *rest], nodes)
    for line in implied:  # once, before the setup line (rank 0: the others print nowhere)
        print(f"implied: {line}", file=sys.stderr if flags["print_config"] else sys.stdout, flush=True)
    if flags["print_config"]:
        print(json.dumps(cfg.to_dict(), indent=2), flush=True)
        return 0
    from contextlib import nullcontext

    from attnlab.io.files import json_text
    from attnlab.io.lock import RunLock
    from attnlab.parallel.mesh import MeshTraining
    from attnlab.training.strategy.distributed import CollectiveError
    from attnlab.training.run.signals import TrainingInterrupted
    from attnlab.training.trainer import NonFiniteLossError, Trainer

    # one writer per out_dir, from the data preparation (it writes tokenizer.json) to the end
    lock = RunLock(cfg.train.out_dir, what="train.out_dir", command=shlex.join(["attnlab", "train", config, *rest]))
    with lock if main_rank else nullcontext():  # [parallel] rank 0 writes
        trainer = Trainer(cfg, mesh=MeshTraining)  # [parallel] the hooks of a tp / pp layout (unused without one)
        try:  # (the trainer prints the setup in one line first: Trainer.setup_line)
            summary = trainer.fit(resume=flags["resume"])
        except NonFiniteLossError as err:
            print(f"attnlab train: error: {err}", flush=True)
            return 1
        except CollectiveError as err:  # [parallel] a peer died or hangs: every rank says so (stderr) and stops
            print(f"attnlab train: error: {err}", file=sys.stderr, flush=True)
            return 1
        except TrainingInterrupted as err:
            print(f"attnlab train: {err}\nresume with: {_resume_line(cfg.train.out_dir)}", file=sys.stderr, flush=True)
            return err.exit_status  # 128 + the signal's number: 130 Ctrl-C, 143 SIGTERM, 138 SIGUSR1
    print("summary: " + json_text(summary), flush=True)  # strict JSON: a NaN loss as null
    from attnlab.parallel import shutdown

    shutdown()  # [parallel] leave the process group (no-op alone)
    return 0
