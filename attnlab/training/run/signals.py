"""Stopping a run cleanly on a signal: Ctrl-C, and the signals schedulers send before they kill.

SLURM, Kubernetes, systemd and `timeout` send SIGTERM before a SIGKILL (SLURM also SIGUSR1 with
`--signal=USR1@120`); a terminal sends SIGINT. While the training loop runs, the first of these
only asks it to stop (`StopRequest.signal`): the loop finishes its step, writes a checkpoint and
raises `TrainingInterrupted`. Which signals do this besides SIGINT is `train.stop_signals`
(attnlab.training.config.RunConfig).

A second Ctrl-C stops at once (KeyboardInterrupt). A repeat of a scheduler's signal does not:
one signal often arrives twice — SLURM signals every process of a job step, and torchrun
forwards what it receives to its workers — and the scheduler's SIGKILL ends a run that takes too
long anyway. For the same reason a Ctrl-C repeated within `REPEAT_S` of the first (a terminal
signals the whole process group, torchrun included, which forwards it again) counts as one.

A process that ends this way exits with 128 + the signal's number (`exit_status`): 130 for
SIGINT, 143 for SIGTERM, 138 for SIGUSR1 (Linux numbering) — what a shell reports for a process
the signal killed, so a job script's `$?` reads the same whether the run stopped cleanly or not.

A signal the process ignores is left ignored (a background job of a script inherits SIGINT
ignored: the user chose that), and nothing is installed off the main thread, where Python
cannot set handlers.
"""

from __future__ import annotations

import os
from pathlib import Path
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")  # train.stop_signals may name these (SIGINT always)
REPEAT_S = 1.0  # a Ctrl-C this soon after the first is the same one, delivered twice


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
    if name == "SIGINT":
        return b"\nCtrl-C: finishing the current step, then saving a checkpoint (Ctrl-C again stops at once)\n"
    return f"\n{name}: finishing the current step, then saving a checkpoint and stopping\n".encode()


@contextmanager
def deferred_stop(names: tuple[str, ...] | list[str]) -> Iterator[StopRequest]:
    """While the block runs, the first of SIGINT and `names` sets the yielded request's `signal`;
    a second Ctrl-C (after REPEAT_S) raises KeyboardInterrupt at once, other repeats are let be.
    The previous handlers are put back after.

    Args:
        names: signal names besides SIGINT (from STOP_SIGNALS; names this platform lacks are skipped).
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    first_at = [0.0]

    def handler(signum: int, frame: Any) -> None:
        if request.signal is not None:
            if signum == signal.SIGINT and time.monotonic() - first_at[0] >= REPEAT_S:
                raise KeyboardInterrupt
            return  # the same signal again (a launcher's copy), or a scheduler's: the checkpoint goes on
        request.signal, first_at[0] = signal.Signals(signum).name, time.monotonic()
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


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a stop signal, see the module docstring) stopped `Trainer.fit`. `checkpoint`: where a
    resume goes on from (None: from step 0); `saved`: written at the interruption (else an
    earlier checkpoint, the run's latest); `signal`: its name; `exit_status`: 128 + its number."""

    def __init__(self, out: Path, step: int, checkpoint: Path | None, saved: bool, signal: str = "SIGINT"):
        self.out, self.step, self.checkpoint, self.saved, self.signal = out, step, checkpoint, saved, signal
        what = "interrupted" if signal == "SIGINT" else f"stopped by {signal}"
        if saved:
            text = f"{what} after step {step}; checkpoint saved: {checkpoint}"
        elif checkpoint is not None:
            text = f"{what} at step {step} (stopped at once, nothing saved); a resume goes on from {checkpoint}"
        else:
            text = f"{what} at step {step}, before the first checkpoint; a resume starts from step 0"
        super().__init__(text)

    @property
    def exit_status(self) -> int:
        return exit_status(self.signal)
