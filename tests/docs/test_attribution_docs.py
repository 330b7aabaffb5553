"""docs/how-to/inspect.md's attribution example, run as written: its integrated gradients are
complete to the precision the page promises, rollout and flow give shares, the lens one guess
per layer and position."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "how-to" / "inspect.md").read_text(encoding="utf-8")


def test_the_attribution_example_runs_as_written():
    section = PAGE[PAGE.index("## Attribution: which tokens a prediction rests on"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "inspect.md (attribution)", "exec"), scope)
    att, maps = scope["att"], scope["maps"]
    assert att.scores.shape == (1, 8) and abs(float(att.delta[0])) < 1e-5
    assert len(maps) == 2 and tuple(maps[0].shape) == (1, 4, 8, 8)
    rollout = scope["attention_rollout"](maps)[0, -1]
    assert abs(float(rollout.sum()) - 1) < 1e-5
    assert "bash" in section and "attnlab inspect attribute" in section
