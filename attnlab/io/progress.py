"""The one progress printer (tokenizer training, tokenisation, fine-tuning, translation): one
status line with a rate and an ETA, redrawn in place on a terminal and printed every few
seconds otherwise (logs stay readable).

    bar = Progress(total=1000, unit="tok", desc="tokenise")
    for chunk in chunks:
        bar.update(len(chunk))
    bar.close()
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_seconds(seconds: float) -> str:
    """`75.2` -> `'1m15s'`; `3725` -> `'1h02m'`."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_count(n: float) -> str:
    """`1234567` -> `'1.23M'`."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


class Progress:
    """Counts work done against an optional total and prints rate and ETA.

    Args:
        total: work expected (None = unknown: no percentage, no ETA).
        unit: what is counted (shown after the rate, e.g. ``tok/s``).
        desc: a short label at the start of the line.
        stream: where to print (stderr by default).
        min_interval: least seconds between two redraws (non-terminals print at most every
            `10 * min_interval` seconds).
        enabled: False prints nothing.
    """

    def __init__(self, total: float | None = None, *, unit: str = "it", desc: str = "", stream: TextIO | None = None,
                 min_interval: float = 0.5, enabled: bool = True):
        self.total, self.unit, self.desc = total, unit, desc
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = min_interval if self.tty else 10 * min_interval
        self.count = 0.0
        self.start = self._last = time.perf_counter()
        self.extra = ""

    def update(self, n: float = 1, extra: str | None = None) -> None:
        """Add `n` to the count; `extra` replaces the free text at the end of the line."""
        self.count += n
        if extra is not None:
            self.extra = extra
        now = time.perf_counter()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            self._draw(final=False)

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = self.count / elapsed
        parts = [self.desc] if self.desc else []
        if self.total:
            parts.append(f"{100 * self.count / self.total:5.1f}% {format_count(self.count)}/{format_count(self.total)}")
        else:
            parts.append(format_count(self.count))
        parts.append(f"{format_count(rate)} {self.unit}/s")
        parts.append(f"{format_seconds(elapsed)} elapsed")
        if self.total and rate > 0:
            parts.append(f"ETA {format_seconds((self.total - self.count) / rate)}")
        if self.extra:
            parts.append(self.extra)
        return " | ".join(parts)

    def _draw(self, final: bool) -> None:
        text = self.line()
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, extra: str | None = None) -> None:
        """Print the final line (`extra` replaces the free text at its end)."""
        if extra is not None:
            self.extra = extra
        if self.enabled:
            self._draw(final=True)
