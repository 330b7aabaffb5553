"""The readers of the memory a run may still allocate (attnlab.training.setup.free_memory): cgroup v2
and v1, /proc/meminfo, and the least of them, on files laid out as Linux lays them out."""

import resource
from pathlib import Path

import torch

from attnlab.training.setup.free_memory import (Available, address_space_available, available_memory, cgroup_available,
                                          meminfo_available)


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cgroup_v2_takes_the_tightest_limit_of_the_process_cgroup_and_its_ancestors(tmp_path):
    root = _files(tmp_path, {
        "proc/self/cgroup": "0::/user.slice/run.scope\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
        "sys/fs/cgroup/user.slice/memory.max": "8000000000\n",
        "sys/fs/cgroup/user.slice/memory.current": "3000000000\n",
        "sys/fs/cgroup/user.slice/run.scope/memory.max": "max\n",  # no limit of its own
        "sys/fs/cgroup/user.slice/run.scope/memory.current": "1000000000\n",
    })
    assert cgroup_available(root) == Available(5_000_000_000, "the cgroup limit /sys/fs/cgroup/user.slice/memory.max")
    (root / "sys/fs/cgroup/user.slice/run.scope/memory.max").write_text("2000000000\n")
    assert cgroup_available(root).bytes == 1_000_000_000  # its own limit is now the tighter one
    (root / "sys/fs/cgroup/user.slice/run.scope/memory.max").write_text("max\n")
    (root / "sys/fs/cgroup/user.slice/memory.max").write_text("max\n")
    assert cgroup_available(root) is None


def test_a_container_cgroup_v2_is_its_namespace_root(tmp_path):
    root = _files(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "4294967296\n",
                             "sys/fs/cgroup/memory.current": "1073741824\n"})
    assert cgroup_available(root) == Available(3 * 2 ** 30, "the cgroup limit /sys/fs/cgroup/memory.max")


def test_cgroup_v1_reads_the_memory_controller_and_treats_its_huge_default_as_no_limit(tmp_path):
    root = _files(tmp_path, {
        "proc/self/cgroup": "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",  # the root: unlimited
        "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "2147483648\n",
        "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": "1073741824\n",
    })
    assert cgroup_available(root) == Available(
        2 ** 30, "the cgroup limit /sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes")
    (root / "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_available(root) is None


def test_meminfo_gives_mem_available_in_bytes(tmp_path):
    root = _files(tmp_path, {"proc/meminfo": "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n"
                                             "MemAvailable:    9000000 kB\nBuffers:          100 kB\n"})
    assert meminfo_available(root) == Available(9_000_000 * 1024, "MemAvailable in /proc/meminfo")
    assert meminfo_available(tmp_path / "nothing") is None


def test_the_least_of_the_limits_is_what_is_available(tmp_path):
    root = _files(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "6000000000\n",
                             "sys/fs/cgroup/memory.current": "1000000000\n",
                             "proc/meminfo": "MemAvailable:    9000000 kB\n"})
    assert available_memory(torch.device("cpu"), root) == cgroup_available(root)  # 5e9 < 9e9 * 1024
    (root / "proc/meminfo").write_text("MemAvailable:    1000 kB\n")
    assert available_memory(torch.device("cpu"), root) == meminfo_available(root)


def test_an_address_space_limit_leaves_its_room_above_the_process_size():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    assert soft == resource.RLIM_INFINITY and address_space_available() is None  # the test machine sets none
    size = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + 2 ** 31, hard))  # `ulimit -v`: 2 GiB above what the process holds
    try:
        room = address_space_available()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert room.source == "the address-space limit, ulimit -v" and 2 ** 31 - 2 ** 26 < room.bytes <= 2 ** 31
