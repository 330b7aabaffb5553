"""The studies page's numbers are the committed results files' numbers.

docs/studies/index.md marks each of its tables with `<!-- table: NAME -->`; TABLES below rebuilds
every such table, cell for cell, from the study's committed results files (examples/studies/*/,
examples/vit_digits/), so a number edited on the page, or a results file rerun without the page,
fails. Every other number in a study's prose must be one of the numbers in that study's checked
tables, or one of its settings listed in SETTINGS (the study's configuration, not a measurement).
"""

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "studies" / "index.md"
STUDIES = ROOT / "examples" / "studies"


def _load(path: str) -> dict:
    return json.loads((ROOT / "examples" / path).read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the tables, from the results files

RNN_MODELS = {"transformer": "Transformer", "lstm+luong": "LSTM + attention (Luong)",
              "lstm+attention": "LSTM + attention (Bahdanau)", "lstm": "LSTM", "rnn": "RNN"}


def rnn_vs_transformer() -> list[list[str]]:
    data = _load("studies/rnn_vs_transformer/results.json")
    marks = [str(m) for m in data["args"]["marks"]]
    rows = [["model"] + [f"{m} CPU-min: steps / BLEU" for m in marks] + ["gradient far / near"]]
    for key, label in RNN_MODELS.items():
        cells = [f"{data['results'][key][m]['step']:,} / {data['results'][key][m]['bleu']:.2f}" for m in marks]
        rows.append([label] + cells + [f"{data['gradient_flow'][key]['far_over_near']:.2f}"])
    return rows


def rnn_vs_transformer_batches() -> list[list[str]]:
    runs = {"results.json": "bible-en-es, random batches of 32 pairs"}
    for folder in ("bible_buckets", "en_de", "en_de_buckets"):
        args = _load(f"studies/rnn_vs_transformer/{folder}/results.json")["args"]
        batches = (f"length-bucketed batches of {args['batch_tokens']:,} tokens" if args.get("batch_tokens")
                   else "random batches of 32 pairs")
        runs[f"{folder}/results.json"] = f"{args['corpus']}, {batches}"
    rows = [["corpus, batches", "Transformer: steps / BLEU at 40 CPU-min", "Luong: steps / BLEU at 40 CPU-min"]]
    for path, label in runs.items():
        results = _load(f"studies/rnn_vs_transformer/{path}")["results"]
        rows.append([label] + [f"{results[m]['40']['step']:,} / {results[m]['40']['bleu']:.2f}"
                               for m in ("transformer", "lstm+luong")])
    return rows


def translation() -> list[list[str]]:
    data = _load("studies/translation/results.json")["results"]
    marks = ["15", "30", "45", "60"]
    rows = [["held out"] + [f"{m} CPU-min: steps / BLEU / chrF" for m in marks]]
    labels = {"bible-en-es": "EN->ES, held-out verses", "bible-en-es-books": "EN->ES, four held-out books",
              "en-de": "EN->DE, held-out pairs"}
    for corpus, label in labels.items():
        marks_done = data[corpus]
        sentences = next(iter(marks_done.values()))["sentences"]
        rows.append([f"{label} ({sentences:,})"] + [
            f"{marks_done[m]['step']:,} / {marks_done[m]['bleu']:.2f} / {marks_done[m]['chrf']:.1f}"
            if m in marks_done else "-" for m in marks])
    for part, label in (("descriptions", "of which package descriptions"), ("ding", "of which Ding's sentences")):
        first = data["en-de"]["60"]["by_part"][part]
        rows.append([f"{label} ({first['sentences']:,})"] + [
            f"{data['en-de'][m]['step']:,} / {data['en-de'][m]['by_part'][part]['bleu']:.2f} / "
            f"{data['en-de'][m]['by_part'][part]['chrf']:.1f}" for m in marks])
    return rows


def positions() -> list[list[str]]:
    timed = _load("studies/positions/results_12min.json")
    stepped = _load("studies/positions/results_1000steps.json")
    lengths = timed["args"]["lengths"]
    minutes = f"{timed['args']['minutes']:g}"
    rows = [["scheme", f"steps in {minutes} min"] + [f"loss @ {n:,}" for n in lengths]
            + [f"loss @ {lengths[-1]:,} - loss @ {lengths[0]:,}",
               f"the same after {stepped['args']['steps']:,} steps"]]
    for scheme, run in timed["schemes"].items():
        losses = [run["lengths"][str(n)] for n in lengths]
        cells = [f"{x['loss']:.3f}" if x["evaluable"] else "refused" for x in losses]

        def growth(result: dict) -> str:
            first, last = result["lengths"][str(lengths[0])], result["lengths"][str(lengths[-1])]
            return f"{last['loss'] - first['loss']:+.2f}" if last["evaluable"] else "-"
        rows.append([f"`{scheme}`", f"{run['steps']:,}"] + cells + [growth(run), growth(stepped["schemes"][scheme])])
    return rows


def _points(result: dict) -> dict[int, dict]:
    return {p["T"]: p for p in result["points"]}


def attention_cost() -> list[list[str]]:
    data = _load("studies/attention_cost/results.json")["results"]
    rows = [["curve", "ms at T = 1,024", "ms at T = 4,096", "time x per doubling, 2,048 -> 4,096",
             "peak MiB at 4,096", "memory x per doubling, 2,048 -> 4,096"]]
    for name, result in data.items():
        p = _points(result)
        rows.append([f"`{name}`", f"{p[1024]['seconds'] * 1e3:,.1f}", f"{p[4096]['seconds'] * 1e3:,.1f}",
                     f"{p[4096]['seconds'] / p[2048]['seconds']:.1f}", f"{p[4096]['peak_bytes'] / 2**20:.0f}",
                     f"{p[4096]['peak_bytes'] / p[2048]['peak_bytes']:.1f}"])
    return rows


def attention_cost_quick() -> list[list[str]]:
    data = _load("studies/attention_cost/results_quick.json")["results"]
    rows = [["quick run, 1,024 -> 2,048"] + [f"`{name}`" for name in data]]
    time, memory = ["time x"], ["memory x"]
    for result in data.values():
        p = _points(result)
        time.append(f"{p[2048]['seconds'] / p[1024]['seconds']:.2f}")
        memory.append(f"{p[2048]['peak_bytes'] / p[1024]['peak_bytes']:.2f}")
    return rows + [time, memory]


def _paired(path: str) -> list[str]:
    runs = _load(f"studies/pretraining_pays/{path}")["runs"]
    acc = {(r["init"], r["seed"]): r["test"]["accuracy"] for r in runs}
    seeds = sorted({seed for _, seed in acc})
    pre = [acc["pretrained", s] for s in seeds]
    rnd = [acc["random", s] for s in seeds]
    diff = [a - b for a, b in zip(pre, rnd)]
    return [" / ".join(f"{x:.3f}" for x in pre), f"{statistics.mean(pre):.3f}",
            " / ".join(f"{x:.3f}" for x in rnd), f"{statistics.mean(rnd):.3f}",
            f"{statistics.mean(diff) * 100:+.1f} ({statistics.stdev(diff) * 100:.1f})"]


def pretraining_pays() -> list[list[str]]:
    curves = _load("studies/pretraining_pays/results_mlm_curves.json")["runs"]
    final = {name: f"{run['val_mlm_accuracy'][-1] * 100:.1f}%" for name, run in curves.items()}
    quarter = _load("studies/pretraining_pays/results_debian_text_1500steps_50.json")["args"]["pretrain_steps"]
    return [["encoder (masked-token accuracy)", "pretrained: test accuracy, seeds 0 / 1 / 2", "mean",
             "random twin: seeds 0 / 1 / 2", "mean", "difference, points (paired std)"],
            [f"in domain: `debian-text` ({final['debian_text']})"] + _paired("results_debian_text_50.json"),
            [f"out of domain: `python-docs` ({final['python_docs']})"] + _paired("results_python_docs_50.json"),
            [f"in domain, {quarter:,} steps of pretraining"] + _paired("results_debian_text_1500steps_50.json"),
            [f"out of domain, the earlier recipe ({final['python_docs_2400steps']})"]
            + _paired("results_python_docs_2400steps_50.json")]


def pretraining_curves() -> list[list[str]]:
    curves = _load("studies/pretraining_pays/results_mlm_curves.json")["runs"]
    docs, debian = curves["python_docs"], curves["debian_text"]
    assert docs["steps"] == debian["steps"]
    return [["step"] + [f"{s:,}" for s in docs["steps"]],
            ["`python-docs`"] + [f"{x:.3f}" for x in docs["val_mlm_accuracy"]],
            ["`debian-text`"] + [f"{x:.3f}" for x in debian["val_mlm_accuracy"]]]


def pretraining_budget() -> list[list[str]]:
    curves = _load("studies/pretraining_pays/results_mlm_curves.json")["runs"]
    labels = {"python_docs": "`python-docs`, bert.yaml", "debian_text": "`debian-text`, bert.yaml",
              "python_docs_2400steps": "`python-docs`, the earlier recipe",
              "python_docs_1500steps": "`python-docs`, a quarter of bert.yaml",
              "debian_text_1500steps": "`debian-text`, a quarter of bert.yaml"}
    rows = [["encoder", "steps", "CPU-minutes", "masked-token accuracy"]]
    for key, label in labels.items():
        run = curves[key]
        steps = run["steps"][-1]
        minutes = run.get("cpu_minutes", {}).get(str(steps))
        rows.append([label, f"{steps:,}", "-" if minutes is None else str(minutes),
                     f"{run['val_mlm_accuracy'][-1]:.3f}"])
    return rows


SUMMARISERS = {"transformer": "Transformer encoder-decoder", "decoder": "Transformer decoder alone",
               "dmca": "decoder with memory-compressed attention (DMCA)", "lstm+attention": "LSTM + attention",
               "dmca+moe": "DMCA + mixture of experts"}


def summarisation() -> list[list[str]]:
    data = _load("studies/summarisation/results.json")
    mark = str(max(data["args"]["marks"]))
    rows = [["model", f"steps in {mark} CPU-min", "summary perplexity", "ROUGE-1", "ROUGE-2", "ROUGE-L"]]
    for key, label in SUMMARISERS.items():
        r = data["results"][key][mark]
        rows.append([label, f"{r['step']:,}", f"{r['val_ppl']:.0f}", f"{r['rouge1']:.1f}", f"{r['rouge2']:.1f}",
                     f"{r['rougeL']:.1f}"])
    b = data["baseline"]
    return rows + [["the document's first 8 words", "-", "-", f"{b['rouge1']:.1f}", f"{b['rouge2']:.1f}",
                    f"{b['rougeL']:.1f}"]]


VIT_MODELS = {"vit_p2": "ViT, 2 x 2 patches", "vit_p4": "ViT, 4 x 4 patches", "cnn": "CNN", "mlp": "MLP"}


def vit_digits() -> list[list[str]]:
    data = _load("vit_digits/results.json")
    seconds = f"{data['args']['minutes'] * 60:g}"
    rows = [["model", "parameters", f"steps in {seconds} s", "test accuracy", f"errors / {data['test']}"]]
    for m in data["models"]:
        rows.append([VIT_MODELS[m["model"]], f"{m['params']:,}", f"{m['steps']:,}", f"{m['test_accuracy']:.4f}",
                     str(m["test_errors"])])
    return rows


def induction_heads_training() -> list[list[str]]:
    history = {h["step"]: h for h in _load("studies/induction_heads/results.json")["history"]}
    rows = [["step", "first copy: loss", "repeated copy: loss", "best layer-1 induction score",
             "best layer-0 previous-token score"]]
    for step in (0, 500, 600, 650, max(history)):
        h = history[step]
        rows.append([f"{step:,}", f"{h['first']:.2f}", f"{h['repeat']:.2f}", f"{max(h['induction'][1]):.2f}",
                     f"{max(h['previous'][0]):.2f}"])
    return rows


def induction_heads() -> list[list[str]]:
    data = _load("studies/induction_heads/results.json")
    last = data["history"][-1]
    rows = [["heads", "induction score", "previous-token score", "repeated-copy loss, zeroed", "patching: recovered"]]
    for ablation, patched in zip(data["ablation"], data["patching"]["heads"]):
        name = ablation["heads"]
        if name in data["groups"]:
            heads = [f"L{layer}H{head}" for layer, head in data["groups"][name]]
            label, scores = f"{name} ({', '.join(heads)})", ["-", "-"]
        else:
            layer, head = int(name[1]), int(name[3:])
            label, scores = name, [f"{last['induction'][layer][head]:.2f}", f"{last['previous'][layer][head]:.2f}"]
        recovered = round(patched["recovered"], 2) + 0.0  # + 0.0: no "-0.00"
        rows.append([label] + scores + [f"{ablation['zero']:.2f}", f"{recovered:.2f}"])
    return rows


ALIGN_MODELS = {"transformer": "Transformer", "lstm+attention": "LSTM + Bahdanau", "lstm+luong": "LSTM + Luong"}


def _by_mark(results: dict) -> list[dict]:
    return [results[m] for m in sorted(results, key=lambda m: float(m[:-3]))]


def _heads(aer: dict) -> dict[str, float]:
    return {k: v["argmax"] for k, v in aer.items() if re.fullmatch(r"L\d+ h\d+", k)}


def alignment_training() -> list[list[str]]:
    data = _load("studies/alignment/results.json")["results"]
    rows = [["model", "CPU-min", "steps", "greedy BLEU", "AER: best head", "mean attention", "diagonal"]]
    for key, label in ALIGN_MODELS.items():
        for mark, r in sorted(data[key].items(), key=lambda kv: float(kv[0][:-3])):
            greedy = r["faithfulness"].get("greedy")
            if not greedy:
                continue  # marks scored before the study measured translation
            heads = _heads(r["aer"])
            mean = r["aer"]["all layers mean" if heads else "attention mean"]["argmax"]
            rows.append([label, mark[:-3], f"{r['training']['step']:,}", f"{greedy['bleu']:.2f}",
                         f"{min(heads.values()):.3f}" if heads else "-", f"{mean:.3f}",
                         f"{r['aer']['diagonal']['argmax']:.3f}"])
    return rows


def alignment() -> list[list[str]]:
    data = _load("studies/alignment/results.json")["results"]
    rows = [["model", "aligner", "verses", "AER argmax", "AER threshold 0.2"]]
    cell = lambda row, rule: f"{row[rule]:.3f}"
    for key, label in ALIGN_MODELS.items():
        r = _by_mark(data[key])[-1]
        aer, sub, n = r["aer"], r["aer_attribution_subset"], f"{r['attribution_verses']:,}"
        heads = _heads(aer)
        mean, attention = ("all layers mean", "mean of all heads") if heads else ("attention mean", "attention")
        methods = [(f"best head ({min(heads, key=heads.get)})", aer[min(heads, key=heads.get)], f"{r['verses']:,}")
                   ] if heads else []
        methods += [(attention, aer[mean], f"{r['verses']:,}"), (attention, sub[mean], n),
                    ("gradient x input", sub["grad_x_input"], n), ("integrated gradients", sub["integrated_gradients"], n)]
        rows += [[label, method, verses, cell(row, "argmax"), cell(row, "threshold 0.2")]
                 for method, row, verses in methods]
    last = _by_mark(data["transformer"])[-1]
    for method, key in (("eflomal, intersection", "eflomal intersection"),
                        ("eflomal, grow-diag-final-and", "eflomal grow-diag-final-and")):
        rows.append(["-", method, f"{last['verses']:,}", f"{last['aer'][key]['links']:.3f}", "-"])
    diagonal = last["aer"]["diagonal"]
    rows.append(["-", "diagonal", f"{last['verses']:,}", cell(diagonal, "argmax"), cell(diagonal, "threshold 0.2")])
    return rows


def alignment_faithfulness() -> list[list[str]]:
    data = _load("studies/alignment/results.json")["results"]
    rows = [["model", "verses", "100 - chrF: most attended word removed", "random word removed",
             "most attended changes more / ties"]]
    for key, label in ALIGN_MODELS.items():
        f = _by_mark(data[key])[-1]["faithfulness"]
        rows.append([label, str(f["verses"]), f"{f['most attended: chrf_drop']['mean']:.1f}",
                     f"{f['random: chrf_drop']['mean']:.1f}",
                     f"{f['most attended changes more (edit rate)']} / {f['ties']}"])
    return rows


TABLES = {f.__name__: f for f in (rnn_vs_transformer, rnn_vs_transformer_batches, translation, positions,
                                  attention_cost, attention_cost_quick, pretraining_pays, pretraining_curves,
                                  pretraining_budget, summarisation, vit_digits, induction_heads_training,
                                  induction_heads, alignment_training, alignment, alignment_faithfulness)}

# Numbers a study's prose may use that are its settings, not its measurements (marks, budgets,
# lengths, model sizes, papers' years), by the heading of its section on the page.
SETTINGS = {
    "RNN vs Transformer": {"5", "10", "20", "40", "32", "4", "500", "3", "16"},
    "A translation model within an hour of one core": {"15", "30", "45", "60", "20", "4"},
    "Positions past the trained length": {"128", "1024", "12", "1000", "2022"},
    "Attention cost: quadratic against linear": {"64", "256", "4", "1024", "2048", "4096", "8192", "2", "3"},
    "Does pretraining pay?": {"4", "256", "50", "3", "6000", "1500", "150", "8"},
    "Summarisation at equal time": {"2018", "10", "8", "2", "5", "500"},
    "Attention over image patches (ViT)": {"8", "2", "4", "120"},
    "Induction heads": {"2022", "2", "4", "64", "8", "20", "41", "63", "900"},
    "Does attention give alignment for free?": {"2", "12", "2019", "300", "0.2"},
}


# ---------------------------------------------------------------- reading the page

def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _tables_on_page(text: str) -> dict[str, list[list[str]]]:
    tables = {}
    for match in re.finditer(r"<!-- table: (\w+) -->\n((?:\|.*\|\n)+)", text):
        lines = [line for line in match.group(2).splitlines() if not re.fullmatch(r"\|[-:| ]+\|", line)]
        tables[match.group(1)] = [[cell.strip().replace("**", "") for cell in line.strip("|").split(" | ")]
                                  for line in lines]
    return tables


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in re.findall(r"(?<![A-Za-wyz_\d.])\d[\d,]*(?:\.\d+)?", text)}


