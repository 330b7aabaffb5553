"""Words, characters or sub-words? Three tokenizers trained on one corpus, measured on its
held-out text: how many tokens a line takes, how much of the new text is unknown, how large the
vocabulary (the model's embedding table) is.

    python examples/tokenizer_comparison.py                        # shakespeare: 37 plays vs The Tempest
    python examples/tokenizer_comparison.py --word-vocab 4000 --bpe-vocab 1000 8000

Each tokenizer is trained on the corpus's train.txt and measured on the lines of valid.txt
(blank lines and the form feeds between documents left out). Prints a Markdown table: the
README's "Words, characters or sub-words" table is its output. Training the BPE tokenizers takes
a few minutes on one core.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from attnlab.data import corpora
from attnlab.tokenizers import Tokenizer


@dataclass
class Row:
    label: str
    vocab_size: int
    tokens_per_line: float
    chars_per_token: float
    unknown_rate: float
    seconds: float


def read_lines(path: Path) -> list[str]:
    """The text lines of a corpus file: no line ends, no blank lines, no document separators."""
    with open(path, encoding="utf-8") as handle:
        return [line for line in (raw.rstrip("\n") for raw in handle) if line.strip() and line != "\f"]


def measure(label: str, tok: Tokenizer, lines: list[str], seconds: float) -> Row:
    """Mean tokens per line, characters per token and the share of unknown tokens on `lines`."""
    encoded = tok.encode_batch(lines)
    tokens = sum(map(len, encoded))
    unk = tok.unk_token_id
    unknown = sum(row.count(unk) for row in encoded) if unk is not None else 0
    return Row(label, tok.vocab_size, tokens / len(lines), sum(map(len, lines)) / tokens, unknown / tokens, seconds)


def compare(corpus: str, word_vocabs: list[int | None], bpe_vocabs: list[int]) -> list[Row]:
    folder = corpora.fetch(corpus)
    train, valid = read_lines(folder / "train.txt"), read_lines(folder / "valid.txt")
    settings = [("word", size) for size in word_vocabs] + [("char", None)] + [("bpe", size) for size in bpe_vocabs]
    rows = []
    for kind, size in settings:
        start = time.perf_counter()
        tok = Tokenizer.train(train, kind=kind, vocab_size=size)
        label = f"{kind} ({'every one seen' if size is None else f'vocab_size={size}'})"
        rows.append(measure(label, tok, valid, time.perf_counter() - start))
        print(f"trained {label} in {rows[-1].seconds:.0f} s", flush=True)
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| tokenizer | vocabulary | tokens per line | characters per token | unknown tokens |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.label} | {r.vocab_size:,} | {r.tokens_per_line:.1f} | {r.chars_per_token:.2f} | "
                     f"{100 * r.unknown_rate:.2f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="shakespeare", help="a built-in text corpus (default: shakespeare)")
    parser.add_argument("--word-vocab", type=int, nargs="*", default=[8000],
                        help="word vocabulary sizes (default: 8000); every word seen is also measured")
    parser.add_argument("--bpe-vocab", type=int, nargs="*", default=[1000, 8000],
                        help="BPE vocabulary sizes (default: 1000 8000)")
    args = parser.parse_args()
    rows = compare(args.corpus, [*args.word_vocab, None], args.bpe_vocab)
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
