"""Writing files and folders so that a crash never leaves half of one; reading JSON with errors
that name the file.

One mechanism for both: write into a temporary sibling (same folder, hence same file system),
then `os.replace` it into place. A rename within a file system is atomic, so a reader sees the
old file or the new one, never a mix; on any error the temporary is removed and the target is
left as it was.

    atomic_write_text(path, text)                  # also atomic_write_bytes / atomic_write_json
    with atomic_file("plot.png") as tmp:           # any writer that takes a path
        fig.savefig(tmp, format="png")
    with atomic_folder("run/model") as tmp:        # a folder of files, swapped in when complete
        (tmp / "config.json").write_text(...)

Temporaries are named `.tmp-<name>-<random>` beside the target, so a crash that kills the
process before its cleanup leaves a hidden file that `.tmp-*` globs find (checkpoints clean
them up).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends without an error it replaces
    `path`, otherwise it is removed and `path` keeps its old content (or stays absent).

    Raises:
        ValueError: `path` is a folder.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"path: {str(path)!r} is a folder; give a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically (see `atomic_file`); returns the path."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` as UTF-8 with `\\n` line ends to `path` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 2) -> Path:
    """Write `data` as JSON (UTF-8, a final newline) to `path` atomically; returns the path."""
    return atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; when the block ends without an error it
    is swapped in as `target`.

    An existing `target` is replaced only if it is ours: every entry in it is one the new
    folder holds too (the files attnlab writes are the marker, so an earlier save, checkpoint
    or cache entry is replaced, and an empty folder too). Anything else (a folder holding a
    file the new one would not rewrite) is refused and never deleted. The swap is two renames
    (old aside, new in) and then the old folder is deleted; a crash between the renames leaves
    the old folder whole as `.old-<name>-<random>` beside the target. On any error the
    temporary folder is removed and `target` is untouched.

    Raises:
        ValueError: `target` is a file, or a folder that is not ours (the message names it and
            what in it would be lost).
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"path: {str(target)!r} exists and is a file; give a folder path")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".tmp-{target.name}-"))
    try:
        yield tmp
        if target.is_dir():
            foreign = sorted({p.name for p in target.iterdir()} - {p.name for p in tmp.iterdir()})
            if foreign:
                raise ValueError(f"path: {str(target)!r} is a folder attnlab did not write (it holds "
                                 f"{', '.join(foreign[:5])}, which this write would not replace); refusing to "
                                 "replace it: give another path or remove the folder yourself")
            old = target.parent / f".old-{target.name}-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from a file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or not an object (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, got {type(data).__name__}")
    return data
