"""How much memory a run may still allocate: what attnlab.training.setup.memory compares its estimate with.

    available_memory(torch.device("cpu"))   # Available(bytes=..., source="MemAvailable in /proc/meminfo")

On a CPU, the least of:

    cgroup v2    memory.max - memory.current of this process's cgroup and of each ancestor with a
                 limit (/sys/fs/cgroup/PATH, PATH from the `0::PATH` line of /proc/self/cgroup; a
                 container's cgroup is often its namespace's root, /sys/fs/cgroup itself)
    cgroup v1    memory.limit_in_bytes - memory.usage_in_bytes likewise, under /sys/fs/cgroup/memory
                 (PATH from the `N:memory:PATH` line); a limit of 2^62 or more is v1's "no limit"
    meminfo      MemAvailable of /proc/meminfo: what can be allocated without swapping
    ulimit -v    RLIMIT_AS less the process's VmSize (an allocation past it fails)

On a GPU: torch.cuda.mem_get_info's free bytes. Each reader takes `root`, where /sys and /proc
are, so that tests read files laid out as Linux lays them out.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Available:
    """Bytes a run may still allocate, and where the figure comes from (`MemAvailable in /proc/meminfo`)."""

    bytes: int
    source: str


def _read_int(path: Path) -> int | None:
    """The integer in a one-line file; None when it is missing, unreadable, or not a number ("max")."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _own_cgroups(root: Path) -> dict[str, str]:
    """This process's cgroup paths from ROOT/proc/self/cgroup: {"v2": the path of its `0::PATH`
    line, "v1": that of its memory controller's `N:memory:PATH` line}, where present."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    return paths


def cgroup_available(root: Path = Path("/")) -> Available | None:
    """Room left under the tightest memory limit of this process's cgroup and its ancestors (a
    container's cgroup is often the root of its namespace, /sys/fs/cgroup itself), None where
    none has a limit.

    cgroup v2: memory.max - memory.current under /sys/fs/cgroup; v1: memory.limit_in_bytes -
    memory.usage_in_bytes under /sys/fs/cgroup/memory (a limit of 2^62 or more means none).

    Args:
        root: where /sys and /proc are (a folder of such files in tests).
    """
    base, own = root / "sys/fs/cgroup", _own_cgroups(root)
    found: list[Available] = []
    for version, hierarchy, limit_file, usage_file in (("v2", base, "memory.max", "memory.current"),
                                                       ("v1", base / "memory", "memory.limit_in_bytes",
                                                        "memory.usage_in_bytes")):
        folder = hierarchy / own.get(version, "/").lstrip("/")
        while True:
            limit = _read_int(folder / limit_file)
            if limit is not None and limit < 2 ** 62:
                used = _read_int(folder / usage_file) or 0
                found.append(Available(max(limit - used, 0), f"the cgroup limit /{(folder / limit_file).relative_to(root)}"))
            if folder == hierarchy or hierarchy not in folder.parents:
                break
            folder = folder.parent
    return min(found, key=lambda a: a.bytes) if found else None


def meminfo_available(root: Path = Path("/")) -> Available | None:
    """/proc/meminfo's MemAvailable (what can be allocated without swapping), None without it."""
    try:
        lines = (root / "proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == "MemAvailable" and value.split() and value.split()[0].isdigit():
            return Available(int(value.split()[0]) * 1024, "MemAvailable in /proc/meminfo")
    return None


def address_space_available(root: Path = Path("/")) -> Available | None:
    """Room under this process's address-space limit (`ulimit -v`, RLIMIT_AS) less its VmSize;
    None without such a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        status = (root / "proc/self/status").read_text().splitlines()
        held = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):
        held = 0
    return Available(max(soft - held, 0), "the address-space limit, ulimit -v")


def available_memory(device: torch.device, root: Path = Path("/")) -> Available | None:
    """What a run on `device` may still allocate: on a GPU its free memory (torch.cuda.mem_get_info),
    else the least of `cgroup_available`, `meminfo_available` and `address_space_available`;
    None where none can be read (not Linux, no /proc)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return Available(int(free), f"free memory of {device} (torch.cuda.mem_get_info)")
    found = [a for a in (cgroup_available(root), meminfo_available(root), address_space_available(root)) if a]
    return min(found, key=lambda a: a.bytes) if found else None


__all__ = ["Available", "address_space_available", "available_memory", "cgroup_available", "meminfo_available"]
