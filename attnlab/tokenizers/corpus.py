"""Reading a training corpus and counting its words.

``texts_or_files`` (what ``Tokenizer.train`` takes) is either

- one path (a ``str`` or ``os.PathLike``) to a text file,
- an iterable of ``os.PathLike`` paths (``pathlib.Path``) to text files, or
- an iterable of strings, each a piece of training text.

Strings inside an iterable are always text, never paths: wrap file names in ``pathlib.Path``.
Files are read as UTF-8, line by line with the line ends kept, and each line is one sequence
(as Hugging Face's trainers read files).

Counting streams: files are read a chunk of lines at a time (``chunk_chars``), texts one at a
time, and only the distinct words and their counts are kept, so a corpus larger than memory
trains as long as its vocabulary of words fits (``tests/tokenizers/test_corpus.py`` checks the
memory bound).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from attnlab.io.progress import Progress
from attnlab.tokenizers.special import SpecialSplitter

TextsOrFiles = str | os.PathLike | Iterable[str | os.PathLike]

CHUNK_CHARS = 1 << 20  # characters of a file read at once (whole lines; a longer line is read whole)
FLUSH_WORDS = 1 << 16  # words split off before they are counted together


def iter_sequences(texts_or_files: TextsOrFiles, chunk_chars: int | None = None) -> Iterator[str]:
    """Yield training sequences (texts, or the lines of files, read about ``chunk_chars``
    characters of whole lines at a time; ``CHUNK_CHARS`` by default).

    Raises:
        ValueError: a path that is not a file; an item that is neither text nor a path.
        TypeError: if ``texts_or_files`` is not a path or an iterable.
    """
    if isinstance(texts_or_files, (str, os.PathLike)):
        texts_or_files = [Path(texts_or_files)]
    elif isinstance(texts_or_files, bytes) or not isinstance(texts_or_files, Iterable):
        raise TypeError(
            "texts_or_files must be a path, an iterable of strings, or an iterable of paths; "
            f"got {type(texts_or_files).__name__}"
        )
    for item in texts_or_files:
        if isinstance(item, str):
            yield item
        elif isinstance(item, os.PathLike):
            path = Path(item)
            if not path.is_file():
                raise ValueError(f"texts_or_files: {str(path)!r} is not a file")
            with open(path, encoding="utf-8", newline="") as handle:
                while lines := handle.readlines(chunk_chars or CHUNK_CHARS):
                    yield from lines
        else:
            raise ValueError(
                f"texts_or_files: items must be strings (text) or pathlib.Path (files), got {type(item).__name__}"
            )


def describe_corpus(texts_or_files: TextsOrFiles) -> str:
    """How a message names a corpus: its file(s) (`'a.txt'`, `'a.txt', 'b.txt'`), else
    `texts_or_files (the texts given)`."""
    if isinstance(texts_or_files, (str, os.PathLike)):
        return repr(str(texts_or_files))
    items = list(texts_or_files)[:4] if isinstance(texts_or_files, (list, tuple)) else []
    if items and all(isinstance(item, os.PathLike) for item in items):
        more = len(texts_or_files) - 3
        return ", ".join(repr(str(item)) for item in items[:3]) + (f" and {more} more" if more > 0 else "")
    return "texts_or_files (the texts given)"


def check_has_text(counts: Iterable[str], texts_or_files: TextsOrFiles, kind: str) -> None:
    """Refuse a corpus with nothing but whitespace: a tokenizer trained on it would be saved
    holding its special tokens (and bytes, or a space) only, and fail nowhere near the cause.

    Args:
        counts: what was counted from the corpus (its words, pieces or characters).

    Raises:
        ValueError: naming the corpus (`describe_corpus`).
    """
    if not any(str(word).strip() for word in counts):
        raise ValueError(f"{describe_corpus(texts_or_files)}: no text (empty, or whitespace only); nothing to train "
                         f"a {kind} tokenizer on")


def count_words(
    texts_or_files: TextsOrFiles,
    split: Callable[[str], Iterable[str]],
    special_tokens: Iterable[str] = (),
    show_progress: bool = False,
) -> Counter[str]:
    """Count the words ``split`` makes of every sequence, leaving special tokens out.

    Words are gathered into a list and counted ``FLUSH_WORDS`` at a time (one C-level pass of
    ``Counter.update`` instead of one call per sequence).

    Example:
        >>> count_words(["a b a", "b"], str.split)
        Counter({'a': 2, 'b': 2})
    """
    splitter = SpecialSplitter(special_tokens)
    counts: Counter[str] = Counter()
    progress = Progress(unit="seq", desc="reading corpus", enabled=show_progress)
    pending: list[str] = []
    chars = sequences = 0
    for sequence in iter_sequences(texts_or_files):
        for segment, is_special in splitter.split(sequence):
            if not is_special:
                pending.extend(split(segment))
        chars += len(sequence)
        sequences += 1
        if len(pending) >= FLUSH_WORDS:
            counts.update(pending)
            pending.clear()
            progress.update(sequences - progress.count, f"{chars / 1e6:.1f}M characters, {len(counts)} distinct words")
    counts.update(pending)
    progress.update(sequences - progress.count)
    progress.close(f"{chars / 1e6:.1f}M characters, {len(counts)} distinct words")
    return counts
