"""Why Transformers replaced RNNs, at equal time: an RNN and an LSTM encoder-decoder (a fixed-size
bottleneck), an LSTM with Bahdanau attention, and a Transformer, each trained for the same
budget of one CPU core's time on real translation (`bible-en-es`: World English Bible ->
Reina-Valera 1909, held-out verses), evaluated at 5, 10, 20 and 40 minutes.

    python examples/studies/rnn_vs_transformer/run.py                       # the full study
    python examples/studies/rnn_vs_transformer/run.py --marks 1 2 --out runs/quick   # a quick look

Every model goes through the toolkit's own pipeline (the corpus, one byte-level BPE of 8,000
trained once on the training pairs and shared, the seq2seq objective, `attnlab.training.Trainer`)
and every score through its command line: at each mark the model is saved (`attnlab.save`) to
`OUT/<model>/marks/<m>min/` and later decoded with `attnlab translate --num-beams 4`; BLEU and
chrF are sacrebleu's (`attnlab.evaluation.bleu_chrf`) on the first `--bleu-verses` held-out
verses, the validation loss (label smoothing off, nats per target token) on all of them.

The budget is CPU time, not wall-clock: each model trains in its own process with one torch
thread, and the clock is that process's CPU time spent training (evaluations excluded). On an
idle core that equals wall-clock; on a machine shared with other work it still gives every model
the same amount of computation, which wall-clock would not. Wall-clock and the load average are
recorded beside it.

Each model keeps the settings that suit it (the README says which and why). A model whose marks
are all evaluated is not run again; an interrupted one continues from its last checkpoint and
its recorded clock (`OUT/<model>/clock.json`). Files are written atomically.

Outputs: results.json, results.md (the table), bleu_vs_time.png, val_loss_vs_time.png,
alignment_lstm_attention.png, alignment_transformer.png, gradient_flow.png (how much of the
target's loss reaches each source position, at the last mark).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (clock_config, cpu_clock_training, cpu_minutes, cpu_time, loadavg,  # noqa: E402
                    read_json, run_workers, shared_tokenizer, translate, write_json)
from attnlab.cli.argtypes import positive_int  # noqa: E402

D = 256  # embedding width of every model

MODELS: dict[str, dict[str, Any]] = {
    # recurrent models: Adam at a constant 1e-3 after a 50-step warmup (the usual setting for
    # LSTM translation with Adam), dropout 0.2, clipping at 1
    "rnn": {"model": {"arch": "rnn_encoder_decoder", "d_model": D, "dropout": 0.2,
                      "rnn": {"cell": "rnn", "attention": "none", "hidden_size": D}},
            "lr": 1e-3, "schedule": {"name": "constant", "warmup_steps": 50}},
    "lstm": {"model": {"arch": "rnn_encoder_decoder", "d_model": D, "dropout": 0.2,
                       "rnn": {"cell": "lstm", "attention": "none", "hidden_size": D}},
             "lr": 1e-3, "schedule": {"name": "constant", "warmup_steps": 50}},
    # Bahdanau et al. 2015: a bidirectional encoder and additive attention
    "lstm+attention": {"model": {"arch": "rnn_encoder_decoder", "d_model": D, "dropout": 0.2,
                                 "rnn": {"cell": "lstm", "attention": "additive", "hidden_size": D,
                                         "bidirectional": True}},
                       "lr": 1e-3, "schedule": {"name": "constant", "warmup_steps": 50}},
    # Luong et al. 2015: the decoder LSTM runs over the whole target at once and attends after
    # it (no input feeding), so a step costs about what the bottleneck LSTM's does; added after
    # the first measurement showed Bahdanau's step-by-step decoder 3x slower per step on a CPU
    "lstm+luong": {"model": {"arch": "rnn_encoder_decoder", "d_model": D, "dropout": 0.2,
                             "rnn": {"cell": "lstm", "attention": "general", "hidden_size": D,
                                     "bidirectional": True}},
                   "lr": 1e-3, "schedule": {"name": "constant", "warmup_steps": 50}},
    # pre-LN (Xiong et al. 2020: trains without the long warmup post-LN needs, so it leaves
    # warm-up early in a short budget), 3+3 layers, the Noam shape with a 1e-3 peak at step 300
    # (about 7 minutes in: a step of 32 verse pairs costs 1.4 s of one core)
    "transformer": {"model": {"preset": "tiny-encoder-decoder", "d_model": D, "num_layers": 3, "num_heads": 4,
                              "d_ff": 4 * D, "dropout": 0.1, "norm_placement": "pre", "embedding_scale": True,
                              "position": {"scheme": "sinusoidal", "max_len": 256}},
                    "lr": 1e-3 * (D ** 0.5) * (300 ** 0.5), "schedule": {"name": "noam", "warmup_steps": 300}},
}
LABELS = {"rnn": "RNN", "lstm": "LSTM", "lstm+attention": "LSTM + attention (Bahdanau)",
          "lstm+luong": "LSTM + attention (Luong)", "transformer": "Transformer"}


def run_config(name: str, run_dir: Path, tokenizer: Path, args: argparse.Namespace) -> dict[str, Any]:
    spec = MODELS[name]
    data = {"source": args.corpus, "objective": "seq2seq", "max_pair_len": 96,
            **({"batch_tokens": args.batch_tokens} if args.batch_tokens else {"batch_size": 32}),
            "tokenizer": {"kind": "bpe", "vocab_size": 8000, "path": str(tokenizer)}}
    return clock_config(spec["model"], data, spec["lr"], spec["schedule"], run_dir)


# ---------------------------------------------------------------- training (one process per model)
def train(name: str, args: argparse.Namespace) -> None:
    """Train `name` on the CPU-time clock, saving a model folder at every mark."""
    out = Path(args.out)
    run_dir = out / name.replace("+", "_")
    cpu_clock_training(run_config(name, run_dir, out / "tokenizer.json", args), run_dir, sorted(args.marks), name)


# ---------------------------------------------------------------- evaluation (one process per model)
def valid_pairs(corpus: str, limit: int | None = None) -> list[tuple[str, str]]:
    from attnlab.data.sources import resolve_source

    path = Path(resolve_source(corpus, "valid"))
    pairs = [tuple(line.split("\t")[:2]) for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line]
    return pairs[:limit] if limit else pairs


def validation_loss(folder: Path, pairs: list[tuple[str, str]], batch_size: int = 32) -> float:
    """Mean NLL per target token (no label smoothing) over `pairs`, batched exactly as training
    batches them (`attnlab.data.objectives.seq2seq`: source + EOS, BOS + target, target + EOS;
    each side cut at 96 pieces)."""
    import torch
    import torch.nn.functional as F

    import attnlab
    from attnlab.data.objectives import IGNORE, seq2seq

    model, tok = attnlab.load(folder, with_tokenizer=True)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(0, len(pairs), batch_size):
            rows = pairs[k:k + batch_size]
            batch = seq2seq([tok.encode(s) for s, _ in rows], [tok.encode(t) for _, t in rows],
                            pad_id=tok.pad_token_id, bos_id=tok.bos_token_id, eos_id=tok.eos_token_id, max_len=96)
            logits = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"])
            total += F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE,
                                     reduction="sum").item()
            count += int((batch["labels"] != IGNORE).sum())
    return total / count


def evaluate(name: str, args: argparse.Namespace) -> None:
    from attnlab.evaluation import bleu_chrf

    run_dir = Path(args.out) / name.replace("+", "_")
    results = read_json(run_dir / "evaluation.json") or {}
    pairs = valid_pairs(args.corpus, args.bleu_verses)
    for m in sorted(args.marks):
        if str(m) in results:
            continue
        folder = run_dir / "marks" / f"{m}min"
        cpu0, load = cpu_time(), loadavg()
        hyps = translate(folder, [s for s, _ in pairs], run_dir)
        scores = bleu_chrf(hyps, [t for _, t in pairs])
        results[str(m)] = {"val_loss": validation_loss(folder, valid_pairs(args.corpus)), **scores,
                           "eval_cpu_seconds": round(cpu_time() - cpu0, 1), "eval_loadavg": load,
                           "sample": hyps[:3]}
        write_json(run_dir / "evaluation.json", results)


def worker(args: argparse.Namespace) -> None:
    train(args.worker, args)
    evaluate(args.worker, args)


# ---------------------------------------------------------------- the driver
def run_all(args: argparse.Namespace) -> None:
    """Each model in its own one-thread process, `args.jobs` at a time."""
    base = [sys.executable, __file__, "--out", args.out, "--corpus", args.corpus, "--bleu-verses",
            str(args.bleu_verses), "--marks", *map(str, args.marks)]
    if args.batch_tokens:
        base += ["--batch-tokens", str(args.batch_tokens)]
    run_workers({name: base + ["--worker", name] for name in args.models}, args.jobs,
                before=lambda name: (Path(args.out) / name.replace("+", "_")).mkdir(parents=True, exist_ok=True))


def alignment_plots(args: argparse.Namespace, mark: int) -> dict[str, str]:
    """The LSTM + attention weights and a Transformer cross-attention head on one held-out verse."""
    import torch

    import attnlab
    from attnlab.decoding import generate
    from attnlab.inspect.attention_maps import attention_maps
    from attnlab.inspect.plots import plot_alignment

    out = Path(args.out)
    source = next(s for s, _ in valid_pairs(args.corpus) if 8 <= len(s.split()) <= 12)
    written = {}
    for name, pick in (("lstm+attention", "attention"), ("lstm+luong", "attention"), ("transformer", "cross")):
        folder = out / name.replace("+", "_") / "marks" / f"{mark}min"
        if not folder.exists():
            continue
        model, tok = attnlab.load(folder, with_tokenizer=True)
        model.eval()
        src = torch.tensor([tok.encode(source)])
        hyp = generate(model, src, 40, eos_token_id=tok.token_to_id(tok.roles["eos"]),
                       decoder_start_token_id=tok.token_to_id(tok.roles["bos"]))
        maps = attention_maps(model, src, hyp[:, :-1])
        key = [k for k in maps if pick in k][-1]  # the last layer's cross-attention
        weights = maps[key][0]
        weights = weights[-1] if weights.dim() == 3 else weights  # (heads, Tt, S): the last head
        names = lambda ids: [tok.decode([i]).strip() or tok.id_to_token(i) for i in ids]
        path = out / f"alignment_{name.replace('+', '_')}.png"
        plot_alignment(weights, names(src[0].tolist()), names(hyp[0, 1:].tolist()), path,
                       title=f"{LABELS[name]} ({key}, {mark} min): {source}")
        written[name] = str(path)
    return written


def gradient_flow(args: argparse.Namespace, mark: int, window: int = 16, sentences: int = 64) -> dict[str, dict]:
    """How much of the target's loss reaches each of the last `window` source positions, per model
    at `mark`: ||dL/dx_k|| (`attnlab.inspect.source_gradient_norms`, L = the summed target NLL) on
    held-out verses of at least `window` source tokens, one verse at a time (no padding), averaged
    geometrically over verses (the norms are heavy-tailed). `far_over_near`: the 4 farthest
    positions' mean over the 4 nearest'. Plots the shape (each model scaled to its mean) as
    gradient_flow.png."""
    import torch

    import attnlab
    from attnlab.data.objectives import seq2seq
    from attnlab.inspect.gradient_flow import source_gradient_norms
    from attnlab.inspect.plots import plot_lines

    out, series, table = Path(args.out), {}, {}
    for name in args.models:
        folder = out / name.replace("+", "_") / "marks" / f"{mark}min"
        if not folder.exists():
            continue
        model, tok = attnlab.load(folder, with_tokenizer=True)
        model.eval()
        pairs = [(s, t) for s, t in valid_pairs(args.corpus) if len(tok.encode(s)) + 1 >= window][:sentences]
        total = torch.zeros(window, dtype=torch.float64)
        for s, t in pairs:
            b = seq2seq([tok.encode(s)], [tok.encode(t)], pad_id=tok.pad_token_id, bos_id=tok.bos_token_id,
                        eos_id=tok.eos_token_id, max_len=96)
            norms = source_gradient_norms(model, b["src_ids"], b["tgt_ids"], b["labels"])
            total += norms[-window:].double().clamp(min=1e-30).log()
        mean = (total / max(len(pairs), 1)).exp()  # positions -window .. -1 (the EOS)
        series[LABELS[name]] = (list(range(window - 1, -1, -1)), (mean / mean.mean()).tolist())
        table[name] = {"far_over_near": float(mean[:4].mean() / mean[-4:].mean()), "norms": mean.tolist(),
                       "sentences": len(pairs)}
    if series:
        plot_lines(series, out / "gradient_flow.png", xlabel="distance from the end of the source (tokens)",
                   ylabel="||dL/dx_k|| / its mean over the window", logy=True,
                   title=f"gradient reaching the source ({mark} min, {held_out(args.corpus)})")
    return table


def held_out(corpus: str) -> str:
    """What the held-out side of `corpus` is called in plot titles."""
    return "held-out verses" if corpus.startswith("bible") else "held-out pairs"


def report(args: argparse.Namespace, seconds: float) -> str:
    from attnlab.inspect.plots import plot_lines

    out = Path(args.out)
    table = {}
    for name in args.models:
        run_dir = out / name.replace("+", "_")
        clock, evaluation = read_json(run_dir / "clock.json") or {}, read_json(run_dir / "evaluation.json") or {}
        table[name] = {m: {**clock.get("marks", {}).get(m, {}), **evaluation.get(m, {})} for m in evaluation}
    for key, label in (("bleu", f"BLEU (beam 4, {held_out(args.corpus)})"), ("val_loss", "validation loss (nats/token)")):
        series = {LABELS[n]: ([float(m) for m in rows], [rows[m][key] for m in rows]) for n, rows in table.items() if rows}
        plot_lines(series, out / f"{key}_vs_time.png", xlabel="training time on one core (CPU minutes)",
                   ylabel=label, title=f"{args.corpus}: {label}")
    plots = alignment_plots(args, max(args.marks))
    flow = gradient_flow(args, max(args.marks))
    lines = ["| model | " + " | ".join(f"{m} min: steps / val loss / BLEU / chrF" for m in sorted(args.marks)) + " |",
             "|---|" + "---|" * len(args.marks)]
    for name, rows in table.items():
        cells = []
        for m in sorted(args.marks):
            r = rows.get(str(m))
            cells.append(f"{r['step']} / {r['val_loss']:.3f} / {r['bleu']:.2f} / {r['chrf']:.1f}" if r else "-")
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + f"\n\nthis invocation {seconds:.0f} s wall-clock, load average at the end {loadavg()}\n"
    write_json(out / "results.json", {"args": {k: v for k, v in vars(args).items() if k != "worker"},
                                      "results": table, "alignment_plots": plots, "gradient_flow": flow,
                                      "seconds": seconds})
    from attnlab.io.files import atomic_write_text

    atomic_write_text(out / "results.md", text)
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/rnn-vs-transformer-study")
    p.add_argument("--corpus", default="bible-en-es", help="a built-in pair corpus (bible-en-es, de-en, ...)")
    p.add_argument("--marks", type=cpu_minutes, nargs="+", default=[5, 10, 20, 40],
                   help="CPU minutes of training at which each model is saved and evaluated (the last is the budget)")
    p.add_argument("--models", nargs="+", default=["transformer", "lstm+attention", "lstm+luong", "lstm", "rnn"],
                   choices=list(MODELS))
    p.add_argument("--batch-tokens", type=positive_int, default=None,
                   help="batches of pairs of similar length, this many padded tokens each, for every model "
                        "(default: 32 pairs drawn at random, padded to the longest; the RNNs skip padding, "
                        "the Transformer computes it)")
    p.add_argument("--bleu-verses", type=positive_int, default=500, help="held-out verses translated for BLEU/chrF")
    p.add_argument("--jobs", type=positive_int, default=2, help="models trained at once, one thread each")
    p.add_argument("--report-only", action="store_true",
                   help="write the table and plots from what OUT holds, training and scoring nothing")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        shared_tokenizer(out, args.corpus, "seq2seq")
        run_all(args)
    print(report(args, time.perf_counter() - start))


if __name__ == "__main__":
    main()
