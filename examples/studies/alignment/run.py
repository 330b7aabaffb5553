"""Does attention give alignment for free? Word alignments of held-out Bible verses (EN->ES) from
the cross-attention of a Transformer (every layer and head, their means) and of two LSTMs with
attention (Bahdanau's additive, Luong's general), from attribution (gradient x input, integrated
gradients), and from eflomal, scored by alignment error rate against the reference that both
Bible modules' Strong's numbers give; and a faithfulness check (removing the most-attended source
word against removing a random one).

    python examples/studies/alignment/run.py --out runs/alignment-study              # train, score, report
    python examples/studies/alignment/run.py --out runs/alignment-study --train-only # train or resume only
    python examples/studies/alignment/run.py --out runs/alignment-study --analyse-only  # score the latest marks
    python examples/studies/alignment/run.py --out runs/alignment-study --report-only   # tables and plots

Training reuses the other studies' configurations: the Transformer is the translation study's
recipe (`examples/translation_en_es.yaml`), the LSTMs are rnn_vs_transformer's `lstm+attention`
and `lstm+luong` with its shared tokenizer; each trains in its own one-thread process on the
studies' CPU-time clock (examples/studies/common.py), saving a model at every mark; an
interrupted run resumes from its last checkpoint. Scoring takes each model's latest mark and
those of `--score-marks`, each once (`OUT/<model>/alignment.json`). The reference
(`OUT/reference.json`: the held-out verses' words with their Strong's numbers and the check of the
corpus's verse pairing) and eflomal's links (`OUT/eflomal.json`) are computed once. Outputs: results.md, results.json, aer_heads.png,
aer_heads_input.png, example_<model>.png.
"""

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


# ---------------------------------------------------------------- the reference and the aligner (cached in OUT)
def reference_data(out: Path, eflomal_pairs: int | None = None) -> dict[str, Any]:
    """The held-out verses with their words' Strong's numbers, the corpus's verse-pairing check and
    eflomal's links for the held-out verses (computed once, kept in OUT)."""
    import re

    from reference import held_out, sword_root, tagged_verses, verse_shifts

    cached = read_json(out / "reference.json")
    if cached is None:
        verses = tagged_verses(sword_root(out))
        valid = pairs_of(CORPUS, "valid")
        held = held_out(verses, valid)
        shifts = verse_shifts(verses)
        num13 = next((v for v in held if v["source"].startswith("Moses sent them to spy out the land of Canaan")), None)
        cached = {"held_out": [{**v, "source_words": [[w, sorted(n)] for w, n in v["source_words"]],
                                "target_words": [[w, sorted(n)] for w, n in v["target_words"]]} for v in held],
                  "valid_pairs": len(valid), "shifts": shifts, "numbers_13_17": num13 and {
                      "ref": num13["ref"], "source": num13["source"], "target": num13["target"],
                      "flagged": num13["ref"] in {e["ref"] for e in shifts["examples"]} or
                      int(num13["ref"].split(":")[1]) in shifts["chapters"].get(num13["ref"].split(":")[0], [])}}
        write_json(out / "reference.json", cached)
    if not (out / "eflomal.json").exists():
        from statistical import eflomal_align

        words = lambda text: re.findall(r"\w+", text)
        train = pairs_of(CORPUS, "train")[:eflomal_pairs]
        pairs = [(words(s), words(t)) for s, t in train] + [(words(v["source"]), words(v["target"]))
                                                           for v in cached["held_out"]]
        keep = [i for i, (a, b) in enumerate(pairs) if a and b]
        wall0 = time.perf_counter()
        links = dict(zip(keep, eflomal_align([pairs[i] for i in keep], seed_dir=out)))
        held = [{k: sorted(v) for k, v in links.get(len(train) + i, {}).items()} for i in range(len(cached["held_out"]))]
        write_json(out / "eflomal.json", {"pairs": len(keep), "training_pairs": len(train), "wall_seconds": round(time.perf_counter() - wall0, 1),
                                          "loadavg": loadavg(), "held_out": held})
    return cached


def pairs_of(corpus: str, split: str) -> list[tuple[str, str]]:
    from attnlab.data.sources import resolve_source

    path = Path(resolve_source(corpus, split))
    return [tuple(line.split("\t")[:2]) for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line]


def scored_verses(out: Path, limit: int) -> tuple[list[dict], list[dict]]:
    """(held-out verses to score, their eflomal links): the first `limit` held-out verses whose
    pairing the Strong's check does not flag."""
    ref = reference_data(out)
    flagged = {f"{c}:{v}" for c, vs in ref["shifts"]["chapters"].items() for v in vs}
    eflomal = read_json(out / "eflomal.json")["held_out"]
    verses, links = [], []
    for v, e in zip(ref["held_out"], eflomal):
        if v["ref"] in flagged or not e:
            continue
        verses.append({**v, "source_words": [(w, frozenset(n)) for w, n in v["source_words"]],
                       "target_words": [(w, frozenset(n)) for w, n in v["target_words"]]})
        links.append({k: {tuple(x) for x in val} for k, val in e.items()})
    return verses[:limit], links[:limit]


