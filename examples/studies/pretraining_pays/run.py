"""Does pretraining pay? A BERT-style encoder pretrained by masked LM (`bert.yaml`: about an hour
of one core) on the Python documentation or, in domain, on `debian-text`, then fine-tuned on a real
classification task — which Debian section a package belongs to, from its description
(`debian-sections`: admin, games, graphics, net, science, sound, text, utils; 50 labelled
descriptions each by default) — against an identical encoder with random weights, same steps,
same settings, several seeds.

    python examples/studies/pretraining_pays/run.py --corpus debian-text --out runs/pretraining-pays-debian
    python examples/studies/pretraining_pays/run.py                          # the Python-docs encoder
    python examples/studies/pretraining_pays/run.py --pretrained runs/bert-pretrain --seeds 0 1 2
    python examples/studies/pretraining_pays/run.py --corpus debian-text --pretrain-steps 1500   # a reduced budget

Everything goes through the command line users run: `attnlab train bert.yaml` for the encoder
(skipped when `--pretrained` names a finished run; an interrupted one is resumed), `attnlab
finetune` for each (initialisation, seed) with one config that differs only in `model`, and
`attnlab fill-mask` for a look at what the encoder learned. The random twin is the pretrained
model's config built afresh (`attnlab.build_model`, seed 0) with the same tokenizer.

Outputs in --out: results.json (per run: valid/test accuracy, macro-F1, seconds), results.md
(the table: mean and standard deviation over seeds, and the paired difference), the fine-tuning
runs' folders.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import loadavg, read_json, write_json  # noqa: E402
from attnlab.cli.argtypes import positive_int  # noqa: E402

HERE = Path(__file__).resolve().parent
PROMPT = "The [MASK] statement is used to import a module."


def attnlab(*args: str) -> None:
    """One `attnlab` command in a one-thread process."""
    subprocess.run([sys.executable, "-m", "attnlab.cli.main", *args], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})


def pretrain(out: Path, pretrained: str | None, corpus: str, steps: int | None = None) -> Path:
    """The encoder: `pretrained` as given, else bert.yaml trained on `corpus` in out/pretrain
    (resumed when interrupted); `steps` shortens its schedule (the cosine ends there)."""
    if pretrained:
        return Path(pretrained)
    run = out / "pretrain"
    shorter = ["--train.max_steps", str(steps)] if steps else []
    resume = ["--resume", str(run)] if (run / "checkpoints").exists() else [
        str(HERE / "bert.yaml"), "--train.out_dir", str(run), "--data.source", corpus, *shorter]
    attnlab("train", *resume)
    return run


def random_twin(pretrained: Path, out: Path) -> Path:
    """The pretrained encoder's architecture and tokenizer with freshly initialised weights."""
    import torch

    import attnlab as lib

    folder = out / "random-init"
    if not (folder / "config.json").exists():
        model, tokenizer = lib.load(pretrained, with_tokenizer=True)
        torch.manual_seed(0)
        lib.save(lib.build_model(model.config), folder, tokenizer=tokenizer)
    return folder


def finetune_config(model: Path, data: dict[str, Path], out_dir: Path, seed: int, args: argparse.Namespace) -> dict:
    return {"model": str(model), "head": "classification", "pooling": "mean", "dropout": args.dropout,
            "data": {split: str(path) for split, path in data.items()},
            "recipe": {"lr": args.lr, "warmup_ratio": 0.1, "weight_decay": 0.01, "batch_size": 32,
                       "max_length": 128, "max_steps": args.steps, "precision": "fp32"},
            "seeds": [seed], "threads": 1, "out_dir": str(out_dir)}


def finetune(name: str, model: Path, data: dict[str, Path], seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out_dir = Path(args.out) / f"{name}-seed{seed}"
    summary = out_dir / "summary.json"
    if not summary.exists():
        config = Path(args.out) / f"{name}-seed{seed}.json"
        write_json(config, finetune_config(model, data, out_dir, seed, args))
        attnlab("finetune", str(config))
    result = read_json(summary)
    return {"init": name, "seed": seed, "valid": result["valid"], "test": result["test"],
            "seconds": result.get("seconds")}


def table(runs: list[dict[str, Any]]) -> str:
    by = {name: [r for r in runs if r["init"] == name] for name in ("pretrained", "random")}
    acc = {name: [r["test"]["accuracy"] for r in rows] for name, rows in by.items()}
    lines = ["| encoder | " + " | ".join(f"seed {r['seed']}" for r in by["pretrained"]) +
             " | mean | std |", "|---|" + "---|" * (len(by["pretrained"]) + 2)]
    for name, values in acc.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) +
                     f" | {statistics.mean(values):.3f} | {std:.3f} |")
    diffs = [p - r for p, r in zip(acc["pretrained"], acc["random"])]
    spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    lines.append("| difference (paired by seed) | " + " | ".join(f"{d:+.3f}" for d in diffs) +
                 f" | {statistics.mean(diffs):+.3f} | {spread:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/pretraining-pays")
    p.add_argument("--pretrained", default=None, help="a finished `attnlab train bert.yaml` run (else one is trained)")
    p.add_argument("--corpus", default="python-docs",
                   help="what the encoder is pretrained on (bert.yaml's python-docs, or debian-text: in-domain)")
    p.add_argument("--pretrain-steps", type=positive_int, default=None,
                   help="shorten bert.yaml's 6,000 steps (its cosine ends there): a reduced budget")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=positive_int, default=150, help="fine-tuning steps of 32 descriptions")
    p.add_argument("--lr", type=float, default=2e-4, help="fine-tuning peak learning rate (both encoders)")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="dropout while fine-tuning, both encoders (whatever the pretraining recipe used)")
    p.add_argument("--per-section", type=positive_int, default=50,
                   help="labelled training descriptions per section (fewer: where pretraining should matter most)")
    args = p.parse_args()
    from attnlab.finetune.tasks import debian_sections
    from attnlab.io.files import atomic_write_text

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, load = time.perf_counter(), loadavg()
    pretrained = pretrain(out, args.pretrained, args.corpus, args.pretrain_steps)
    data = debian_sections(out / "data", seed=0, n_train=args.per_section)
    models = {"pretrained": pretrained, "random": random_twin(pretrained, out)}
    runs = [finetune(name, model, data, seed, args) for seed in args.seeds for name, model in models.items()]
    fill = subprocess.run([sys.executable, "-m", "attnlab.cli.main", "fill-mask", str(pretrained), PROMPT, "--json",
                           "--no-special-tokens"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    report = {"args": vars(args), "runs": runs, "fill_mask": fill.stdout.strip() or fill.stderr.strip(),
              "seconds": round(time.perf_counter() - start, 1), "loadavg_start": load, "loadavg_end": loadavg()}
    write_json(out / "results.json", report)
    text = table(runs)
    atomic_write_text(out / "results.md", text)
    print(text)


if __name__ == "__main__":
    main()
