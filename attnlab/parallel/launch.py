"""Start N local processes joined in one process group, with a deadline (tests, benchmarks).

    results = spawn(fn, world_size=2, args=(x,), timeout_s=60)   # fn(ctx, x) on every rank

Each rank runs `fn(ctx, *args)` with a ParallelContext (gloo on CPU) and sends back its return
value or its traceback. The parent waits at most `timeout_s`; a rank still running then is
killed. Any failure raises `WorkerError` naming each rank's fate, so a bug cannot hang the caller.

Real runs go through torchrun: `attnlab train --nproc N` re-launches itself under it (`relaunch`),
on this machine or, with `--nnodes M --rdzv-endpoint HOST:PORT`, as one of M machines that meet
at HOST:PORT before their processes start (`Nodes`, `pop_launch`).
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


class WorkerError(RuntimeError):
    """One or more ranks failed, died or ran past the deadline.

    Attributes:
        reports: rank -> "ok", the traceback of its exception, or a line on how it ended.
    """

    def __init__(self, message: str, reports: dict[int, str]):
        super().__init__(message)
        self.reports = reports


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable, args: tuple, tp: int, pp: int, timeout_s: float,
            threads: int, results) -> None:
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    from attnlab.training.strategy.distributed import init_from_env, shutdown

    try:
        ctx = init_from_env(tp, pp=pp, backend="gloo", timeout_s=timeout_s)
        value = fn(ctx, *args)
        # plain pickle: tensors travel by value, not as shared memory that dies with this process
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 -- everything goes back to the parent
        results.put((rank, "error", traceback.format_exc()))
        results.close()
        results.join_thread()  # flush the message before leaving without cleanup
        os._exit(1)  # do not wait in destroy_process_group for peers that may be gone
    shutdown()


def spawn(fn: Callable[..., Any], world_size: int = 2, *, args: tuple = (), tp: int = 1, pp: int = 1,
          timeout_s: float = 60.0, collective_timeout_s: float = 30.0, threads: int = 1) -> list[Any]:
    """Run fn(ctx, *args) on `world_size` new processes and return their results by rank.

    Args:
        fn: a module-level function (it is pickled by reference for the spawn start method).
        world_size: processes to start.
        tp: tensor-parallel degree of the mesh.
        pp: pipeline-parallel degree of the mesh (dp: what tp and pp leave).
        timeout_s: deadline for the whole run; ranks still alive then are killed.
        collective_timeout_s: the process group's timeout for one collective.
        threads: torch threads per process.

    Returns:
        fn's return value on each rank, in rank order.

    Raises:
        ValueError: world_size < 1.
        WorkerError: a rank raised, died or passed the deadline (message names which and how).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [context.Process(target=_worker, args=(r, world_size, port, fn, args, tp, pp, collective_timeout_s,
                                                   threads, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    reports: dict[int, str] = {}
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(reports) < world_size and time.monotonic() < deadline:
        try:
            rank, status, value = results.get(timeout=0.1)
            reports[rank] = "ok" if status == "ok" else value
            if status == "ok":
                values[rank] = pickle.loads(value)
        except queue.Empty:
            for r, p in enumerate(procs):  # a rank that died without a word (killed, os._exit)
                if r not in reports and p.exitcode is not None and p.exitcode != 0:
                    time.sleep(0.2)  # its message may still be in flight
                    try:
                        while True:
                            rank, status, value = results.get_nowait()
                            reports[rank] = "ok" if status == "ok" else value
                            if status == "ok":
                                values[rank] = pickle.loads(value)
                    except queue.Empty:
                        pass
                    if r not in reports:
                        reports[r] = f"died with exit code {p.exitcode} without reporting"
    for r, p in enumerate(procs):
        if r not in reports:
            reports[r] = f"still running after the {timeout_s:g} s deadline (killed)"
        p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())) if p.is_alive() else None)
        if p.is_alive():
            p.kill()
            p.join()
    failed = {r: text for r, text in sorted(reports.items()) if text != "ok"}
    if failed:
        lines = [f"rank {r}: {text.strip().splitlines()[-1] if text.strip() else text}" for r, text in failed.items()]
        raise WorkerError(f"{len(failed)} of {world_size} ranks failed:\n" + "\n".join(lines), reports)
    return [values[r] for r in range(world_size)]


