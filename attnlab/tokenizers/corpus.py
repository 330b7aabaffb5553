"""Reading a training corpus, counting its words, and showing progress.

``texts_or_files`` (what ``Tokenizer.train`` takes) is either

- one path (a ``str`` or ``os.PathLike``) to a text file,
- an iterable of ``os.PathLike`` paths (``pathlib.Path``) to text files, or
- an iterable of strings, each a piece of training text.

Strings inside an iterable are always text, never paths: wrap file names in ``pathlib.Path``.
Files are read as UTF-8, line by line with the line ends kept, and each line is one sequence
(as Hugging Face's trainers read files).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO

from attnlab.tokenizers.special import SpecialSplitter

TextsOrFiles = str | os.PathLike | Iterable[str | os.PathLike]


def iter_sequences(texts_or_files: TextsOrFiles) -> Iterator[str]:
    """Yield training sequences (texts, or the lines of files).

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
                yield from handle
        else:
            raise ValueError(
                f"texts_or_files: items must be strings (text) or pathlib.Path (files), got {type(item).__name__}"
            )


class Progress:
    """A one-line progress report on stderr, refreshed at most ten times a second.

    Args:
        label: what is being counted ("read", "merges", ...).
        total: the count at completion, when known.
        enabled: ``False`` makes every call a no-op.
        stream: where to write (stderr by default).
    """

    def __init__(self, label: str, total: int | None = None, enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.start = self._last = time.monotonic()

    def update(self, count: int, note: str = "") -> None:
        """Set the count; redraw the line if enough time passed."""
        self.count = count
        now = time.monotonic()
        if self.enabled and now - self._last >= 0.1:
            self._last = now
            self._draw(note)

    def close(self, note: str = "") -> None:
        """Draw the final line and end it."""
        if self.enabled:
            self._draw(note)
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, note: str) -> None:
        elapsed = time.monotonic() - self.start
        of = f"/{self.total}" if self.total else ""
        self.stream.write(f"\r{self.label}: {self.count}{of} {note} [{elapsed:.1f}s]")
        self.stream.flush()


def count_words(
    texts_or_files: TextsOrFiles,
    split: Callable[[str], Iterable[str]],
    special_tokens: Iterable[str] = (),
    show_progress: bool = False,
) -> Counter[str]:
    """Count the words ``split`` makes of every sequence, leaving special tokens out.

    Example:
        >>> count_words(["a b a", "b"], str.split)
        Counter({'a': 2, 'b': 2})
    """
    splitter = SpecialSplitter(special_tokens)
    counts: Counter[str] = Counter()
    progress = Progress("reading corpus", enabled=show_progress)
    chars = 0
    for n, sequence in enumerate(iter_sequences(texts_or_files), 1):
        for segment, is_special in splitter.split(sequence):
            if not is_special:
                counts.update(split(segment))
        chars += len(sequence)
        progress.update(n, f"sequences, {chars / 1e6:.1f}M characters, {len(counts)} distinct words")
    progress.close(f"sequences, {chars / 1e6:.1f}M characters, {len(counts)} distinct words")
    return counts
