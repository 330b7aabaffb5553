"""The alignment study's tables (results.md, results.json) and plots from what OUT holds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from common import loadavg, read_json, write_json

LABELS = {"transformer": "Transformer", "lstm+attention": "LSTM + Bahdanau", "lstm+luong": "LSTM + Luong"}
RULES = ("argmax", "threshold 0.2")


def _latest(results: dict) -> tuple[str, dict] | None:
    if not results:
        return None
    mark = max(results, key=lambda m: float(m[:-3]))
    return mark, results[mark]


def _cells(row: dict | None) -> str:
    if row and "links" in row:  # eflomal: its own links, neither argmax nor threshold
        return f"{row['links']:.3f} (its links) | -"
    return " | ".join(f"{row[r]:.3f}" if row and r in row else "-" for r in RULES)


def head_table(aer: dict[str, dict], prefix: str = "") -> tuple[list[str], list[list[float]], list[str]]:
    """(layer names, AER (argmax) per layer x head, markdown lines) of a Transformer's heads."""
    pattern = re.compile(rf"^{re.escape(prefix)}L(\d+) h(\d+)$")
    cells = {(int(m[1]), int(m[2])): v["argmax"] for k, v in aer.items() if (m := pattern.match(k))}
    if not cells:
        return [], [], []
    layers, heads = sorted({l for l, _ in cells}), sorted({h for _, h in cells})
    grid = [[cells[(l, h)] for h in heads] for l in layers]
    lines = ["| layer | " + " | ".join(f"head {h}" for h in heads) + " | layer mean |", "|---|" + "---|" * (len(heads) + 1)]
    for l, row in zip(layers, grid):
        mean = aer.get(f"{prefix}L{l} mean", {}).get("argmax")
        lines.append(f"| {l} | " + " | ".join(f"{x:.3f}" for x in row) + f" | {mean:.3f} |")
    return [f"layer {l}" for l in layers], grid, lines


def _without_matrices(table: dict[str, dict]) -> dict[str, dict]:
    """The results with each example verse's score matrices left out (they are drawn in
    example_<model>.png and kept in OUT/<model>/alignment.json): results.json stays small."""
    return {name: {mark: {**r, "example": {k: v for k, v in r["example"].items() if k != "matrices"}}
                   if r.get("example") else r for mark, r in results.items()} for name, results in table.items()}


def training_table(table: dict[str, dict]) -> list[str]:
    """Markdown lines: for each model and each scored mark, its step, how well it translates
    (greedy BLEU and chrF on the faithfulness verses) and the AER (argmax) of its best
    cross-attention head, of its mean attention and of the diagonal."""
    lines = ["| model | mark | step | greedy BLEU / chrF | best head | mean attention | diagonal |",
             "|---|---|---|---|---|---|---|"]
    for name, results in table.items():
        for mark in sorted(results, key=lambda m: float(m[:-3])):
            r = results[mark]
            aer = r["aer"]
            heads = {k: v["argmax"] for k, v in aer.items() if re.match(r"^L\d+ h\d+$", k)}
            best = f"{min(heads.values()):.3f} ({min(heads, key=heads.get)})" if heads else "-"
            mean = aer["all layers mean" if heads else "attention mean"]["argmax"]
            g = r["faithfulness"].get("greedy") or {}
            quality = f"{g['bleu']:.2f} / {g['chrf']:.1f}" if g.get("bleu") is not None else "-"
            lines.append(f"| {LABELS[name]} | {mark} | {r.get('training', {}).get('step', '?')} | {quality} | "
                         f"{best} | {mean:.3f} | {aer['diagonal']['argmax']:.3f} |")
    return lines


