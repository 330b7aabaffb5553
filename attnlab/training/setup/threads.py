"""The torch threads a run asks for, checked before torch sees them.

    in_range("train.threads", value, 1, MAX_THREADS, ...)  # on load: an absurd count is a ConfigError
    set_threads("train.threads", 8)                        # where the run starts: capped to the CPUs

Why: `torch.set_num_threads(100000)` is accepted as it is, and the first parallel region then
asks the OpenMP runtime for 100,000 threads; past the process's thread limit (`ulimit -u`, about
96,000 on a 24 GB machine) or its memory for their stacks, the runtime crashes the process
(SIGSEGV) instead of raising. Threads beyond the CPUs this process may run on
(`os.sched_getaffinity`, which a container or `taskset` narrows below `os.cpu_count()`) only
take turns on them, so a larger count is capped, with a warning naming the field.
"""

from __future__ import annotations

import os
import warnings

import torch

from attnlab.config.validate import in_range

MAX_THREADS = 4096  # more than any machine attnlab runs on; above it a count is a typo, refused on load


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the platform has one, else os.cpu_count()."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def capped_threads(field: str, asked: int) -> int:
    """`asked`, or the usable CPUs when it is more, with a warning naming `field`, the count
    asked and the count used.

    Example:
        >>> capped_threads("train.threads", 1)
        1
    """
    cpus = usable_cpus()
    if asked <= cpus:
        return asked
    warnings.warn(f"{field}={asked} is more than the {cpus} CPU(s) this process may run on; using {cpus} threads",
                  UserWarning, stacklevel=3)
    return cpus


def set_threads(field: str, asked: int | None) -> None:
    """torch.set_num_threads(`asked` capped to the usable CPUs); None leaves torch's choice.

    Raises:
        ConfigError: `asked` not an integer in [1, MAX_THREADS], naming `field` (configs refuse
            it on load already; this guards callers that build no config).
    """
    if asked is None:
        return
    in_range(field, asked, 1, MAX_THREADS, integer=True)
    torch.set_num_threads(capped_threads(field, asked))
