"""Induction heads (Olsson et al. 2022) in a two-layer attention-only decoder, trained on CPU.

The data: rows [BOS, r_1 .. r_n, r_1 .. r_n, filler], a random segment of n distinct tokens (n drawn
per row, so no fixed offset finds the copy) shown twice, then random tokens up to a fixed length.
The first copy cannot be predicted; the second can, by an induction head: at r_k it attends to the
token right after r_k's earlier occurrence (r_{k+1}) and copies it, helped by a previous-token
head in layer 0. The script trains the model (a short loop over attnlab's model and optimizer),
measures along training the loss on each copy, the in-context-learning score and every head's
induction and previous-token scores, saves checkpoints, then ablates and patches each head's output
through the hook points, and writes results.json, results.md and the plots:

    python examples/studies/induction_heads/run.py --out runs/induction            # ~2 CPU-minutes
    python examples/studies/induction_heads/run.py --out runs/induction --quick    # the slow test's run

Positions: in a row with segment length n, position 0 is BOS, r_k sits at k and at n + k. The
logits at position t predict the token at t + 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import loadavg, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent
BOS = 0


@dataclass
class Rows:
    """A batch of repeated-segment rows: ids (B, T), n (B,) segment lengths."""

    ids: torch.Tensor
    n: torch.Tensor


def sample_rows(gen: torch.Generator, batch: int, vocab: int, min_len: int, max_len: int) -> tuple[Rows, Rows]:
    """(clean, corrupted): the same rows, except that in the corrupted ones the second copy is
    replaced by fresh random tokens (the clean targets are then unpredictable from the context)."""
    T = 1 + 2 * max_len
    ids = torch.randint(1, vocab, (batch, T), generator=gen)  # the filler (and the corrupted copy)
    fresh = ids.clone()
    n = torch.randint(min_len, max_len + 1, (batch,), generator=gen)
    ids[:, 0] = fresh[:, 0] = BOS
    for b, m in enumerate(n.tolist()):
        segment = torch.randperm(vocab - 1, generator=gen)[:m] + 1
        ids[b, 1:m + 1] = ids[b, m + 1:2 * m + 1] = segment
        fresh[b, 1:m + 1] = segment
    return Rows(ids, n), Rows(fresh, n)


def target_masks(n: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool (B, T - 1) masks over the logits' positions t (predicting the token at t + 1): `first`,
    t + 1 in 2..n (r_2 .. r_n of the first copy), and `repeat`, t + 1 in n + 2 .. 2n (r_2 .. r_n again;
    r_1's second occurrence is left out: nothing says where the segment starts again)."""
    nxt = torch.arange(1, T)[None]
    n = n[:, None]
    return (nxt >= 2) & (nxt <= n), (nxt >= n + 2) & (nxt <= 2 * n)


def token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, T - 1) cross-entropy of each next token."""
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")


def copy_losses(logits: torch.Tensor, rows: Rows) -> dict[str, float]:
    """Mean loss on the first and the repeated copy; `icl`, the in-context-learning score (Olsson et
    al.: the loss late in the context minus early), is their difference (negative: it learns in context)."""
    per_token = token_losses(logits, rows.ids)
    first, repeat = target_masks(rows.n, rows.ids.shape[1])
    out = {"first": per_token[first].mean().item(), "repeat": per_token[repeat].mean().item()}
    out["icl"] = out["repeat"] - out["first"]
    return out


def head_scores(patterns: list[torch.Tensor], rows: Rows) -> dict[str, list[list[float]]]:
    """Per layer and head, from the (B, H, T, T) attention patterns:
    `induction`: mean weight from r_k's second occurrence (n + k) to r_{k+1}'s first (k + 1), k < n;
    `previous`: mean weight from each position t in 1..2n to t - 1;
    `uniform`: what `induction` would be under uniform causal attention (1 / (n + k + 1))."""
    B, T = rows.ids.shape
    rows_i, query, key, prev_q = [], [], [], []
    for b, m in enumerate(rows.n.tolist()):
        k = torch.arange(1, m)
        rows_i.append(torch.full_like(k, b))
        query.append(m + k)
        key.append(k + 1)
    rows_i, query, key = torch.cat(rows_i), torch.cat(query), torch.cat(key)
    t = torch.arange(1, T)
    inside = t[None] <= 2 * rows.n[:, None]  # (B, T - 1): the two copies, not the filler
    scores = {"induction": [], "previous": []}
    for p in patterns:
        scores["induction"].append(p[rows_i, :, query, key].mean(0).tolist())
        prev = p[:, :, t, t - 1]  # (B, H, T - 1)
        scores["previous"].append(((prev * inside[:, None]).sum((0, 2)) / inside.sum()).tolist())
    scores["uniform"] = (1.0 / (query + 1).float()).mean().item()
    return scores


def patterns_of(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The logits and each layer's (B, H, T, T) self-attention pattern, in layer order."""
    from attnlab.inspect.attention_maps import capture_attention

    with torch.no_grad(), capture_attention(model, "layers.*.self_attn") as record:
        logits = model(ids)
    return logits, [record[name] for name in record.names()]