def plot_example(example: dict, path: Path, names: list[str], title: str) -> None:
    """One verse's (target words x source words) matrices side by side, the reference first."""
    import torch

    from attnlab.inspect.plots import _figure, save_figure

    src = re.findall(r"\w+", example["source"])
    tgt = re.findall(r"\w+", example["target"])
    ref = torch.zeros(len(tgt), len(src))
    for i, j in example["possible"]:
        ref[j, i] = 0.5
    for i, j in example["sure"]:
        ref[j, i] = 1.0
    panels = [("reference (Strong's: sure 1, possible 0.5)", ref)]
    panels += [(n, torch.tensor(example["matrices"][n])) for n in names if n in example["matrices"]]
    fig = _figure(3.2 * len(panels) + 1, 0.22 * len(tgt) + 2.5)
    for k, (name, m) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        m = m / m.sum(1, keepdim=True).clamp(min=1e-12)
        ax.imshow(m.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
        ax.set_xticks(range(len(src)), src, rotation=90, fontsize=6)
        ax.set_yticks(range(len(tgt)), tgt if k == 0 else [""] * len(tgt), fontsize=6)
        ax.set_title(name, fontsize=8)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


def report(out: Path, args: Any, seconds: float) -> str:
    from attnlab.inspect.plots import plot_heatmap
    from attnlab.io.files import atomic_write_text

    ref = read_json(out / "reference.json") or {}
    shifts = ref.get("shifts", {})
    lines = ["## The corpus's verse pairing", ""]
    if shifts:
        worst = sorted(shifts["chapters"].items(), key=lambda kv: -len(kv[1]))[:12]
        lines += [f"{shifts['flagged']} of {shifts['pairs']} verse pairs are flagged (a neighbouring Spanish verse "
                  f"shares more Strong's numbers with the English one than its own, by more than "
                  f"{shifts['margin']}), in {len(shifts['chapters'])} chapters; the most: "
                  + ", ".join(f"{c} ({len(v)})" for c, v in worst) + ".", ""]
    if ref.get("numbers_13_17"):
        n = ref["numbers_13_17"]
        lines += [f"{n['ref']}: \"{n['source']}\" is paired with \"{n['target']}\" (flagged: {n['flagged']}).", ""]
    table: dict[str, Any] = {}
    summary = ["| model (mark, steps) | verses | method | AER argmax | AER threshold 0.2 |", "|---|---|---|---|---|"]
    for name in args.models:
        results = read_json(out / name.replace("+", "_") / "alignment.json") or {}
        latest = _latest(results)
        if latest is None:
            continue
        mark, r = latest
        table[name] = results
        aer, sub = r["aer"], r["aer_attribution_subset"]
        label = f"{LABELS[name]} ({mark}, step {r.get('training', {}).get('step', '?')})"
        heads = {k: v for k, v in aer.items() if re.match(r"^L\d+ h\d+$", k)}
        inputs = {k: v for k, v in aer.items() if re.match(r"^input L\d+ h\d+$", k)}
        best = min(heads, key=lambda k: heads[k]["argmax"]) if heads else None
        mean = "all layers mean" if heads else "attention mean"
        rows = [("best head (predicting step): " + best, aer[best])] if best else []
        if inputs:
            best_input = min(inputs, key=lambda k: inputs[k]["argmax"])
            rows.append(("best head (reading step): " + best_input[6:], aer[best_input]))
        rows += [(mean, aer[mean]), (f"input {mean}", aer[f"input {mean}"]), ("diagonal", aer["diagonal"])]
        rows += [(k, v) for k, v in aer.items() if k.startswith("eflomal")]
        for method, row in rows:
            summary.append(f"| {label} | {r['verses']} | {method} | {_cells(row)} |")
        n = r["attribution_verses"]
        for method in ("grad_x_input", "integrated_gradients", mean, f"input {mean}", "diagonal",
                       "eflomal grow-diag-final-and"):
            if method in sub:
                summary.append(f"| {label} | first {n} | {method}{'' if method.endswith('gradients') or method.endswith('input') else ' (same verses)'} | "
                               f"{_cells(sub[method])} |")
        for prefix, tag in (("", ""), ("input ", "_input")):
            layer_names, grid, head_lines = head_table(aer, prefix)
            if grid:
                import torch

                plot_heatmap(torch.tensor(grid), out / f"aer_heads{tag}.png", x_labels=[f"h{h}" for h in range(len(grid[0]))],
                             y_labels=layer_names, title=f"{LABELS[name]} cross-attention AER (argmax), rows "
                             f"{'reading' if tag else 'predicting'} each target piece", x_name="head", y_name="decoder layer")
                lines += [f"### {LABELS[name]}: AER (argmax) of each cross-attention head, "
                          f"{'the step that has read the target word' if tag else 'the step that predicts the target word'}",
                          "", *head_lines, ""]
        if r.get("example"):
            names = ([best] if best else []) + [mean, "grad_x_input", "integrated_gradients"]
            plot_example(r["example"], out / f"example_{name.replace('+', '_')}.png", names,
                         f"{LABELS[name]} ({mark}): {r['example']['ref']}")
    faith = ["| model | verses | word removed | edit rate vs first translation (mean ± sd) | 100 - chrF (mean ± sd) |"
             " most attended changes more / ties |", "|---|---|---|---|---|---|"]
    for name, rows in table.items():
        f = _latest(rows)[1]["faithfulness"]
        for kind in ("most attended", "random"):
            e, c = f[f"{kind}: edit_rate"], f[f"{kind}: chrf_drop"]
            extra = f"{f['most attended changes more (edit rate)']} / {f['ties']}" if kind == "most attended" else ""
            faith.append(f"| {LABELS[name]} | {f['verses']} | {kind} | {e['mean']:.3f} ± {e['std']:.3f} | "
                         f"{c['mean']:.1f} ± {c['std']:.1f} | {extra} |")
    text = "\n".join(lines + ["## Over training", "", *training_table(table), "", "## AER by method", "",
                              *summary, "", "## Faithfulness", "", *faith, "",
                              f"this invocation {seconds:.0f} s wall-clock, load average at the end {loadavg()}", ""])
    write_json(out / "results.json", {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "analyse")},
                                      "reference": {k: v for k, v in ref.items() if k != "held_out"},
                                      "eflomal": {k: v for k, v in (read_json(out / "eflomal.json") or {}).items()
                                                  if k != "held_out"},
                                      "results": _without_matrices(table), "seconds": seconds})
    atomic_write_text(out / "results.md", text)
    return text
