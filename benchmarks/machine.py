"""What the benchmarks record about the machine beside their timings."""


def loadavg() -> str:
    """The 1-, 5- and 15-minute load averages ("0.52 0.61 0.70"), or "n/a" where /proc is
    missing: a busy shared machine explains a slow run."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"
