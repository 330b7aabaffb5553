"""docs/how-to/inspect.md's patching example, run as written: its printed scores are the exact
ones (the inputs differ at one position, so layer 0 there restores everything and elsewhere nothing)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "how-to" / "inspect.md").read_text(encoding="utf-8")


def test_the_patching_example_runs_as_written(capsys):
    section = PAGE.split("## Patching and ablation", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "inspect.md#patching", "exec"), {})
    out = capsys.readouterr().out
    assert "layer 0, position 5: 1.0 | position 4: 0.0" in out
    assert "torch.Size([2, 4]) kv_head ['kv0 (q 0-1)', 'kv1 (q 2-3)']" in out
    assert "mean-ablation effect per head: torch.Size([2, 4])" in out
    assert "direct effects: torch.Size([2, 4])" in out