def model_config(args: argparse.Namespace):
    from attnlab import ModelConfig

    return ModelConfig(arch="decoder", vocab_size=args.vocab, d_model=args.d_model, num_layers=2,
                       num_heads=args.heads, d_ff=0, dropout=0.0, norm_placement="pre", tie_embeddings=False,
                       position={"scheme": "learned", "max_len": 1 + 2 * args.max_len}, pad_token_id=None)


def evaluate(model: torch.nn.Module, rows: Rows) -> dict:
    logits, patterns = patterns_of(model, rows.ids)
    return {**copy_losses(logits, rows), **head_scores(patterns, rows)}


def train(args: argparse.Namespace, checkpoints: Path) -> dict:
    """The training loop: AdamW at a constant rate after a short warm-up, a fresh batch each step
    from a seeded generator; an evaluation on one fixed held-out batch every `eval_every` steps,
    a checkpoint (`attnlab.save`) every `checkpoint_every`. Returns the history and the timing."""
    import attnlab
    from attnlab.training.optim import build_optimizer

    torch.manual_seed(args.seed)
    model = attnlab.build_model(model_config(args))
    optimizer = build_optimizer(model, "adamw", lr=args.lr, weight_decay=0.01)
    train_gen = torch.Generator().manual_seed(args.seed + 1)
    held_out, _ = sample_rows(torch.Generator().manual_seed(10 ** 6), args.eval_batch, args.vocab, args.min_len, args.max_len)
    history, cpu0, wall0 = [], time.process_time(), time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            history.append({"step": step, **evaluate(model, held_out)})
            model.train()
        if step % args.checkpoint_every == 0 or step == args.steps:
            attnlab.save(model, checkpoints / f"step{step:05d}")
        if step == args.steps:
            break
        rows, _ = sample_rows(train_gen, args.batch, args.vocab, args.min_len, args.max_len)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / args.warmup)
        loss = token_losses(model(rows.ids), rows.ids).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    timing = {"cpu_seconds": round(time.process_time() - cpu0, 1), "wall_seconds": round(time.perf_counter() - wall0, 1)}
    return {"history": history, "timing": timing, "model": model.eval(), "held_out": held_out}


def formation(history: list[dict], layer: int = 1) -> dict:
    """When the induction head formed: the first evaluation where the best head's induction score
    in `layer` passed half its final value, and the evaluation interval over which the repeated
    copy's loss fell the most (the phase change), and the evaluation where the first copy's loss
    peaked (it rises for a while as the head forms: the bump)."""
    final = history[-1]["induction"][layer]
    head = max(range(len(final)), key=final.__getitem__)
    half = next(h["step"] for h in history if h["induction"][layer][head] >= final[head] / 2)
    drops = [(a["repeat"] - b["repeat"], b["step"]) for a, b in zip(history, history[1:])]
    peak = max(history[1:], key=lambda h: h["first"])
    return {"head": head, "score_half_step": half, "steepest_drop_step": max(drops)[1],
            "steepest_drop": round(max(drops)[0], 3), "first_copy_peak_step": peak["step"],
            "first_copy_peak": round(peak["first"], 3)}


def _set_heads(heads: list[tuple[int, int]], layer: int, value) -> dict:
    """{hook_z of `layer`: fn} setting the listed heads of that layer to `value(z, head)`, or {}."""
    chosen = [h for lay, h in heads if lay == layer]
    if not chosen:
        return {}

    def fn(z, name):
        z = z.clone()
        for head in chosen:
            z[:, head] = value(z, head, name)
        return z

    return {f"layers.{layer}.self_attn.hook_z": fn}


def _with_heads(model: torch.nn.Module, ids: torch.Tensor, heads: list[tuple[int, int]], value) -> torch.Tensor:
    """The logits with the output (`hook_z`, (B, H, T, Dh)) of each (layer, head) replaced by `value`."""
    from attnlab.inspect.hooks import hooks

    fns = {}
    for layer in range(len(model.layers)):
        fns.update(_set_heads(heads, layer, value))
    with torch.no_grad(), hooks(model, fns):
        return model(ids)


