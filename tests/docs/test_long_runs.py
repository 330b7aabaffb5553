"""docs/how-to/long-runs.md's SLURM script, run as written: the batch script gets SLURM's SIGUSR1
warning, passes it on, attnlab checkpoints and exits 138, and the script requeues the job
(`scontrol` is a stub that records its arguments); run again, the script resumes the run."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("isolated_cache")


def _slurm_script() -> str:
    text = (ROOT / "docs" / "how-to" / "long-runs.md").read_text(encoding="utf-8")
    section = text.split("## SLURM", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_slurm_script_checkpoints_on_the_warning_and_requeues(tmp_path):
    script = _slurm_script()
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --requeue" in script
    config = tiny_config(tmp_path, max_steps=1_000_000, checkpoint_every=10**6, eval_every=10**6, log_every=1)
    (tmp_path / "big.yaml").write_text(json.dumps(config))  # JSON is YAML
    (tmp_path / "job.sh").write_text(script)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.log'}\n")
    (stubs / "attnlab").write_text(f"#!/bin/sh\nexec {sys.executable} -m attnlab.cli.main \"$@\"\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_ID": "42", "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "job.log", "w")
    job = subprocess.Popen(["bash", "job.sh"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    # a step logged ("step N/M | loss ..."): the handler is installed; the setup line says "steps" earlier
    while "| loss " not in (tmp_path / "job.log").read_text() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    job.send_signal(signal.SIGUSR1)  # SLURM's warning, to the batch script (B:)
    assert job.wait(timeout=120) == 138, (tmp_path / "job.log").read_text()[-2000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 42\n"
    output = (tmp_path / "job.log").read_text()
    assert "stopped by SIGUSR1 after step " in output, output[-3000:]
    step = int(output.split("stopped by SIGUSR1 after step ")[1].split(";")[0])
    assert (tmp_path / "runs" / "char-gpt" / "checkpoints" / f"step-{step:08d}").is_dir()
    # the requeued job: the same script, stopped again right away, goes on from that step
    job = subprocess.Popen(["bash", "job.sh"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    for line in job.stdout:
        if line.startswith("resumed from"):
            assert f"at step {step}" in line
            job.send_signal(signal.SIGUSR1)
            break
    job.communicate(timeout=120)
    assert job.returncode == 138
