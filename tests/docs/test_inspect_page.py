"""docs/how-to/inspect.md's example, run as written, and its table naming only points that exist."""

import re
from pathlib import Path

import torch

from attnlab import ModelConfig, build_model

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "how-to" / "inspect.md").read_text(encoding="utf-8")


def test_the_example_runs_as_written(capsys):
    code = re.search(r"```python\n(.*?)```", PAGE, re.S).group(1)
    exec(compile(code, "inspect.md", "exec"), {})
    out = capsys.readouterr().out
    assert "hook points, e.g." in out and float(out.rsplit(":", 1)[1]) > 0


def test_every_point_the_table_names_exists():
    small = dict(vocab_size=20, d_model=16, num_layers=1, num_heads=2, d_ff=32)
    models = [build_model(ModelConfig(arch="encoder_decoder", **small)),
              build_model(ModelConfig(arch="decoder", moe={"num_experts": 2, "top_k": 1}, **small))]
    last_parts = {n.rsplit(".", 1)[-1] for m in models for n in m.hook_points()}
    first_column = re.findall(r"^\| (`[^|]+`) \|", PAGE, re.M)
    named = {h for cell in first_column for h in re.findall(r"hook_\w+", cell)}
    assert len(named) >= 18
    assert named <= last_parts, named - last_parts