def _prose(body: str) -> str:
    body = re.sub(r"```.*?```", "", body, flags=re.S)  # commands
    body = re.sub(r"<!--.*?-->", "", body)
    body = re.sub(r"`[^`]*`", "", body)  # paths, flags, names
    body = re.sub(r"\]\([^)]*\)", "]", body)  # link targets
    return "\n".join(line for line in body.splitlines() if not line.startswith("|"))


def test_every_marked_table_is_built_and_every_builder_has_its_table():
    assert set(_tables_on_page(_page())) == set(TABLES)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_matches_the_results_files(name):
    assert _tables_on_page(_page())[name] == TABLES[name]()


def test_prose_numbers_are_table_numbers_or_settings():
    sections = _sections(_page())
    assert set(SETTINGS) <= set(sections), set(SETTINGS) - set(sections)
    tables = _tables_on_page(_page())
    for title, body in sections.items():
        names = re.findall(r"<!-- table: (\w+) -->", body)
        measured = set().union(*(_numbers(cell) for name in names for row in tables[name] for cell in row))
        stray = _numbers(_prose(body)) - measured - SETTINGS.get(title, set())
        assert not stray, f"{title}: numbers backed by no results file: {sorted(stray)}"


def test_the_check_reads_numbers_as_written():
    # the page's own conventions: thousands separators, signs, decimals, no digits inside names
    assert _numbers("2,025 steps, +13.9 points, 0.721 vs results_12min.json, T5 x3.4") == {"2025", "13.9", "0.721",
                                                                                           "3.4"}
    assert _tables_on_page("<!-- table: x -->\n| a | b |\n|---|---|\n| **1** | 2 |\n") == {"x": [["a", "b"],
                                                                                                   ["1", "2"]]}


def test_readme_studies_table_quotes_the_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Studies", 1)[1].split("\n## ", 1)[0]
    on_page = set().union(*(_numbers(cell) for table in _tables_on_page(_page()).values() for row in table
                            for cell in row))
    stray = _numbers(_prose(section) + "\n" + "\n".join(
        line for line in section.splitlines() if line.startswith("|"))) - on_page - set().union(*SETTINGS.values())
    assert not stray, f"README.md's studies numbers not on the studies page: {sorted(stray)}"
