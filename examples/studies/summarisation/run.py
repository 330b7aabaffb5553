"""Summarisation at equal time, the lectures' document-generation table (Liu et al. 2018,
"Generating Wikipedia by Summarizing Long Sequences") at small scale: an LSTM with attention, a
Transformer encoder-decoder, a decoder-only Transformer over `document [SEP] summary`, the same
decoder with memory-compressed attention (Transformer-DMCA) and with mixture-of-experts layers
added to it, each trained for the same budget of one CPU core's time on `debian-summaries` (a
Debian package's long description -> its one-line synopsis), evaluated at 2, 5 and 10 minutes.

    python examples/studies/summarisation/run.py                          # the full study
    python examples/studies/summarisation/run.py --marks 0.5 1 --out runs/quick --rouge-docs 100 --val-pairs 320

Every model goes through the toolkit's own pipeline (the corpus, one byte-level BPE of 8,000
trained once on the training pairs and shared; the `seq2seq` objective for the encoder-decoders,
`pairs_lm` for the decoders; `attnlab.training.Trainer`). At each mark the model is saved
(`attnlab.save`) to `OUT/<model>/marks/<m>min/` and scored:

- the validation perplexity of the summary tokens (each summary's pieces and its EOS, the same
  tokens under both objectives; label smoothing off) over the first `--val-pairs` held-out pairs,
  through the objective's own validation batches and `attnlab.training.tasks.batch_loss.eval_sums`;
- ROUGE-L F (`attnlab.evaluation.rouge`) of summaries of the first `--rouge-docs` held-out
  documents, written by `attnlab.generate` (greedy, or `--num-beams`): an encoder-decoder reads
  the document + EOS and decodes from BOS, a decoder continues `document [SEP]`
  (`attnlab.data.objectives.pairs_lm_prompt`) up to EOS. The same documents' first 8 words are
  the baseline.

The budget is CPU time, not wall-clock: each model trains in its own process with one torch
thread, and the clock is that process's CPU time spent training (evaluations excluded), read
every 25 steps; wall-clock and the load average are recorded beside it. A model whose marks are
all evaluated is not run again; an interrupted one continues from its last checkpoint and its
recorded clock (`OUT/<model>/clock.json`). Files are written atomically.

Outputs: results.json, results.md (the table), rouge_vs_time.png, val_ppl_vs_time.png.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import (clock_config, cpu_clock_training, cpu_minutes, cpu_time, loadavg,  # noqa: E402
                    read_json, run_workers, shared_tokenizer, write_json)
from attnlab.cli.argtypes import positive_int  # noqa: E402

D = 256  # width of every model
CORPUS = "debian-summaries"
MAX_LEN = 128  # pieces kept of a document (84% of them whole) and of a summary (all of them)
BATCH_TOKENS = 3072  # training batches: pairs of similar length, 33 on average (validation: 32 in file order)
BASELINE_WORDS = 8

# The Transformers: pre-LN (trains without the long warm-up post-LN needs, Xiong et al. 2020),
# sinusoidal positions, the Noam shape with a 1e-3 peak at step 300. The decoders have the
# encoder-decoder's 3 + 3 layers in one stack of 6 (Liu et al.'s T-D against T-ED).
TRANSFORMER = {"d_model": D, "num_heads": 4, "d_ff": 4 * D, "dropout": 0.1, "norm_placement": "pre",
               "embedding_scale": True, "position": {"scheme": "sinusoidal", "max_len": 512}}
NOAM = {"lr": 1e-3 * (D ** 0.5) * (300 ** 0.5), "schedule": {"name": "noam", "warmup_steps": 300}}
DECODER = {"preset": "tiny-decoder", **TRANSFORMER, "num_layers": 6}
# DMCA: even layers attend within blocks of 64 positions (a median row, 71 document pieces + SEP
# + 10 summary pieces, spans two), odd layers to keys and values compressed 3:1 (the paper's c)
DMCA = {**DECODER, "attention": {"kernel": "memory_compressed",
                                 "kernel_options": {"compression": 3, "block_size": 64}}}

MODELS: dict[str, dict[str, Any]] = {
    # Bahdanau et al. 2015 (Liu et al.'s seq2seq-attention baseline): a bidirectional LSTM encoder,
    # additive attention fed into every decoder step; Adam at a constant 1e-3 after 50 steps
    "lstm+attention": {"objective": "seq2seq", "lr": 1e-3, "schedule": {"name": "constant", "warmup_steps": 50},
                       "model": {"arch": "rnn_encoder_decoder", "d_model": D, "dropout": 0.2,
                                 "rnn": {"cell": "lstm", "attention": "additive", "hidden_size": D,
                                         "bidirectional": True}}},
    "transformer": {"objective": "seq2seq", **NOAM,
                    "model": {"preset": "tiny-encoder-decoder", **TRANSFORMER, "num_layers": 3}},
    "decoder": {"objective": "pairs_lm", **NOAM, "model": DECODER},
    "dmca": {"objective": "pairs_lm", **NOAM, "model": DMCA},
    # Shazeer et al. 2017 on the DMCA decoder (Liu et al.'s T-DMCA-MoE): every second layer's
    # feed-forward is 4 experts, 2 per token (noisy top-2 gating, capacity 1.25, balance loss)
    "dmca+moe": {"objective": "pairs_lm", **NOAM,
                 "model": {**DMCA, "moe": {"num_experts": 4, "top_k": 2, "every": 2}}},
}
LABELS = {"lstm+attention": "LSTM + attention", "transformer": "Transformer encoder-decoder",
          "decoder": "Transformer decoder (T-D)", "dmca": "Transformer-DMCA", "dmca+moe": "Transformer-DMCA + MoE"}


def run_config(name: str, run_dir: Path, tokenizer: Path) -> dict[str, Any]:
    spec = MODELS[name]
    data = {"source": CORPUS, "objective": spec["objective"], "batch_tokens": BATCH_TOKENS, "batch_size": 32,
            "max_pair_len": MAX_LEN, "tokenizer": {"kind": "bpe", "vocab_size": 8000, "path": str(tokenizer)}}
    return clock_config(spec["model"], data, spec["lr"], spec["schedule"], run_dir)


# ---------------------------------------------------------------- training (one process per model)
def train(name: str, args: argparse.Namespace) -> None:
    """Train `name` on the CPU-time clock, saving a model folder at every mark."""
    out = Path(args.out)
    run_dir = out / name.replace("+", "_")
    cpu_clock_training(run_config(name, run_dir, out / "tokenizer.json"), run_dir, sorted(args.marks), name)


# ---------------------------------------------------------------- evaluation (one process per model)
def valid_pairs(limit: int | None = None) -> list[tuple[str, str]]:
    """The held-out (document, summary) pairs in file order (the order validation batches walk)."""
    from attnlab.data.sources import read_pairs, resolve_source

    pairs = read_pairs(resolve_source(CORPUS, "valid"))
    return pairs[:limit] if limit else pairs


def summary_perplexity(model, pipeline, num_pairs: int) -> dict[str, float]:
    """Mean NLL per summary token (and EOS) over the first `num_pairs` held-out pairs, batched
    by the objective's own validation batches, summed by `eval_sums` (what training's
    validation sums); its exp."""
    from attnlab.training.tasks.batch_loss import eval_sums

    loss, tokens = 0.0, 0
    for batch in pipeline.eval_batches(math.ceil(num_pairs / pipeline.cfg.batch_size)):
        sums = eval_sums(model, batch)
        loss, tokens = loss + sums["loss_sum"], tokens + sums["tokens"]
    return {"val_loss": loss / tokens, "val_ppl": math.exp(loss / tokens), "val_tokens": tokens}


def summarise(model, tok, documents: list[str], *, num_beams: int = 1, max_new_tokens: int = 40,
              batch_size: int = 32) -> list[str]:
    """Summaries of `documents` by `attnlab.generate`, each document cut at MAX_LEN pieces as in
    training. An encoder-decoder reads the document + EOS (`seq2seq`'s source) and decodes from
    BOS; a decoder continues `document [SEP]`. Documents go in batches of equal length (no
    padding: a decoder's prompt would be left-padded, which moves the blocks of DMCA's local
    and compressed layers off the positions they had in training)."""
    import torch

    from attnlab.data.objectives import pairs_lm_prompt, seq2seq
    from attnlab.decoding import generate
    from attnlab.decoding.runner import is_seq2seq

    encoder_decoder, eos = is_seq2seq(model), tok.eos_token_id
    ids = [tok.encode(d)[:MAX_LEN] for d in documents]
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(ids):
        groups.setdefault(len(row), []).append(i)
    out: list[str] = [""] * len(documents)
    with torch.no_grad():
        for rows in groups.values():
            for k in range(0, len(rows), batch_size):
                chunk = rows[k:k + batch_size]
                if encoder_decoder:
                    src = seq2seq([ids[i] for i in chunk], [[] for _ in chunk], pad_id=tok.pad_token_id,
                                  bos_id=tok.bos_token_id, eos_id=eos)["src_ids"]
                    new = generate(model, src, max_new_tokens, num_beams=num_beams, eos_token_id=eos,
                                   decoder_start_token_id=tok.bos_token_id)[:, 1:]
                else:
                    prompt = torch.tensor([pairs_lm_prompt(ids[i], tok.sep_token_id) for i in chunk])
                    new = generate(model, prompt, max_new_tokens, num_beams=num_beams,
                                   eos_token_id=eos)[:, prompt.shape[1]:]
                for i, row in zip(chunk, new.tolist()):
                    out[i] = tok.decode(row[:row.index(eos)] if eos in row else row, skip_special_tokens=True)
    return out


def first_words(document: str, n: int = BASELINE_WORDS) -> str:
    """The baseline summary: the document's first `n` words."""
    return " ".join(document.split()[:n])


def evaluate(name: str, args: argparse.Namespace) -> None:
    import attnlab
    from attnlab.evaluation import rouge
    from attnlab.training import TrainConfig
    from attnlab.training.data.batches import DataPipeline

    out = Path(args.out)
    run_dir = out / name.replace("+", "_")
    results = read_json(run_dir / "evaluation.json") or {}
    pending = [m for m in sorted(args.marks) if str(m) not in results]
    if not pending:
        return
    cfg = TrainConfig.from_dict(run_config(name, run_dir, out / "tokenizer.json"))
    pipeline = DataPipeline.build(cfg.data, show_progress=False)  # the token files training cached
    pairs = valid_pairs(args.rouge_docs)
    for m in pending:
        model, tok = attnlab.load(run_dir / "marks" / f"{m}min", with_tokenizer=True)
        cpu0, load = cpu_time(), loadavg()
        scores = summary_perplexity(model, pipeline, args.val_pairs)
        summaries = summarise(model, tok, [d for d, _ in pairs], num_beams=args.num_beams)
        scores.update(rouge(summaries, [s for _, s in pairs]))
        results[str(m)] = {**scores, "eval_cpu_seconds": round(cpu_time() - cpu0, 1),
                           "eval_loadavg": load, "sample": summaries[:5]}
        write_json(run_dir / "evaluation.json", results)


def worker(args: argparse.Namespace) -> None:
    train(args.worker, args)
    evaluate(args.worker, args)


# ---------------------------------------------------------------- the driver
def report(args: argparse.Namespace, seconds: float) -> str:
    from attnlab.evaluation import rouge
    from attnlab.inspect.plots import plot_lines
    from attnlab.io.files import atomic_write_text

    out, marks = Path(args.out), sorted(args.marks)
    pairs = valid_pairs(args.rouge_docs)
    baseline = rouge([first_words(d) for d, _ in pairs], [s for _, s in pairs])
    table = {}
    for name in args.models:
        run_dir = out / name.replace("+", "_")
        clock, evaluation = read_json(run_dir / "clock.json") or {}, read_json(run_dir / "evaluation.json") or {}
        table[name] = {m: {**clock.get("marks", {}).get(m, {}), **evaluation[m]} for m in map(str, marks)
                       if m in evaluation}
    for key, label in (("rougeL", "ROUGE-L F (held-out documents)"), ("val_ppl", "summary-token perplexity")):
        series = {LABELS[n]: ([float(m) for m in rows], [rows[m][key] for m in rows]) for n, rows in table.items()
                  if rows}
        if key == "rougeL" and series:
            series[f"first {BASELINE_WORDS} words"] = (marks, [baseline["rougeL"]] * len(marks))
        if series:
            plot_lines(series, out / f"{key.replace('rougeL', 'rouge')}_vs_time.png",
                       xlabel="training time on one core (CPU minutes)", ylabel=label, title=f"{CORPUS}: {label}",
                       logy=key == "val_ppl")
    lines = ["| model | " + " | ".join(f"{m} min: steps / ppl / ROUGE-L" for m in marks) + " |",
             "|---|" + "---|" * len(marks)]
    for name, rows in table.items():
        cells = [f"{r['step']} / {r['val_ppl']:.1f} / {r['rougeL']:.1f}" if (r := rows.get(str(m))) else "-"
                 for m in marks]
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    lines.append(f"| first {BASELINE_WORDS} words of the document | " + " | ".join(
        f"- / - / {baseline['rougeL']:.1f}" for _ in marks) + " |")
    text = "\n".join(lines) + f"\n\nthis invocation {seconds:.0f} s wall-clock, load average at the end {loadavg()}\n"
    write_json(out / "results.json", {"args": {k: v for k, v in vars(args).items() if k != "worker"},
                                      "results": table, "baseline": baseline, "seconds": seconds})
    atomic_write_text(out / "results.md", text)
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/summarisation-study")
    p.add_argument("--marks", type=cpu_minutes, nargs="+", default=[2, 5, 10],
                   help="CPU minutes of training at which each model is saved and evaluated (the last is the budget)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--rouge-docs", type=positive_int, default=500, help="held-out documents summarised for ROUGE")
    p.add_argument("--val-pairs", type=positive_int, default=2697, help="held-out pairs for the perplexity (2,697: all)")
    p.add_argument("--num-beams", type=positive_int, default=1, help="1: greedy summaries; more: beam search")
    p.add_argument("--jobs", type=positive_int, default=2, help="models trained at once, one thread each")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shared_tokenizer(out, CORPUS, "pairs_lm")  # seq2seq's special tokens and pairs_lm's separator
    base = [sys.executable, __file__, "--out", args.out, "--rouge-docs", str(args.rouge_docs), "--val-pairs",
            str(args.val_pairs), "--num-beams", str(args.num_beams), "--marks", *map(str, args.marks)]
    run_workers({name: base + ["--worker", name] for name in args.models}, args.jobs,
                before=lambda name: (out / name.replace("+", "_")).mkdir(parents=True, exist_ok=True))
    print(report(args, time.perf_counter() - start))


if __name__ == "__main__":
    main()