def latest_mark(out: Path, name: str) -> str | None:
    marks = sorted((p.name for p in (run_dir(out, name) / "marks").glob("*min")), key=lambda m: float(m[:-3]))
    return marks[-1] if marks else None


def analyse(name: str, args: argparse.Namespace) -> None:
    """Score `name`'s latest saved mark and those of `--score-marks` it has saved (once per mark):
    AER of every method, and faithfulness."""
    out = Path(args.out)
    saved = {p.name for p in (run_dir(out, name) / "marks").glob("*min")}
    wanted = [m for m in [latest_mark(out, name)] if m] + [f"{m:g}min" for m in args.score_marks or []]
    for mark in dict.fromkeys(m for m in wanted if m not in saved):
        print(f"[{name}] --score-marks: no mark {mark} saved (saved: {', '.join(sorted(saved)) or 'none'}); skipped",
              file=sys.stderr, flush=True)
    done = read_json(run_dir(out, name) / "alignment.json") or {}
    todo = [m for m in dict.fromkeys(wanted) if m in saved and m not in done]
    if todo:
        verses, links = scored_verses(out, args.verses)  # read once for every mark
        for mark in todo:
            analyse_mark(name, mark, args, verses, links)


def analyse_mark(name: str, mark: str, args: argparse.Namespace, verses: list[dict], links: list[dict]) -> None:
    from analysis import faithfulness, score_model

    out = Path(args.out)
    results = read_json(run_dir(out, name) / "alignment.json") or {}
    cpu0, wall0, load = time.process_time(), time.perf_counter(), loadavg()
    folder = run_dir(out, name) / "marks" / mark
    scored = score_model(folder, verses, args.attribution_verses, args.ig_steps, links)
    faith = faithfulness(folder, verses[:args.faith_verses])
    clock = (read_json(run_dir(out, name) / "clock.json") or {}).get("marks", {}).get(mark[:-3], {})
    results[mark] = {**scored, "faithfulness": faith, "training": clock, "cpu_seconds": round(time.process_time() - cpu0, 1),
                     "wall_seconds": round(time.perf_counter() - wall0, 1), "loadavg": [load, loadavg()]}
    write_json(run_dir(out, name) / "alignment.json", results)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/alignment-study")
    p.add_argument("--recipe", default=str(HERE.parents[1] / "translation_en_es.yaml"))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--marks", type=cpu_minutes, nargs="+", default=[10, 15, 20, 25, 30, 40, 50, 60, 70, 80],
                   help="CPU minutes at which the Transformer is saved (the last is its budget)")
    p.add_argument("--rnn-marks", type=cpu_minutes, nargs="+", default=[5, 10, 15, 20, 30, 40, 50, 60],
                   help="CPU minutes at which each LSTM is saved (the last is its budget)")
    p.add_argument("--jobs", type=positive_int, default=3)
    p.add_argument("--verses", type=positive_int, default=300, help="held-out verses whose attention is scored")
    p.add_argument("--attribution-verses", type=positive_int, default=50,
                   help="the first this many of them also scored by attribution")
    p.add_argument("--ig-steps", type=positive_int, default=8, help="integrated gradients' steps")
    p.add_argument("--faith-verses", type=positive_int, default=100, help="verses of the faithfulness check")
    p.add_argument("--score-marks", type=cpu_minutes, nargs="+", default=None,
                   help="score these saved marks too (CPU minutes), not just the latest")
    p.add_argument("--eflomal-pairs", type=positive_int, default=None,
                   help="eflomal aligns this many training pairs beside the held-out ones (default: all)")
    p.add_argument("--train-only", action="store_true", help="train (or resume) and score nothing")
    p.add_argument("--analyse-only", action="store_true",
                   help="score each model's latest saved mark (what is there now), training nothing")
    p.add_argument("--report-only", action="store_true", help="write the tables and plots from what OUT holds")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--analyse", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.worker:
        train(args.worker, args)
        return
    if args.analyse:
        analyse(args.analyse, args)
        return
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, __file__, "--out", args.out, "--recipe", args.recipe, "--marks", *map(str, args.marks),
            "--rnn-marks", *map(str, args.rnn_marks), "--verses", str(args.verses), "--attribution-verses",
            str(args.attribution_verses), "--ig-steps", str(args.ig_steps), "--faith-verses", str(args.faith_verses)]
    if args.score_marks:
        base += ["--score-marks", *map(str, args.score_marks)]
    if not (args.report_only or args.analyse_only):
        if any(m != "transformer" for m in args.models):
            shared_tokenizer(out, CORPUS, "seq2seq")
        run_workers({m: base + ["--worker", m] for m in args.models}, args.jobs)
    if args.train_only:
        return
    if not args.report_only:
        reference_data(out, args.eflomal_pairs)
        run_workers({m: base + ["--analyse", m] for m in args.models}, args.jobs)
    from report import report

    print(report(out, args, time.perf_counter() - start))


if __name__ == "__main__":
    main()
