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

Temporaries are named `.tmp-<name>-<pid>-<host>-<random>` beside the target (`<host>`: a
short hash of the host name). A process killed before its cleanup (SIGKILL, power loss)
leaves one behind; the next write of the same target removes it (`remove_stale`) once its
writer no longer runs, and never one whose writer still does, on this host or another. What
is swapped in gets the permissions of a plain `open()` / `mkdir` under the user's umask
(`mkstemp`/`mkdtemp` make them private, 0600/0700, which other users then could not read).

An OSError inside a writer (a full disk, an I/O error) names the file being written, not its
temporary, which is gone by the time anyone reads the message: `run/model/model.safetensors:
no space left on device`. `append_line` adds a line to a log file (metrics.jsonl) the same
way: whole or not at all.

JSON is written strict (RFC 8259 has no NaN or Infinity, which Python's `json` writes by
default and most other readers refuse): `json_text` writes a NaN or infinite number as null,
and every JSON file attnlab writes goes through it.

Reading: `read_text` and `read_json` raise errors that name the file and what it should have
held (`FileFormatError`), never a bare UnicodeDecodeError.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import math
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnlab.io.lock import pid_alive


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


def as_if_created(path: str | os.PathLike, *, folder: bool = False) -> None:
    """Give a file or folder that a library made private (mkstemp's 0600, mkdtemp's 0700) the
    mode a plain `open()`/`mkdir` would have given it: 0666/0777 less the umask."""
    os.chmod(path, (0o777 if folder else 0o666) & ~umask())


# ---------------------------------------------------------------- temporaries and their writers

_TMP, _OLD = ".tmp-", ".old-"  # a write in progress; a folder set aside during a swap


@functools.lru_cache(maxsize=1)
def _host_tag() -> str:
    """8 hex digits of the host name: which machine a temporary's writer runs on (a run folder
    may sit on a file system that several machines share)."""
    return hashlib.sha256(socket.gethostname().encode("utf-8")).hexdigest()[:8]


def _prefix(kind: str, target: Path) -> str:
    """`.tmp-<name>-<pid>-<host>-`: what the name of this process's temporary of `target` starts with."""
    return f"{kind}{target.name}-{os.getpid()}-{_host_tag()}-"


def _stale(entry: Path, kind: str, target: Path) -> bool:
    """Whether `entry` is a temporary of `target` whose writer is gone: its name carries a PID
    of this host that no longer runs. A live writer's, another host's (which cannot be judged
    from here) and one named otherwise (an older attnlab's, or another target's) are not."""
    rest = entry.name[len(f"{kind}{target.name}-"):].split("-")
    if len(rest) != 3 or not rest[0].isdigit() or rest[1] != _host_tag():
        return False
    return not pid_alive(int(rest[0]))


def remove_stale(target: str | os.PathLike) -> list[Path]:
    """Remove what killed writers of `target` left beside it: `.tmp-<name>-*` temporaries, and
    `.old-<name>-*` folders set aside during a swap once `target` exists again (while it is
    missing, such a folder holds the only copy of its last content), of writers that no longer
    run (see `_stale`). Every atomic writer calls it; a caller that holds a lock over a whole
    folder (a run's checkpoints) may sweep more itself.

    Returns:
        the entries removed.
    """
    target = Path(target)
    removed = []
    for kind in (_TMP, _OLD) if target.exists() else (_TMP,):
        try:
            entries = [e for e in target.parent.iterdir() if e.name.startswith(f"{kind}{target.name}-")]
        except OSError:  # no folder yet (nothing to remove) or one we cannot list
            continue
        for entry in entries:
            if _stale(entry, kind, target):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


# what a write() raises without a file name: the disk full, over quota, a file too large, the
# disk failing, the file system read-only
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


def _naming_target(err: OSError, tmp: Path, target: Path) -> OSError:
    """`err` as it should reach a user: naming the file being written (`target`, or the file
    inside it) where it named the temporary, or no file at all when it is a storage error (a
    failed `write()` of a buffered file names none). Other errors (a connection reset while a
    download is written), and errors of other classes than Python's own OSErrors, come back as
    they are."""
    if type(err).__module__ != "builtins" or (err.filename is None and err.errno not in _STORAGE_ERRNOS):
        return err

    def mapped(name: Any) -> str | None:
        if name is None:
            return None
        try:
            inside = Path(os.fsdecode(name)).relative_to(tmp)
        except (TypeError, ValueError):
            return name
        return str(target / inside) if inside.parts else str(target)

    first = mapped(err.filename) if err.filename is not None else str(target)
    second = mapped(err.filename2)
    second = None if second == first else second
    if (first, second) == (err.filename, err.filename2):
        return err
    strerror = err.strerror or str(err)
    return type(err)(err.errno, strerror, first, None, second) if err.errno is not None else \
        type(err)(None, strerror, first)


