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
them up). What is swapped in gets the permissions of a plain `open()` / `mkdir` under the
user's umask (`mkstemp`/`mkdtemp` make them private, 0600/0700, which other users then could
not read).

Reading: `read_text` and `read_json` raise errors that name the file and what it should have
held (`FileFormatError`), never a bare UnicodeDecodeError.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class FileFormatError(ValueError):
    """A file that exists but does not hold what was expected (not UTF-8 text, not JSON, a
    truncated binary); `path` and `expected` say which file and what it should have held."""

    def __init__(self, path: str | os.PathLike, expected: str, detail: str = ""):
        self.path, self.expected = Path(path), expected
        super().__init__(f"{path}: expected {expected}" + (f" ({detail})" if detail else ""))


def umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux's
    /proc/self/status; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_if_created(path: Path, folder: bool) -> None:
    """Give a temporary (mode 0600/0700) the mode a plain `open()`/`mkdir` would have given
    it: 0666/0777 less the umask."""
    os.chmod(path, (0o777 if folder else 0o666) & ~umask())


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
        _as_if_created(tmp, folder=False)
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
        _as_if_created(tmp, folder=True)
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


def read_text(path: str | os.PathLike, *, expected: str = "UTF-8 text") -> str:
    """The UTF-8 text of a file (`\r\n` read as `\n`).

    Args:
        expected: what the file should hold, for the error message ("a JSON config").

    Raises:
        FileNotFoundError, IsADirectoryError, PermissionError: as `open` (with the file name).
        FileFormatError: not UTF-8 (the message names the file and the first bad byte).
    """
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise FileFormatError(path, expected, f"byte 0x{err.object[err.start]:02x} at offset {err.start} is not "
                                              "UTF-8") from None


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from a file.

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: a folder where the file should be.
        FileFormatError (a ValueError): not UTF-8, not JSON, or not an object (the message
            names the file).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, expected a JSON file", str(path))
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    text = read_text(path, expected="a JSON object")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise FileFormatError(path, "a JSON object", f"is not valid JSON: {err.msg} at line {err.lineno} column "
                                                     f"{err.colno}") from None
    if not isinstance(data, dict):
        raise FileFormatError(path, "a JSON object", f"got a JSON {type(data).__name__}")
    return data
