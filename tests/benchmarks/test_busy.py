"""benchmarks/bench_busy.py: every setting is measured idle and busy in its own process, the
spinning processes are gone afterwards, and the slowdown is busy time over idle time."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_setting_is_timed_idle_and_busy(tmp_path):
    out = tmp_path / "busy.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_busy.py"), "--busy", "1", "--rounds", "1",
                    "--layers", "1", "--d-model", "64", "--vocab", "128", "--new-tokens", "4", "--out", str(out)],
                   check=True, capture_output=True, timeout=600)
    result = json.loads(out.read_text())
    settings = {"threads=1", "threads=2", "threads=2 passive"}
    for phase in ("idle", "busy"):
        assert set(result[phase]["tokens_per_s"]) == settings
        assert all(len(runs) == 1 and runs[0]["wall"] > 0 for runs in result[phase]["runs"].values())
    for setting in settings:
        assert result["slowdown"][setting] == result["idle"]["tokens_per_s"][setting] / result["busy"]["tokens_per_s"][setting]
    assert not _spinning(), "a spinning process outlived the benchmark"


def _spinning() -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"while True: pass" in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:  # the process ended while we looked
            pass
    return found
