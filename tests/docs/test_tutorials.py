"""The tutorials' shape, cheaply (CI executes them): each docs/tutorials/NN-name.py is a jupytext
percent-format notebook that is valid Python, whose first code cell installs attnlab only where
it is not importable (Colab, a fresh Jupyter), and which ends with an exercises cell of 3-5 tasks."""

import re
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[2] / "docs" / "tutorials"
FILES = sorted(TUTORIALS.glob("[0-9][0-9]-*.py"))
HEADER = re.compile(r"\A# ---\n# jupyter:\n(# .*\n)*?#       format_name: percent\n(# .*\n)*?# ---\n")


def cells(text: str) -> list[tuple[str, str]]:
    """(kind, source) of each cell: 'markdown' for `# %% [markdown]`, else 'code'."""
    out = []
    for chunk in re.split(r"^# %%", text, flags=re.M)[1:]:
        first, _, body = chunk.partition("\n")
        out.append(("markdown" if "[markdown]" in first else "code", body.strip()))
    return out


def test_the_tutorials_of_this_part_are_there():
    names = {f.name for f in FILES}
    for name in ("01-rnns.py", "02-attention.py", "03-transformer.py", "04-pretraining.py", "05-fine-tuning.py",
                 "06-x-formers.py", "07-vision.py", "08-scale.py"):
        assert name in names


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_a_tutorial_is_a_percent_notebook_of_valid_python(path):
    text = path.read_text(encoding="utf-8")
    assert HEADER.match(text), f"{path.name}: no jupytext percent-format header"
    compile(text, str(path), "exec")  # a SyntaxError fails the test
    kinds = [kind for kind, _ in cells(text)]
    assert kinds[0] == "markdown" and "code" in kinds, f"{path.name}: expected a title cell, then code"


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_the_first_code_cell_installs_attnlab_only_where_it_is_missing(path):
    code = next(source for kind, source in cells(path.read_text(encoding="utf-8")) if kind == "code")
    assert re.search(r"pip", code) and re.search(r"install", code), f"{path.name}: first code cell installs nothing"
    assert "find_spec(\"attnlab\")" in code or "ImportError" in code, \
        f"{path.name}: the install must be conditional on attnlab missing"


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_a_tutorial_ends_with_three_to_five_exercises(path):
    kind, source = cells(path.read_text(encoding="utf-8"))[-1]
    assert kind == "markdown" and re.search(r"^# #+ Exercises", source, re.M), \
        f"{path.name}: the last cell must be the exercises"
    tasks = re.findall(r"^# \d+\. ", source.split("Exercises", 1)[1], re.M)
    assert 3 <= len(tasks) <= 5, f"{path.name}: {len(tasks)} exercises, expected 3-5"
