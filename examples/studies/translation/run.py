"""A translation model worth using: the English->Spanish recipe (`examples/translation_en_es.yaml`)
trained for an hour of one CPU core on `bible-en-es` (1 in 30 verses held out) and, separately,
on `bible-en-es-books` (four whole books held out: Ruth, Jonah, Philippians, James); the
English->German recipe (`examples/translation_en_de.yaml`, the same settings) on `en-de` (1 in
20 of Ding's sentences and of the Debian descriptions held out). Each is scored with beam search
on everything its corpus holds out.

    python examples/studies/translation/run.py                          # all three, 60 CPU minutes each
    python examples/studies/translation/run.py --marks 1 --out runs/quick --corpora bible-en-es

Each corpus trains in its own one-thread process on the studies' CPU-time clock
(examples/studies/common.py), saving the model at every mark (`OUT/<corpus>/marks/<m>min/`);
each saved model is then decoded with `attnlab translate --num-beams 4` and scored with
sacrebleu's BLEU and chrF (`attnlab.evaluation.bleu_chrf`). Apart from the data source, the run
directory and the clock, the configuration is the corpus's recipe file's (or `--recipe`'s), unchanged.

Outputs in --out: results.json, results.md (the table), bleu_vs_time.png, samples.md (held-out
verses with their reference and the model's translation).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (cpu_clock_training, cpu_minutes, cpu_time, loadavg, read_json,  # noqa: E402
                    run_workers, translate, write_json)
from attnlab.cli.argtypes import positive_int  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2]
# corpus -> (its recipe, what it holds out)
CORPORA = {
    "bible-en-es": (EXAMPLES / "translation_en_es.yaml", "EN->ES, held-out verses (1 in 30)"),
    "bible-en-es-books": (EXAMPLES / "translation_en_es.yaml", "EN->ES, held-out books (Ruth, Jonah, Philippians, James)"),
    "en-de": (EXAMPLES / "translation_en_de.yaml", "EN->DE, held-out pairs (1 in 20 Ding sentences and descriptions)"),
}


def recipe(corpus: str, args: argparse.Namespace) -> Path:
    """The recipe `corpus` trains with: `--recipe` when given, else its own."""
    return Path(args.recipe) if args.recipe else CORPORA[corpus][0]


def run_config(corpus: str, run_dir: Path, recipe: Path) -> dict[str, Any]:
    import yaml

    config = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    config["data"]["source"] = corpus
    config["train"].update(out_dir=str(run_dir), max_minutes=None, max_steps=10 ** 7, eval_every=10 ** 7,
                           checkpoint_every=10 ** 7, keep_last=1)
    return config


def held_out(corpus: str) -> list[tuple[str, str]]:
    from attnlab.data.sources import resolve_source

    path = Path(resolve_source(corpus, "valid"))
    return [tuple(line.split("\t")[:2]) for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line]


def parts(corpus: str, pairs: list[tuple[str, str]]) -> dict[str, list[int]]:
    """The held-out pairs of a corpus made of two (en-de: Ding's example sentences and the Debian
    descriptions) by where they come from, as indices into `pairs`; {} for a corpus of one kind."""
    if corpus != "en-de":
        return {}
    ding = set(held_out("de-en"))
    return {"ding": [i for i, p in enumerate(pairs) if p in ding],
            "descriptions": [i for i, p in enumerate(pairs) if p not in ding]}


def worker(corpus: str, args: argparse.Namespace) -> None:
    """Train on `corpus` to every mark, then score each saved model."""
    from attnlab.evaluation import bleu_chrf

    run_dir = Path(args.out) / corpus
    cpu_clock_training(run_config(corpus, run_dir, recipe(corpus, args)), run_dir, sorted(args.marks), corpus)
    results = read_json(run_dir / "evaluation.json") or {}
    pairs = held_out(corpus)
    for m in sorted(args.marks):
        if str(m) not in results:
            cpu0, load = cpu_time(), loadavg()
            hyps = translate(run_dir / "marks" / f"{m}min", [s for s, _ in pairs], run_dir)
            by_part = {name: {**bleu_chrf([hyps[i] for i in idx], [pairs[i][1] for i in idx]), "sentences": len(idx)}
                       for name, idx in parts(corpus, pairs).items()}
            results[str(m)] = {**bleu_chrf(hyps, [t for _, t in pairs]), "sentences": len(pairs),
                               **({"by_part": by_part} if by_part else {}),
                               "eval_cpu_seconds": round(cpu_time() - cpu0, 1), "eval_loadavg": load,
                               "samples": [[s, t, h] for (s, t), h in list(zip(pairs, hyps))[:: max(1, len(pairs) // 8)]]}
            write_json(run_dir / "evaluation.json", results)


def report(args: argparse.Namespace, seconds: float) -> str:
    from attnlab.inspect.plots import plot_lines
    from attnlab.io.files import atomic_write_text

    out, marks = Path(args.out), sorted(args.marks)
    table = {}
    for corpus in args.corpora:
        clock = read_json(out / corpus / "clock.json") or {}
        evaluation = read_json(out / corpus / "evaluation.json") or {}
        table[corpus] = {m: {**clock.get("marks", {}).get(m, {}), **evaluation[m]} for m in evaluation}
    series = {CORPORA[c][1]: ([float(m) for m in rows], [rows[m]["bleu"] for m in rows]) for c, rows in table.items() if rows}
    if series:
        plot_lines(series, out / "bleu_vs_time.png", xlabel="training time on one core (CPU minutes)",
                   ylabel="BLEU (beam 4)", title="translation_en_es.yaml / translation_en_de.yaml")
    lines = ["| held out | " + " | ".join(f"{m} min: steps / BLEU / chrF" for m in marks) + " |",
             "|---|" + "---|" * len(marks)]
    for corpus, rows in table.items():
        cells = [f"{r['step']} / {r['bleu']:.2f} / {r['chrf']:.1f}" if (r := rows.get(str(m))) else "-" for m in marks]
        lines.append(f"| {CORPORA[corpus][1]} | " + " | ".join(cells) + " |")
        for part in dict.fromkeys(name for r in rows.values() for name in r.get("by_part", {})):
            cells = [f"{r['step']} / {p['bleu']:.2f} / {p['chrf']:.1f}"
                     if (r := rows.get(str(m))) and (p := r.get("by_part", {}).get(part)) else "-" for m in marks]
            sentences = next(r["by_part"][part]["sentences"] for r in rows.values() if part in r.get("by_part", {}))
            lines.append(f"| of which {part} ({sentences}) | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + f"\n\nthis invocation {seconds:.0f} s wall-clock, load average at the end {loadavg()}\n"
    samples = ["| source | reference | translation |", "|---|---|---|"]
    for corpus, rows in table.items():
        if rows:
            last = rows[max(rows, key=float)]
            samples += [f"| {s} | {t} | {h} |" for s, t, h in last["samples"]]
    write_json(out / "results.json", {"args": {k: v for k, v in vars(args).items() if k != "worker"},
                                      "results": table, "seconds": seconds})
    atomic_write_text(out / "results.md", text)
    atomic_write_text(out / "samples.md", "\n".join(samples) + "\n")
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/translation-study")
    p.add_argument("--recipe", default=None, help="an attnlab train config (YAML) for every corpus (default: each "
                   "corpus's own, translation_en_es.yaml or translation_en_de.yaml)")
    p.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    p.add_argument("--marks", type=cpu_minutes, nargs="+", default=[15, 30, 45, 60],
                   help="CPU minutes of training at which the model is saved and scored (the last is the budget)")
    p.add_argument("--jobs", type=positive_int, default=2, help="corpora trained at once, one thread each")
    p.add_argument("--report-only", action="store_true",
                   help="write the table, plot and samples from what OUT holds, training and scoring nothing")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.recipe and not Path(args.recipe).is_file():
        p.error(f"--recipe: no such file: {args.recipe}")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args)
        return
    start = time.perf_counter()
    base = [sys.executable, __file__, "--out", args.out, "--marks", *map(str, args.marks)]
    if args.recipe:
        base += ["--recipe", args.recipe]
    if not args.report_only:
        run_workers({corpus: base + ["--worker", corpus] for corpus in args.corpora}, args.jobs,
                    before=lambda corpus: (Path(args.out) / corpus).mkdir(parents=True, exist_ok=True))
    print(report(args, time.perf_counter() - start))


if __name__ == "__main__":
    main()
