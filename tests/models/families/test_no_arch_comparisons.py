"""What differs between model families lives in the family's own file: no module outside
attnlab/models/families/ and attnlab/config/families.py compares a config's `arch` with a
family's name (the code asks `family(config)` or its traits instead)."""

import re
from pathlib import Path

import attnlab

PACKAGE = Path(attnlab.__file__).parent
ALLOWED = {"models/families", "config/families.py"}
# `arch` there names a layer kind of the gradient-flow demo (rnn, lstm, transformer), not a model family
OTHER_MEANING = {"inspect/gradient_flow.py"}
NAMES = "decoder|encoder|encoder_decoder|rnn_encoder_decoder"
PATTERNS = [
    re.compile(r"\barch\s*(==|!=|in\b|not in\b)"),                         # arch == "decoder", cfg.arch in (...)
    re.compile(rf"\barch\b[^\n]*?\)\s*(==|!=)\s*[\"']({NAMES})[\"']"),     # getattr(cfg, "arch", None) == "encoder"
    re.compile(rf"\{{\s*[\"']({NAMES})[\"']\s*:[^\n]*\}}\s*\.get\([^\n]*arch"),  # {"decoder": ...}.get(arch)
]


def arch_comparisons(root: Path = PACKAGE) -> list[str]:
    """`path:line: text` of every comparison of an arch with a family name outside the registry."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel == a or rel.startswith(a + "/") for a in ALLOWED | OTHER_MEANING):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in PATTERNS):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_module_outside_the_registry_compares_arch_strings():
    found = arch_comparisons()
    assert not found, "compare through attnlab.models.families.family(config) instead:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_comparison(tmp_path):
    """The check itself can fail: a module with each kind of comparison is reported line by line,
    and one inside the registry is not."""
    (tmp_path / "models" / "families").mkdir(parents=True)
    (tmp_path / "models" / "families" / "x.py").write_text('ok = cfg.arch == "decoder"\n')
    (tmp_path / "bad.py").write_text('a = cfg.arch == "decoder"\n'
                                     'b = arch not in ("encoder", "decoder")\n'
                                     'c = getattr(config, "arch", None) == "rnn_encoder_decoder"\n'
                                     'd = {"decoder": "decoder-only"}.get(spec.arch)\n'
                                     'e = "search in the archive"\n')
    found = arch_comparisons(tmp_path)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4"]
    assert all(line.startswith("bad.py:") for line in found)