@contextlib.contextmanager
def _errors_naming(tmp: Path, target: Path) -> Iterator[None]:
    """Re-raise an OSError of the block naming `target` rather than `tmp` (`_naming_target`)."""
    try:
        yield
    except OSError as err:
        named = _naming_target(err, tmp, target)
        if named is err:
            raise
        raise named from err


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends without an error it replaces
    `path`, otherwise it is removed and `path` keeps its old content (or stays absent).

    Raises:
        ValueError: `path` is a folder.
        OSError: writing failed (a full disk ...): the error names `path`.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"path: {str(path)!r} is a folder; give a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=_prefix(_TMP, path))
    os.close(fd)
    tmp = Path(name)
    try:
        with _errors_naming(tmp, path):
            as_if_created(tmp)
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
    """Write `data` as strict JSON (`json_text`: NaN and infinities as null; UTF-8, a final
    newline) to `path` atomically; returns the path."""
    return atomic_write_text(path, json_text(data, indent=indent, ensure_ascii=False) + "\n")


def json_text(data: Any, **kwargs: Any) -> str:
    """`json.dumps(data, **kwargs)`, strict: a float that is NaN or infinite (a skipped step's
    loss, a perplexity that overflowed) is written as null, which every JSON reader takes;
    Python's own `NaN` / `Infinity` are not JSON, and most readers other than Python's refuse
    the file. Readers of attnlab's files take null where a number is missing.

        json_text({"loss": float("nan"), "step": 3})   # '{"loss": null, "step": 3}'
    """
    return json.dumps(_finite(data), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    """`value` with every non-finite float inside it (dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append `line` and a newline to the text file `path` (created if missing), whole or not at
    all: when the write fails (a full disk) the file is cut back to where it ended, so that a
    reader never meets half a line.

    Raises:
        OSError: the write failed; the error names `path`.
    """
    path = Path(path)
    rest = memoryview((line + "\n").encode("utf-8"))
    with path.open("ab", buffering=0) as f:  # unbuffered: nothing left in a buffer for close() to write later
        end = f.seek(0, os.SEEK_END)
        with _errors_naming(path, path):
            try:
                while rest:
                    rest = rest[f.write(rest):]
            except OSError:
                with contextlib.suppress(OSError):
                    f.truncate(end)
                raise


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; when the block ends without an error it
    is swapped in as `target`.

    An existing `target` is replaced only if it is ours: every entry in it is one the new
    folder holds too (the files attnlab writes are the marker, so an earlier save, checkpoint
    or cache entry is replaced, and an empty folder too). Anything else (a folder holding a
    file the new one would not rewrite) is refused and never deleted. The swap is two renames
    (old aside, new in) and then the old folder is deleted; a crash between the renames leaves
    the old folder whole as `.old-<name>-<pid>-<host>-<random>` beside the target (removed by the
    next write of `target` once it completes). On any error the temporary folder is removed and
    `target` is untouched.

    Raises:
        ValueError: `target` is a file, or a folder that is not ours (the message names it and
            what in it would be lost).
        OSError: writing failed (a full disk ...): the error names the file inside `target`.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"path: {str(target)!r} exists and is a file; give a folder path")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=_prefix(_TMP, target)))
    try:
        with _errors_naming(tmp, target):
            as_if_created(tmp, folder=True)
            yield tmp
            _swap_in(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, target: Path) -> None:
    """Put the complete folder `tmp` in place of `target` (see `atomic_folder`)."""
    if target.is_dir():
        foreign = sorted({p.name for p in target.iterdir()} - {p.name for p in tmp.iterdir()})
        if foreign:
            raise ValueError(f"path: {str(target)!r} is a folder attnlab did not write (it holds "
                             f"{', '.join(foreign[:5])}, which this write would not replace); refusing to "
                             "replace it: give another path or remove the folder yourself")
        old = target.parent / f"{_prefix(_OLD, target)}{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
    remove_stale(target)  # a folder an earlier, killed swap set aside: `target` is whole again


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
