"""One writer per folder: a lock file that says who is writing a run folder.

Two runs writing one folder corrupt each other (one deletes the other's temporary checkpoint
as stale, metrics interleave, the last config.json wins). A run therefore holds
`FOLDER/.attnlab.lock` while it writes there:

    with RunLock("runs/six"):                 # refuses (RunLockedError) if a live run holds it
        ...                                   # the file is removed on exit: normal, error, Ctrl-C

The file is created with O_CREAT | O_EXCL, so of two processes that race for a folder exactly
one wins, and it holds JSON naming the holder: PID, host, start time, command (and, on Linux,
the process's start tick, so a PID reused by another process is not taken for the holder).

A lock whose holder is gone (SIGKILL, power loss) is stale. On the same host that is decided
by asking the kernel whether the PID still runs; such a lock is taken over with a note. A lock
from another host (a shared file system) cannot be checked from here: it is refused with the
command that removes it, for the user to run once they know that run has ended.

Locks are re-entrant within a process: the command line holds the lock of a run folder while
it prepares the data, and the Trainer's `fit` takes the same lock again without refusing
itself. Two runs on one folder in one process are the caller's own business.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

LOCK_NAME = ".attnlab.lock"
_FRESH_S = 5.0  # an unreadable lock younger than this is being written by its holder right now

_held: dict[str, dict[str, Any]] = {}  # resolved folder -> {depth, token, made_folder} of the locks held here
_held_guard = threading.Lock()


class RunLockedError(RuntimeError):
    """The folder is held by another run (the message names it and says what to do)."""


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3 of stat(5)
    return int(fields[19]) if len(fields) > 19 else None


def pid_alive(pid: int, proc_start: int | None = None) -> bool:
    """Whether process `pid` runs on this host (and, given its recorded start tick, is the same
    process, not a later one that reuses the PID). Zombies count as ended."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
        if state[state.rfind(")") + 2:].startswith("Z"):
            return False
    except OSError:
        pass
    if proc_start is not None:
        now = _proc_start(pid)
        return now is None or now == proc_start
    return True


def read_lock(path: str | os.PathLike) -> dict[str, Any] | None:
    """The holder recorded in a lock file; None when it is missing, empty or not JSON."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def describe(holder: dict[str, Any]) -> str:
    """`PID 1234 on host h since 2024-05-01 12:00:00 (attnlab train run.json)`."""
    text = f"PID {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')}"
    return text + (f" ({holder['command']})" if holder.get("command") else "")


class RunLock:
    """The lock of one folder (module docstring). Use as a context manager, or `acquire()` /
    `release()`.

    Args:
        folder: the folder to hold (created if missing; removed on release when the lock made
            it and it is still empty, so a refused or failed start leaves nothing behind).
        command: what the holder runs, shown to a refused run (default: this process's argv).
        what: how refusals name the folder (e.g. `train.out_dir`).
        note: where the note about a taken-over stale lock goes (default: stderr).
    """

    def __init__(self, folder: str | os.PathLike, *, command: str | None = None, what: str = "folder",
                 note: Callable[[str], None] | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.command = command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self.what = what
        self.note = note or (lambda text: print(text, file=sys.stderr, flush=True))
        self._key = str(self.folder.resolve())
        self._holding = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> "RunLock":
        """Take the lock (a no-op when this object holds it already).

        Raises:
            RunLockedError: a live run holds the folder (same host), or a run on another host
                does; the message names the holder and how to proceed.
            ValueError: the folder path is a file.
        """
        if self._holding:
            return self
        with _held_guard:
            if self._key in _held:  # this process holds it already (re-entrant)
                _held[self._key]["depth"] += 1
                self._holding = True
                return self
            if self.folder.exists() and not self.folder.is_dir():
                raise ValueError(f"{self.what}={str(self.folder)!r} is a file; expected a folder")
            made_folder = not self.folder.exists()
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                for _ in range(5):  # each round: create, or judge the holder (and maybe take over)
                    token = self._create()
                    if token is not None:
                        _held[self._key] = {"depth": 1, "token": token, "made_folder": made_folder}
                        self._holding = True
                        return self
                    self._judge_holder()
                raise RunLockedError(f"{self.what}={str(self.folder)!r}: could not take {self.path} (other "
                                     "processes keep taking it); try again")
            except BaseException:
                if made_folder:
                    _remove_if_empty(self.folder)
                raise

    def release(self) -> None:
        """Give the lock back; the file goes when the last holder in this process releases it
        (and the folder too when the lock made it and it is still empty)."""
        if not self._holding:
            return
        self._holding = False
        with _held_guard:
            entry = _held.get(self._key)
            if entry is None:
                return
            entry["depth"] -= 1
            if entry["depth"] > 0:
                return
            del _held[self._key]
            holder = read_lock(self.path)
            if holder is not None and holder.get("token") == entry["token"]:  # never another run's lock
                self.path.unlink(missing_ok=True)
            if entry["made_folder"]:
                _remove_if_empty(self.folder)

    # ------------------------------------------------------------ internals
    def _record(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": self.command, "proc_start": _proc_start(os.getpid()), "token": uuid.uuid4().hex}

    def _create(self) -> str | None:
        """Create the lock file if none exists (atomically); its token when this process now holds it."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # less the umask, as open() gives
        except FileExistsError:
            return None
        record = self._record()
        try:
            os.write(fd, (json.dumps(record) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        return record["token"]

    def _judge_holder(self) -> None:
        """Refuse a live holder; take a stale lock away (so the next `_create` can win)."""
        holder = read_lock(self.path)
        if holder is None:
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return  # released meanwhile: try again
            if age < _FRESH_S:  # its holder is writing it now
                time.sleep(0.05)
                return
            self._take_over(None, "an unreadable lock file")
            return
        here = socket.gethostname()
        if holder.get("host") != here:
            raise RunLockedError(f"{self.what}={str(self.folder)!r} is held by {describe(holder)}; attnlab cannot "
                                 f"tell from host {here} whether that run still goes on. If it has ended, remove the "
                                 f"lock (rm {self.path}) and start again")
        pid = holder.get("pid")
        if isinstance(pid, int) and pid_alive(pid, holder.get("proc_start")):
            raise RunLockedError(f"{self.what}={str(self.folder)!r} is in use by another run: {describe(holder)}; "
                                 f"wait for it to end or choose another folder (if that PID is no attnlab run, "
                                 f"remove {self.path})")
        self._take_over(holder, f"the lock of {describe(holder)}, which no longer runs")

    def _take_over(self, stale: dict[str, Any] | None, what: str) -> None:
        """Move a stale lock aside and delete it, unless another process replaced it meanwhile
        (then it is put back, and the next round judges the new holder)."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another process took it away first
        moved = read_lock(aside)
        if (moved or {}).get("token") != (stale or {}).get("token"):
            try:  # we moved a fresh lock of another process: put it back where it was
                os.link(aside, self.path)  # (fails, rather than replace, if yet another lock is there)
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links
                os.replace(aside, self.path)
                return
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        self.note(f"note: {self.what}={str(self.folder)!r}: took over {what} ({self.path})")


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()  # only succeeds when empty
    except OSError:
        pass
