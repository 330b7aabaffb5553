"""docs/how-to/hugging-face.md's runnable example, run as written (it asserts its own result)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_runnable_example_runs_and_matches_transformers(tmp_path):
    text = (ROOT / "docs" / "how-to" / "hugging-face.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "save_pretrained" in b]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", example], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r"decoder, 2 layers: largest logit difference \S+\n", done.stdout), done.stdout