LAUNCH_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id")


@dataclass(frozen=True)
class Nodes:
    """The machines of a run and where they meet (torchrun's rendezvous).

    One machine (`count` 1) needs nothing else. On several, every machine runs the same command
    with the same `endpoint`, HOST:PORT on one of them (the first, by convention), where the
    launchers meet before any process starts. Without `rank`, the c10d rendezvous numbers the
    machines as they meet: the same command on every machine (an `srun` line). With `rank`, the
    static rendezvous fixes the numbering: machine `rank` runs global ranks `rank * nproc` to
    `rank * nproc + nproc - 1`, and machine 0 must be the one at HOST (it holds the meeting point).

    Attributes:
        count: machines (`--nnodes`).
        endpoint: HOST:PORT where the machines meet (`--rdzv-endpoint`), needed when count > 1.
        rank: this machine's number from 0 (`--node-rank`); None: numbered at the rendezvous.
        run_id: the name the machines meet under (`--rdzv-id`); None: $SLURM_JOB_ID, else "attnlab".

    Raises:
        ValueError: count < 1, a rank outside 0..count-1, no endpoint on several machines, an
            endpoint that is not HOST:PORT, an empty run id or one with spaces.
    """

    count: int = 1
    endpoint: str | None = None
    rank: int | None = None
    run_id: str | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"--nnodes expects a positive integer, got {self.count}")
        if self.rank is not None and not 0 <= self.rank < self.count:
            raise ValueError(f"--node-rank expects an integer from 0 to {self.count - 1} (--nnodes {self.count}), "
                             f"got {self.rank}")
        if self.count > 1 and self.endpoint is None:
            raise ValueError(f"--nnodes {self.count} needs --rdzv-endpoint HOST:PORT, where the machines meet: the "
                             "first machine's host name or address and a port open to the others (e.g. node0:29500)")
        if self.endpoint is not None:
            split_endpoint(self.endpoint)
        if self.run_id is not None and (not self.run_id or any(c.isspace() for c in self.run_id)):
            raise ValueError(f"--rdzv-id expects a name without spaces, the same on every machine, got {self.run_id!r}")

    def torchrun_flags(self) -> list[str]:
        """torchrun's options for these machines (the processes per machine apart)."""
        if self.count == 1:
            return ["--standalone"]
        run_id = self.run_id or os.environ.get("SLURM_JOB_ID") or "attnlab"
        static = ["--rdzv-backend=static", f"--node-rank={self.rank}"]  # the rank fixed: no numbering to agree on
        backend = ["--rdzv-backend=c10d"] if self.rank is None else static
        return [f"--nnodes={self.count}", *backend, f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={run_id}"]


def split_endpoint(text: str) -> tuple[str, int]:
    """`"node0:29500"` -> ("node0", 29500); an IPv6 address goes in brackets: `"[::1]:29500"`.

    Raises:
        ValueError: not HOST:PORT with a port from 1 to 65535.
    """
    host, _, port = text.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not bare or (":" in bare and bare == host) or any(c.isspace() or c in "[]/" for c in bare) \
            or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--rdzv-endpoint expects HOST:PORT, a host name or address and a port from 1 to 65535 "
                         f"(e.g. node0:29500 or [fe80::1]:29500), got {text!r}")
    return bare, int(port)