def head_sets(model: torch.nn.Module, extra: dict[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
    """Every single head by its name (L1H2), then the named groups in `extra`."""
    single = {f"L{layer}H{head}": [(layer, head)] for layer, block in enumerate(model.layers)
              for head in range(block.self_attn.num_heads)}
    return {**single, **{name: heads for name, heads in extra.items() if heads}}


def ablations(model: torch.nn.Module, rows: Rows, sets: dict[str, list[tuple[int, int]]]) -> list[dict]:
    """Per set of heads: the repeated copy's loss with their outputs (`hook_z`) set to zero, or to
    their mean over the batch at each position."""
    zero = lambda z, head, name: 0.0
    mean = lambda z, head, name: z[:, head].mean(0, keepdim=True)
    return [{"heads": name,
             "zero": copy_losses(_with_heads(model, rows.ids, heads, zero), rows)["repeat"],
             "mean": copy_losses(_with_heads(model, rows.ids, heads, mean), rows)["repeat"]}
            for name, heads in sets.items()]


def next_token_logprob(logits: torch.Tensor, clean: Rows) -> float:
    """Mean log-probability of the clean next token r_{k+1} at each r_k of the second copy."""
    _, repeat = target_masks(clean.n, clean.ids.shape[1])
    logp = -token_losses(logits, clean.ids)
    return logp[repeat].mean().item()


def patching(model: torch.nn.Module, clean: Rows, corrupted: Rows, sets: dict[str, list[tuple[int, int]]]) -> dict:
    """Activation patching per set of heads: their clean outputs (`hook_z`) put into the corrupted run
    (second copy replaced by fresh tokens); metric: the log-prob of the clean next token, and
    `recovered` = (patched - corrupted) / (clean - corrupted)."""
    from attnlab.inspect.hooks import run_with_cache

    with torch.no_grad():
        logits, cache = run_with_cache(model, clean.ids, names="layers.*.self_attn.hook_z")
        corrupt_lp = next_token_logprob(model(corrupted.ids), clean)
    clean_lp = next_token_logprob(logits, clean)
    put = lambda z, head, name: cache[name][:, head]
    table = []
    for name, heads in sets.items():
        lp = next_token_logprob(_with_heads(model, corrupted.ids, heads, put), clean)
        table.append({"heads": name, "logprob": lp, "recovered": (lp - corrupt_lp) / (clean_lp - corrupt_lp)})
    return {"clean": clean_lp, "corrupted": corrupt_lp, "heads": table}


def groups(last: dict) -> dict[str, list[tuple[int, int]]]:
    """The heads that do the job at the end of training, as groups: layer 1's induction heads (score
    over 10x uniform attention's) and layer 0's previous-token heads (score over 0.25)."""
    return {"all induction heads": [(1, h) for h, v in enumerate(last["induction"][1]) if v > 10 * last["uniform"]],
            "all previous-token heads": [(0, h) for h, v in enumerate(last["previous"][0]) if v > 0.25]}


def plots(results: dict, model: torch.nn.Module, rows: Rows, out: Path, tag: str) -> list[str]:
    """loss_curves (both copies over training), induction_scores (every head over training, with the
    previous-token score of layer 0's best head), induction_pattern (the induction head on one row)."""
    from attnlab.inspect.plots import plot_heatmap, plot_lines

    history, found = results["history"], results["formation"]
    steps = [h["step"] for h in history]
    files = [plot_lines({"first copy (unpredictable)": (steps, [h["first"] for h in history]),
                         "repeated copy": (steps, [h["repeat"] for h in history])},
                        out / f"loss_curves{tag}.png", xlabel="training step", ylabel="loss (nats)",
                        title="loss on each copy: the phase change")]
    series = {f"L{layer}H{head} induction": (steps, [h["induction"][layer][head] for h in history])
              for layer in range(2) for head in range(len(history[-1]["induction"][layer]))}
    prev = max(range(len(history[-1]["previous"][0])), key=history[-1]["previous"][0].__getitem__)
    series[f"L0H{prev} previous-token"] = (steps, [h["previous"][0][prev] for h in history])
    series["uniform attention"] = (steps, [h["uniform"] for h in history])
    files.append(plot_lines(series, out / f"induction_scores{tag}.png", xlabel="training step",
                            ylabel="mean attention weight", title="per-head scores over training"))
    _, patterns = patterns_of(model, rows.ids[:1])
    n = int(rows.n[0])
    labels = ["BOS"] + [f"r{k}" for k in range(1, n + 1)] * 2
    files.append(plot_heatmap(patterns[1][0, found["head"], :2 * n + 1, :2 * n + 1], out / f"induction_pattern{tag}.png",
                              x_labels=labels, y_labels=labels, x_name="key", y_name="query",
                              title=f"L1H{found['head']} on a repeated segment (n={n})"))
    return [Path(f).name for f in files]


def report(results: dict) -> str:
    """results.md: the setup, when the head formed, the per-head table, ablation and patching."""
    last, found, setup = results["history"][-1], results["formation"], results["setup"]
    lines = [f"# Induction heads: results ({setup['steps']} steps)", "",
             f"Setup: {setup['config']}; batch {setup['batch']}, lr {setup['lr']}, segments of "
             f"{setup['min_len']}-{setup['max_len']} tokens; {results['timing']['cpu_seconds']} CPU s "
             f"({results['timing']['wall_seconds']} s wall, load {results['loadavg']}).", "",
             f"Final loss: first copy {last['first']:.3f}, repeated copy {last['repeat']:.3f}, "
             f"in-context-learning score {last['icl']:.3f} nats.", "",
             f"The induction head L1H{found['head']} passed half its final score at step "
             f"{found['score_half_step']}; the repeated copy's loss fell most in the interval ending at step "
             f"{found['steepest_drop_step']} (by {found['steepest_drop']} nats); the first copy's loss peaked at "
             f"step {found['first_copy_peak_step']} ({found['first_copy_peak']} nats, from "
             f"{results['history'][0]['first']:.3f} at step 0).", "",
             "| head | induction | previous-token | zero-ablated repeat loss | mean-ablated | patching: recovered |",
             "|---|---|---|---|---|---|"]
    for abl, pat in zip(results["ablation"], results["patching"]["heads"]):
        name = abl["heads"]
        if name.startswith("L") and name[1:2].isdigit():
            layer, head = int(name[1]), int(name[3:])
            scores = f"{last['induction'][layer][head]:.3f} | {last['previous'][layer][head]:.3f}"
        else:
            scores = f"{', '.join(f'L{lay}H{h}' for lay, h in results['groups'][name])} | "
        lines.append(f"| {name} | {scores} | {abl['zero']:.3f} | {abl['mean']:.3f} | {pat['recovered']:.3f} |")
    pat = results["patching"]
    lines += ["", f"Uniform causal attention would give an induction score of {last['uniform']:.3f}. "
              f"Repeat loss with no ablation: {last['repeat']:.3f}. Patching metric (log-prob of the correct "
              f"next token): clean {pat['clean']:.3f}, corrupted {pat['corrupted']:.3f}.", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(HERE), help="where results.json, results.md and the plots go")
    p.add_argument("--checkpoints", default=None,
                   help="where the checkpoints go (default: runs/induction_heads/ at the repository root, outside git)")
    p.add_argument("--quick", action="store_true", help="900 steps, the slow test's run")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--eval-batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--vocab", type=int, default=64, help="token 0 is BOS, segments draw from 1..vocab-1")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--min-len", type=int, default=8)
    p.add_argument("--max-len", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.eval_every = 900, 50
    for name in ("steps", "eval_every", "checkpoint_every", "batch", "eval_batch", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not 2 <= args.min_len <= args.max_len < args.vocab:
        p.error(f"expected 2 <= --min-len <= --max-len < --vocab, got {args.min_len}, {args.max_len}, {args.vocab}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "_quick" if args.quick else ""
    checkpoints = Path(args.checkpoints) if args.checkpoints else HERE.parents[2] / "runs" / f"induction_heads{tag}"
    trained = train(args, checkpoints)
    model = trained["model"]
    clean, corrupted = sample_rows(torch.Generator().manual_seed(2 * 10 ** 6), args.eval_batch, args.vocab,
                                   args.min_len, args.max_len)
    setup = {k: v for k, v in vars(args).items() if k not in ("out", "quick", "checkpoints")}
    setup["config"] = (f"2 attention-only layers, {args.heads} heads, d_model {args.d_model}, vocabulary {args.vocab}, "
                       "learned positions, pre-norm")
    results = {"setup": setup, "timing": trained["timing"], "loadavg": loadavg(), "history": trained["history"],
               "formation": formation(trained["history"]), "groups": groups(trained["history"][-1])}
    sets = head_sets(model, results["groups"])
    results["ablation"] = ablations(model, clean, sets)
    results["patching"] = patching(model, clean, corrupted, sets)
    results["plots"] = plots(results, model, clean, out, tag)
    write_json(out / f"results{tag}.json", results)
    from attnlab.io.files import atomic_write_text

    atomic_write_text(out / f"results{tag}.md", report(results))
    print(report(results))
    return results


if __name__ == "__main__":
    main()
