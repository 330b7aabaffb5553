"""Small helpers shared across the package."""

from __future__ import annotations

import os
import tempfile


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so a crash leaves
    either the old file or the new one, never half of it."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def loadavg() -> str:
    """The 1-, 5- and 15-minute load averages ("0.52 0.61 0.70"), or "n/a" where /proc is
    missing: benchmarks record it beside their timings."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"
