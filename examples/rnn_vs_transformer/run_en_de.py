"""RNN vs LSTM vs LSTM + attention vs Transformer on real English->German, one command.

Every model goes through the toolkit's own pipeline: the `de-en` corpus (Ding sentence pairs),
one byte-level BPE tokenizer (8,000, trained once and shared), the seq2seq objective, the same
`Trainer` (Adam, label smoothing 0.1, gradient clipping, the Noam schedule), the same number of
steps of 32 pairs, and the trainer's own periodic evaluation: validation loss and BLEU/chrF of
greedy translations of the first validation pairs. Then three plots:

    val_curves.png     validation loss and BLEU against steps, one line per model
    gradient_flow.png  ||dL/dx_k|| over source positions k (distance from the end of the
                       source; geometric mean over 64 validation sentences), trained RNN,
                       LSTM, LSTM + attention and Transformer
    alignment.png      the LSTM + attention model's weights for one validation sentence

    python examples/rnn_vs_transformer/run_en_de.py --steps 600 --out runs/rnn-vs-transformer

Budget: equal steps (reproducible on a shared machine; each model's wall-clock is reported),
or `--minutes M`: equal wall-clock, M / 4 minutes per model. One torch thread by default.
Every file is written atomically; a model whose run folder already holds a finished run is
not trained again (delete the folder to redo it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from attnlab.data.sources import resolve_source
from attnlab.training import TrainConfig, Trainer
from attnlab.training.pipeline import Pipeline, build_tokenizer
from attnlab.io.files import atomic_write_text

D = 256  # embedding width of every model; recurrent hidden size


def model_configs(attention: str) -> dict[str, dict]:
    """The four models, as `model` sections of a run config."""
    def recurrent(cell: str, att: str) -> dict:
        return {"arch": "rnn_encoder_decoder", "d_model": D, "dropout": 0.1,
                "rnn": {"cell": cell, "attention": att, "hidden_size": D, "num_layers": 1}}

    return {
        "rnn": recurrent("rnn", "none"),
        "lstm": recurrent("lstm", "none"),
        "lstm+attention": recurrent("lstm", attention),
        # examples/translation_en_de.yaml's Transformer, two layers instead of three per side
        "transformer": {"preset": "tiny-encoder-decoder", "d_model": D, "num_layers": 2, "num_heads": 4,
                        "d_ff": 4 * D, "dropout": 0.1, "norm_placement": "post", "embedding_scale": True,
                        "position": {"scheme": "sinusoidal", "max_len": 128}},
    }


def run_config(model: dict, out_dir: Path, tokenizer: Path, args: argparse.Namespace) -> dict:
    """One run: the same data, optimiser, schedule and evaluation for every model."""
    budget = {"max_steps": args.steps} if args.minutes is None else \
        {"max_steps": 10**6, "max_minutes": args.minutes / len(args.models)}
    return {
        "model": model,
        "data": {"source": "de-en", "objective": "seq2seq", "batch_size": 32, "max_pair_len": 48,
                 "tokenizer": {"kind": "bpe", "vocab_size": 8000, "path": str(tokenizer)}},
        "optim": {"name": "adam", "lr": 1.0, "betas": [0.9, 0.98], "eps": 1e-9, "weight_decay": 0.0,
                  "grad_clip": 1.0, "label_smoothing": 0.1},
        "schedule": {"name": "noam", "warmup_steps": args.warmup},
        "train": {"out_dir": str(out_dir), **budget, "eval_every": args.eval_every, "eval_batches": 10,
                  "bleu_samples": args.bleu_samples, "log_every": 50, "checkpoint_every": args.eval_every,
                  "keep_last": 1, "seed": args.seed, "threads": args.threads},
    }


def shared_tokenizer(out: Path) -> Path:
    """Train the BPE tokenizer once on the training pairs (both sides); every run loads it."""
    path = out / "tokenizer.json"
    if not path.exists():
        cfg = TrainConfig.from_dict({"data": {"source": "de-en", "objective": "seq2seq",
                                              "tokenizer": {"kind": "bpe", "vocab_size": 8000}}}).data
        build_tokenizer(cfg, resolve_source("de-en", "train"), out)  # writes out/tokenizer.json atomically
    return path


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def train_one(name: str, cfg: dict) -> dict:
    """Train (or reuse a finished run) and return its summary from metrics.jsonl."""
    out = Path(cfg["train"]["out_dir"])
    done = out / "summary.json"
    if done.exists():
        return json.loads(done.read_text())
    if (out / "checkpoints").exists():
        raise SystemExit(f"{out} holds an unfinished run: delete it and start again")
    load_before, start = loadavg(), time.perf_counter()
    trainer = Trainer(TrainConfig.from_dict(cfg), show_progress=False, log=lambda line: print(f"[{name}] {line}",
                                                                                               flush=True))
    summary = trainer.fit()
    params = sum(p.numel() for p in trainer.model.parameters())
    result = {"model": name, "params": params, "steps": summary["steps"], "seconds": time.perf_counter() - start,
              "train_loss": summary["train_loss"], "val_loss": summary.get("val_loss"),
              "bleu": summary.get("bleu"), "chrf": summary.get("chrf"), "best_val_loss": summary["best_val_loss"],
              "loadavg_before": load_before, "loadavg_after": loadavg()}
    atomic_write_text(done, json.dumps(result, indent=2) + "\n")
    return result


def curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {key: [(r["step"], r[key]) for r in records if key in r] for key in ("val_loss", "bleu", "chrf")}


def plot_curves(runs: dict[str, Path], out: Path) -> None:
    from attnlab.inspect.plots import plot_lines

    for key, label in (("val_loss", "validation loss (nats/token)"), ("bleu", "BLEU (greedy)")):
        series = {}
        for name, run in runs.items():
            points = curves(run)[key]
            series[name] = ([s for s, _ in points], [v for _, v in points])
        plot_lines(series, out / f"val_{key}.png", xlabel="step", ylabel=label, title=f"EN->DE: {label}")


@torch.no_grad()
def validation_pairs(pipeline: Pipeline, min_len: int, limit: int) -> list[dict]:
    """Single-pair batches (no padding) of validation pairs whose source has >= min_len tokens."""
    src, _ = pipeline.valid
    picked = [i for i in range(src.num_documents) if len(src.document(i)) + 1 >= min_len][:limit]
    return [pipeline._pairs_batch(pipeline.valid, [i]) for i in picked]


def plot_gradient_flow(runs: dict[str, Path], pipeline: Pipeline, out: Path, window: int = 16) -> dict:
    """Geometric mean (the norms are heavy-tailed) of ||dL/dx_k|| over the last `window` source
    positions of validation sentences."""
    import attnlab
    from attnlab.inspect.gradient_flow import source_gradient_norms
    from attnlab.inspect.plots import plot_lines

    batches = validation_pairs(pipeline, window, 64)
    series, table = {}, {}
    for name, run in runs.items():
        model = attnlab.load(run)
        total = torch.zeros(window, dtype=torch.float64)
        for b in batches:
            norms = source_gradient_norms(model, b["src_ids"], b["tgt_ids"], b["labels"])
            total += norms[-window:].double().clamp(min=1e-30).log()
        mean = (total / len(batches)).exp().float()  # position -window .. -1 (the EOS)
        distance = list(range(window - 1, -1, -1))
        series[name] = (distance, (mean / mean.mean()).tolist())  # shape only: scales differ by model
        # far / near: the 4 positions farthest from the end against the 4 nearest
        table[name] = {"far_over_near": float(mean[:4].mean() / mean[-4:].mean()), "norms": mean.tolist()}
    plot_lines(series, out / "gradient_flow.png", xlabel="distance from the end of the source (tokens)",
               ylabel="||dL/dx_k|| / its mean over the window",
               title=f"gradient reaching the source ({len(batches)} validation sentences)", logy=True)
    return table


def plot_alignment(run: Path, pipeline: Pipeline, out: Path) -> str:
    """Greedy-translate one validation sentence and plot the recurrent attention over its source."""
    import attnlab
    from attnlab.decoding import generate
    from attnlab.inspect.attention_maps import attention_maps
    from attnlab.inspect.plots import plot_alignment as draw

    model, tok = attnlab.load(run), pipeline.tokenizer
    batch = next(b for b in validation_pairs(pipeline, 8, 200) if b["src_ids"].shape[1] <= 14)
    src = batch["src_ids"]
    hyp = generate(model, src, 30, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.bos_token_id)
    weights = attention_maps(model, src, hyp[:, :-1])["attention"][0, 0]  # (Tt, S)
    names = lambda ids: [tok.decode([i]).strip() or tok.id_to_token(i) for i in ids]
    return draw(weights, names(src[0].tolist()), names(hyp[0, 1:].tolist()), out / "alignment.png",
                title=f"LSTM + attention: {tok.decode(src[0].tolist(), skip_special_tokens=True)}")


def markdown_table(results: list[dict], args: argparse.Namespace, seconds: float) -> str:
    lines = ["| model | parameters | steps | train time (s) | val loss | BLEU | chrF |", "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['steps']} | {r['seconds']:.0f} | "
                     f"{r['val_loss']:.3f} | {r['bleu']:.2f} | {r['chrf']:.1f} |")
    lines.append("")
    trained = sum(r["seconds"] for r in results)
    lines.append(f"training {trained:.0f} s (all models), this invocation {seconds:.0f} s (finished runs are reused), "
                 f"threads {args.threads}, load average at the end {loadavg()}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/rnn-vs-transformer", help="output folder")
    p.add_argument("--steps", type=int, default=600, help="optimisation steps per model (equal-steps budget)")
    p.add_argument("--minutes", type=float, default=None,
                   help="equal wall-clock budget instead: this many minutes for all models together")
    p.add_argument("--warmup", type=int, default=200, help="Noam warmup steps")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--bleu-samples", type=int, default=200, help="validation pairs decoded for BLEU/chrF")
    p.add_argument("--attention", choices=("additive", "general", "dot"), default="general",
                   help="the attention of the LSTM + attention model (Bahdanau additive or Luong)")
    p.add_argument("--models", nargs="+", default=["rnn", "lstm", "lstm+attention", "transformer"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tokenizer = shared_tokenizer(out)
    configs = model_configs(args.attention)
    unknown = sorted(set(args.models) - set(configs))
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; choose from {sorted(configs)}")
    runs = {name: out / name.replace("+", "_") for name in args.models}
    results = [train_one(name, run_config(configs[name], runs[name], tokenizer, args)) for name in args.models]
    cfg = TrainConfig.from_dict(run_config(configs["rnn"], out / "rnn", tokenizer, args))
    pipeline = Pipeline.build(cfg.data, None, show_progress=False)
    plot_curves(runs, out)
    flow = plot_gradient_flow(runs, pipeline, out)
    if "lstm+attention" in runs:
        plot_alignment(runs["lstm+attention"], pipeline, out)
    seconds = time.perf_counter() - start
    report = {"args": vars(args), "results": results, "gradient_flow": flow, "seconds": seconds,
              "loadavg_end": loadavg(), "torch": torch.__version__}
    atomic_write_text(out / "results.json", json.dumps(report, indent=2) + "\n")
    table = markdown_table(results, args, seconds)
    atomic_write_text(out / "results.md", table)
    print(table)


if __name__ == "__main__":
    main()
