"""Stopping a run cleanly on a signal: Ctrl-C, and the signals schedulers send before they kill.

SLURM, Kubernetes, systemd and `timeout` send SIGTERM before a SIGKILL (SLURM also SIGUSR1 with
`--signal=USR1@120`); a terminal sends SIGINT. While the training loop runs, the first of these
only asks it to stop (`StopRequest.signal`): the loop finishes its step, writes a checkpoint and
raises `TrainingInterrupted`; a second one stops at once (KeyboardInterrupt). Which signals do
this besides SIGINT is `train.stop_signals` (attnlab.training.config.RunConfig).

A process that ends this way exits with 128 + the signal's number (`exit_status`): 130 for
SIGINT, 143 for SIGTERM, 138 for SIGUSR1 (Linux numbering) — what a shell reports for a process
the signal killed, so a job script's `$?` reads the same whether the run stopped cleanly or not.

A signal the process ignores is left ignored (a background job of a script inherits SIGINT
ignored: the user chose that), and nothing is installed off the main thread, where Python
cannot set handlers.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")  # train.stop_signals may name these (SIGINT always)


class StopRequest:
    """What a handler records: the name of the first signal received while the loop ran (None: none)."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


def exit_status(name: str) -> int:
    """128 + the signal's number (`exit_status("SIGTERM") == 143` on Linux); 130 for an unknown name."""
    number = getattr(signal, name, None)
    return 128 + int(number) if number is not None else 130


def _notice(name: str) -> bytes:
    what = "Ctrl-C" if name == "SIGINT" else name
    return (f"\n{what}: finishing the current step, then saving a checkpoint (a second signal stops at "
            "once)\n").encode()


@contextmanager
def deferred_stop(names: tuple[str, ...] | list[str]) -> Iterator[StopRequest]:
    """While the block runs, the first of SIGINT and `names` sets the yielded request's `signal`;
    a second one raises KeyboardInterrupt at once. The previous handlers are put back after.

    Args:
        names: signal names besides SIGINT (from STOP_SIGNALS; names this platform lacks are skipped).
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum: int, frame: Any) -> None:
        if request.signal is not None:
            raise KeyboardInterrupt
        request.signal = signal.Signals(signum).name
        try:  # os.write, not print: a handler that prints while the loop prints raises (reentrant call)
            os.write(2, _notice(request.signal))
        except OSError:
            pass

    previous: dict[int, Any] = {}
    for name in ("SIGINT", *names):
        number = getattr(signal, name, None)
        if number is None or number in previous:
            continue
        before = signal.getsignal(number)
        if before is signal.SIG_IGN:  # ignored by choice (nohup, a script's background job): left so
            continue
        previous[number] = before
        signal.signal(number, handler)
    try:
        yield request
    finally:
        for number, before in previous.items():
            if before is None:  # set from outside Python: the closest is the default
                before = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
            signal.signal(number, before)
