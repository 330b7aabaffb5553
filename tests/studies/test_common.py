"""examples/studies/common.py: the evaluation clock counts the work done in child processes."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.studies import load_study


def test_cpu_time_counts_a_finished_child_process():
    cpu_time = load_study("translation").cpu_time  # the studies import it from common.py beside them
    own0, total0 = time.process_time(), cpu_time()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    own, total = time.process_time() - own0, cpu_time() - total0
    assert own < 0.2  # this process only waited
    assert total >= 0.4 + own - 0.01  # the child's 0.4 s are counted