def _take_flags(items: list[str], names: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """Take `--NAME VALUE` / `--NAME=VALUE` out of `items` for each of `names` (the last one given wins)."""
    found, rest, i = {}, [], 0
    while i < len(items):
        item = items[i]
        name, sep, raw = item.partition("=")
        if name in names:
            if not sep:
                raw = items[i + 1] if i + 1 < len(items) else ""
            found[name] = raw
            i += 1 if sep else 2
            continue
        rest.append(item)
        i += 1
    return found, rest


def _positive(flag: str, raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{flag} expects a positive integer, got {raw!r}")
    return int(raw)


def pop_nproc(items: list[str]) -> tuple[int, list[str]]:
    """Take `--nproc N` / `--nproc=N` out of a command's trailing arguments.

    Returns:
        (N, the other items); N = 1 when absent.

    Raises:
        ValueError: a value that is not a positive integer.
    """
    found, rest = _take_flags(items, ("--nproc",))
    return (_positive("--nproc", found["--nproc"]) if "--nproc" in found else 1), rest


def pop_launch(items: list[str]) -> tuple[int, Nodes, list[str]]:
    """Take the launcher's flags (`LAUNCH_FLAGS`: --nproc, --nnodes, --node-rank, --rdzv-endpoint,
    --rdzv-id) out of a command's arguments, as `--FLAG VALUE` or `--FLAG=VALUE`.

        pop_launch(["--nnodes", "2", "--rdzv-endpoint=node0:29500", "--optim.lr", "1e-3"])
        -> (1, Nodes(count=2, endpoint="node0:29500"), ["--optim.lr", "1e-3"])

    Returns:
        (processes per machine, the machines, the other items); 1 and one machine when absent.

    Raises:
        ValueError: a bad value, naming the flag (see Nodes).
    """
    found, rest = _take_flags(items, LAUNCH_FLAGS)
    nproc = _positive("--nproc", found["--nproc"]) if "--nproc" in found else 1
    count = _positive("--nnodes", found["--nnodes"]) if "--nnodes" in found else 1
    rank = found.get("--node-rank")
    if rank is not None and not rank.isdigit():
        raise ValueError(f"--node-rank expects an integer from 0 to {count - 1} (--nnodes {count}), got {rank!r}")
    nodes = Nodes(count, found.get("--rdzv-endpoint"), None if rank is None else int(rank), found.get("--rdzv-id"))
    return nproc, nodes, rest


def torchrun_command(nproc: int, argv: list[str], nodes: Nodes | None = None) -> list[str]:
    """The command that starts `attnlab ARGV` on `nproc` processes of this machine with
    torch.distributed.run: alone (`--standalone`), or as one of `nodes.count` machines."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", *(nodes or Nodes()).torchrun_flags(),
            f"--nproc-per-node={nproc}", "-m", "attnlab.cli.main", *argv]


def relaunch(nproc: int, argv: list[str], nodes: Nodes | None = None) -> int:
    """Run `attnlab ARGV` under torchrun on `nproc` processes of this machine (of each of
    `nodes.count` machines: see Nodes) and wait for it.

    A stop signal sent to this process alone (Kubernetes signals a container's first process,
    `timeout` and `kill` the one they name) is passed on to torchrun as SIGTERM, which it forwards
    to every rank: they checkpoint after the same step and stop (attnlab.training.run.signals).
    Ctrl-C is not passed on: the terminal signals torchrun and the ranks itself.

    Returns:
        128 + the number of the signal this process got, else torchrun's exit code (non-zero
        when a rank failed).
    """
    import signal
    import subprocess

    from attnlab.training.run.signals import STOP_SIGNALS, exit_status

    command = torchrun_command(nproc, argv, nodes)
    print("launching: " + " ".join(command), flush=True)
    proc = subprocess.Popen(command)
    got: list[str] = []

    def pass_on(signum: int, frame: Any) -> None:
        got.append(signal.Signals(signum).name)
        if signum != signal.SIGINT and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    numbers = [n for n in (getattr(signal, name, None) for name in ("SIGINT", *STOP_SIGNALS)) if n is not None]
    previous = {n: signal.signal(n, pass_on) for n in numbers if signal.getsignal(n) is not signal.SIG_IGN}
    try:
        code = proc.wait()  # (a handler's return resumes the wait: PEP 475)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
    return exit_status(got[0]) if got else code
