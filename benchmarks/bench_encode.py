"""Encoding speed: attnlab's byte-level BPE against Hugging Face `tokenizers` on the same
tokenizer.json, on three kinds of real text, one thread each, as JSON.

- English prose: `debian-text` (package descriptions);
- code: the Python standard library's own sources (the `.py` files beside `os.py` of the
  interpreter that runs this);
- Japanese: `debian-text-ja` (the same descriptions in Japanese, no spaces between words: the
  byte-level pre-tokenizer cuts long pieces that rarely repeat, so attnlab's per-piece cache,
  which carries it on English, helps less).

For each text: a byte-level BPE of --vocab tokens (GPT-2's pre-tokenizer, no lowercasing) is
trained by attnlab on the first --train-mb million characters (at most 80% of the text), saved as
tokenizer.json and loaded by both sides (HF: `Tokenizer.from_file`); then the next --encode-mb
million characters, as documents, are encoded by each (attnlab: `Tokenizer.encode` per document; HF:
`encode_batch(..., add_special_tokens=False)` with RAYON_NUM_THREADS=1; each side loads a fresh
tokenizer every round, outside the timing, so that both start with an empty word cache), in turns for --rounds rounds (A B, B A, ...). Every document's
ids must be identical (`identical`). Reported: median seconds, characters per second, the ratio
attnlab / HF of speed (`speedup`, > 1: attnlab faster), the load average.

    python benchmarks/bench_encode.py                      # the three texts, 3 rounds
    python benchmarks/bench_encode.py --texts japanese --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before `tokenizers` is imported: one thread, as attnlab

import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from machine import loadavg  # noqa: E402

TEXTS = ("english", "code", "japanese")


def documents(kind: str) -> list[str]:
    """The documents of one kind of text, in a fixed order."""
    if kind == "code":
        lib = Path(os.__file__).resolve().parent
        return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py"))]
    from attnlab.data.corpora import DOC_SEPARATOR, fetch

    corpus = {"english": "debian-text", "japanese": "debian-text-ja"}[kind]
    return (fetch(corpus) / "train.txt").read_text(encoding="utf-8").split(DOC_SEPARATOR)


def take(docs: list[str], start_chars: int, chars: int) -> list[str]:
    """The documents after the first `start_chars` characters, until `chars` more are taken."""
    out, seen = [], 0
    for doc in docs:
        if seen >= start_chars + chars:
            break
        if seen >= start_chars:
            out.append(doc)
        seen += len(doc)
    return out


def measure(kind: str, vocab: int, train_mb: float, encode_mb: float, rounds: int, work: Path) -> dict:
    from tokenizers import Tokenizer as HFTokenizer

    from attnlab.tokenizers import Tokenizer

    docs = documents(kind)
    train_docs = take(docs, 0, min(int(train_mb * 1e6), int(0.8 * sum(map(len, docs)))))
    test = take(docs, sum(map(len, train_docs)), int(encode_mb * 1e6))
    if not test:
        raise SystemExit(f"{kind}: nothing left to encode after the training text")
    path = Tokenizer.train(train_docs, kind="bpe", vocab_size=vocab, lowercase=False).save(work / f"{kind}.json")
    hf = HFTokenizer.from_file(str(path))
    ours_ids = [Tokenizer.load(path).encode(doc) for doc in test]
    theirs_ids = [e.ids for e in hf.encode_batch(test, add_special_tokens=False)]
    times: dict[str, list[float]] = {"attnlab": [], "hf": []}
    for r in range(rounds):
        for side in ("attnlab", "hf") if r % 2 == 0 else ("hf", "attnlab"):
            if side == "attnlab":
                tok = Tokenizer.load(path)  # an empty piece cache every round
                t = time.perf_counter()
                for doc in test:
                    tok.encode(doc)
            else:
                fresh = HFTokenizer.from_file(str(path))  # its word cache empty too
                t = time.perf_counter()
                fresh.encode_batch(test, add_special_tokens=False)
            times[side].append(time.perf_counter() - t)
    chars = sum(map(len, test))
    med = {side: statistics.median(ts) for side, ts in times.items()}
    return {"text": kind, "documents": len(test), "characters": chars, "bytes": sum(len(d.encode()) for d in test),
            "tokens": sum(map(len, ours_ids)), "vocab_size": vocab, "identical": ours_ids == theirs_ids,
            "attnlab_seconds": med["attnlab"], "hf_seconds": med["hf"],
            "attnlab_chars_per_s": chars / med["attnlab"], "hf_chars_per_s": chars / med["hf"],
            "speedup": med["hf"] / med["attnlab"], "rounds": {s: [round(t, 4) for t in ts] for s, ts in times.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", nargs="+", choices=TEXTS, default=list(TEXTS))
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--train-mb", type=float, default=1.0, help="characters (millions) the BPE is trained on")
    p.add_argument("--encode-mb", type=float, default=0.25, help="characters (millions) encoded, after those")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    report = {"benchmark": "encode", "threads": 1, "loadavg_before": loadavg(), "results": []}
    with tempfile.TemporaryDirectory() as work:
        for kind in args.texts:
            report["results"].append(measure(kind, args.vocab, args.train_mb, args.encode_mb, args.rounds,
                                             Path(work)))
            print(f"[encode] {kind}: done", file=sys.stderr, flush=True)
    report["loadavg_after"] = loadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
