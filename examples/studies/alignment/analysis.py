"""Scoring one saved model's alignments against the reference, and the faithfulness check.

Every method gives a (target words, source words) score matrix per verse (`align.pool`: summed
over a source word's pieces, averaged over a target word's pieces), turned into links by argmax
(each target word to its best source word) and by a threshold (every source word holding at
least THRESHOLD of the target word's total). Only links between words that both carry a
Strong's number are scored (the reference can judge no other).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from align import (aer, aer_from_counts, argmax_links, piece_spans, piece_words, pool, restrict,
                   strongs_reference, threshold_links, words)
from scores import attention_scores, attribution_scores, teacher_forcing

THRESHOLD = 0.2


def word_maps(tok, text: str, ids: list[int]) -> tuple[list[int], int]:
    """(the word of each piece of `ids` (-1 for none), the number of words) for `text`."""
    spans = words(text)
    return piece_words(piece_spans(lambda x: tok.decode(x), ids, text), spans), len(spans)


def methods_of(model, tok, verse: dict, attribution: bool, ig_steps: int) -> dict[str, torch.Tensor]:
    """{method: (target words, source words) scores} for one verse."""
    src_ids, tgt_in, labels = teacher_forcing(tok, verse["source"], verse["target"])
    src_w, n_src = word_maps(tok, verse["source"], src_ids[0, :-1].tolist())
    tgt_w, n_tgt = word_maps(tok, verse["target"], labels[0, :-1].tolist())
    src_w = src_w + [-1]  # the EOS column
    out = {}
    for shifted in (False, True):
        tag = "input " if shifted else ""
        maps = attention_scores(model, src_ids, tgt_in, shifted=shifted)
        pooled = {name: torch.stack([pool(h, tgt_w, src_w, n_tgt, n_src) for h in w]) for name, w in maps.items()}
        for name, heads in pooled.items():
            short = name.replace("decoder.layers.", "L").replace(".cross_attn", "")
            if heads.shape[0] > 1:
                for k in range(heads.shape[0]):
                    out[f"{tag}{short} h{k}"] = heads[k]
            out[f"{tag}{short} mean"] = heads.mean(0)
        if len(pooled) > 1:
            out[f"{tag}all layers mean"] = torch.cat(list(pooled.values())).mean(0)
    if attribution:
        with torch.enable_grad():
            attr = attribution_scores(model, src_ids, tgt_in, labels, steps=ig_steps)
        for name, m in attr.items():
            out[name] = pool(m, tgt_w, src_w, n_tgt, n_src)
    out["diagonal"] = torch.tensor([[1.0 if round((j + 0.5) * n_src / n_tgt - 0.5) == i else 0.0 for i in range(n_src)]
                                    for j in range(n_tgt)], dtype=torch.float64)
    return out


def reference_of(verse: dict) -> tuple[set, set, list[bool], list[bool]]:
    s = [n for _, n in verse["source_words"]]
    t = [n for _, n in verse["target_words"]]
    sure, possible = strongs_reference(s, t)
    return sure, possible, [bool(n) for n in s], [bool(n) for n in t]


def score_model(folder: Path, verses: list[dict], attribution_verses: int, ig_steps: int,
                eflomal: list[dict] | None = None) -> dict[str, Any]:
    """AER of every method of the model saved in `folder` over `verses` (attribution on the first
    `attribution_verses`, scored over those only, beside attention on the same verses)."""
    import attnlab

    model, tok = attnlab.load(folder, with_tokenizer=True)
    model.eval()
    counts: dict[str, dict[str, list]] = {}
    subset: dict[str, dict[str, list]] = {}
    skipped = 0
    example = None
    for k, verse in enumerate(verses):
        try:
            methods = methods_of(model, tok, verse, k < attribution_verses, ig_steps)
        except ValueError:
            skipped += 1  # a verse whose pieces do not decode to its text
            continue
        sure, possible, ok_s, ok_t = reference_of(verse)
        if len(ok_s) != methods["diagonal"].shape[1] or len(ok_t) != methods["diagonal"].shape[0]:
            skipped += 1  # the tagged words are not the plain text's words
            continue
        if eflomal is not None:
            methods.update({f"eflomal {key}": links for key, links in eflomal[k].items()})
        for name, m in methods.items():
            rules = {"links": m} if isinstance(m, set) else {"argmax": argmax_links(m),
                                                             f"threshold {THRESHOLD}": threshold_links(m, THRESHOLD)}
            for rule, links in rules.items():
                c = aer(restrict(links, ok_s, ok_t), sure, possible)
                counts.setdefault(name, {}).setdefault(rule, []).append(c)
                if k < attribution_verses:
                    subset.setdefault(name, {}).setdefault(rule, []).append(c)
        if example is None or (not 10 <= len(example["source"].split()) <= 16 and 10 <= len(ok_s) <= 16):
            example = {"ref": verse["ref"], "source": verse["source"], "target": verse["target"],
                       "matrices": {n: m.tolist() for n, m in methods.items() if not isinstance(m, set)},
                       "sure": sorted(sure), "possible": sorted(possible)}
    table = lambda c: {n: {r: round(aer_from_counts(v), 4) for r, v in rules.items()} for n, rules in c.items()}
    return {"verses": len(verses) - skipped, "skipped": skipped, "aer": table(counts),
            "attribution_verses": min(attribution_verses, len(verses)), "aer_attribution_subset": table(subset),
            "example": example}


def _edit_rate(hyp: list[str], ref: list[str]) -> float:
    """Token (word) edit distance from `ref` to `hyp`, over len(ref)."""
    prev = list(range(len(ref) + 1))
    for i, h in enumerate(hyp, 1):
        cur = [i] + [0] * len(ref)
        for j, r in enumerate(ref, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (h != r))
        prev = cur
    return prev[-1] / max(len(ref), 1)


def faithfulness(folder: Path, verses: list[dict], seed: int = 0, max_new_tokens: int = 160) -> dict[str, Any]:
    """Remove from each source the word its translation attends to most (cross-attention summed
    over the greedy translation's steps, averaged over every layer and head) and, separately, a
    random word other than that one; translate again (greedy) and measure how far each new
    translation is from the first: word edit rate, and 100 - chrF against it. `greedy`: the first
    translations' BLEU and chrF against the reference translations (how well the model translates)."""
    import attnlab
    from attnlab.decoding import generate
    from attnlab.evaluation import bleu_chrf

    model, tok = attnlab.load(folder, with_tokenizer=True)
    model.eval()
    eos, bos = tok.eos_token_id, tok.bos_token_id
    rng = random.Random(seed)

    def translate(text: str) -> tuple[list[int], str]:
        src = torch.tensor([tok.encode(text) + [eos]])
        with torch.no_grad():
            out = generate(model, src, max_new_tokens, eos_token_id=eos, decoder_start_token_id=bos)
        ids = [i for i in out[0, 1:].tolist() if i != eos]
        return ids, tok.decode(ids)

    rows = []
    for verse in verses:
        text = verse["source"]
        spans = words(text)
        if len(spans) < 3:
            continue
        ids, first = translate(text)
        src_ids = torch.tensor([tok.encode(text) + [eos]])
        maps = attention_scores(model, src_ids, torch.tensor([[bos] + ids]))
        mean = torch.cat(list(maps.values())).mean(0)  # (T, S)
        try:
            src_w, n = word_maps(tok, text, src_ids[0, :-1].tolist())
        except ValueError:
            continue
        mass = pool(mean, [0] * mean.shape[0], src_w + [-1], 1, n)[0]
        top = int(mass.argmax())
        other = rng.choice([i for i in range(n) if i != top])
        row = {"ref": verse["ref"], "translation": first, "reference": verse["target"]}
        for kind, w in (("most attended", top), ("random", other)):
            a, b = spans[w]
            reduced = " ".join((text[:a] + text[b:]).split())
            _, new = translate(reduced)
            row[kind] = {"word": text[a:b], "translation": new, "edit_rate": _edit_rate(new.split(), first.split()),
                         "chrf_drop": 100.0 - bleu_chrf([new], [first])["chrf"]}
        rows.append(row)

    def summary(kind: str, key: str) -> dict[str, float]:
        x = torch.tensor([r[kind][key] for r in rows], dtype=torch.float64)
        return {"mean": float(x.mean()), "std": float(x.std()) if len(x) > 1 else 0.0,
                "sem": float(x.std() / len(x) ** 0.5) if len(x) > 1 else 0.0}

    quality = bleu_chrf([r["translation"] for r in rows], [r["reference"] for r in rows]) if rows else {}
    wins = sum(r["most attended"]["edit_rate"] > r["random"]["edit_rate"] for r in rows)
    ties = sum(r["most attended"]["edit_rate"] == r["random"]["edit_rate"] for r in rows)
    return {"verses": len(rows), **{f"{kind}: {key}": summary(kind, key) for kind in ("most attended", "random")
                                    for key in ("edit_rate", "chrf_drop")},
            "most attended changes more (edit rate)": wins, "ties": ties, "examples": rows[:5],
            "greedy": {"bleu": quality.get("bleu"), "chrf": quality.get("chrf")}}
