"""docs/labs.md's examples, run as written: its table names every lab, its run.yaml trains with
the student's kernel and rotary scheme (on a tiny corpus, for 2 steps), its Python example runs."""

import re
import shutil
from pathlib import Path

import pytest
import yaml

from attnlab import labs
from attnlab.cli.main import main
from tests.training.helpers import write_corpus

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "labs.md").read_text(encoding="utf-8")
STUDENTS = ROOT / "tests" / "labs" / "students"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv("ATTNLAB_LABS", "")
    yield
    labs.forget()


def test_the_table_names_every_lab_in_order():
    rows = re.findall(r"^\| `([a-z-]+)` \|", PAGE, re.M)
    assert rows == list(labs.LABS)
    for name in labs.LABS:
        assert f"### `{name}`" in PAGE


def test_the_run_yaml_trains_with_the_students_pieces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = re.search(r"```yaml\n(# run.yaml.*?)```", PAGE, re.S).group(1)
    config = yaml.safe_load(text)
    model = config["model"]
    assert model["attention"]["kernel"] == "lab-sdpa" and model["position"]["scheme"] == "lab-rotary"
    train, valid = write_corpus(tmp_path / "data")
    (tmp_path / "run.yaml").write_text(text)
    (tmp_path / "labs").mkdir()
    for name in ("sdpa.py", "rotary.py"):
        shutil.copy(STUDENTS / name, tmp_path / "labs" / name)
    assert main(["--lab", "labs", "train", "run.yaml", "--data.source", str(train), "--data.valid", str(valid),
                 "--train.max_steps", "2", "--train.eval_every", "2", "--train.checkpoint_every", "2",
                 "--train.threads", "1"]) == 0
    assert (tmp_path / "runs" / "my-kernel" / "checkpoints").is_dir()
    assert main(["--lab", "labs", "generate", "runs/my-kernel", "--prompt", "the", "--max-new-tokens", "3",
                 "--sample", "--no-stream"]) == 0
    labs.forget()
    monkeypatch.setenv("ATTNLAB_LABS", "")  # as a fresh process without --lab: main() set it for its children
    assert main(["generate", "runs/my-kernel", "--prompt", "the"]) == 2  # the error the page shows


def test_the_python_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = re.search(r"```python\n(.*?)```", PAGE, re.S).group(1)
    exec(compile(code, "docs/labs.md", "exec"), {})  # writes labs/rotary.py: the stub fails, nothing registers
    assert "0/7 checks pass" in capsys.readouterr().out
    shutil.copy(STUDENTS / "rotary.py", tmp_path / "labs" / "rotary.py")
    exec(compile(code.replace('labs.start("rotary", "labs")', "pass"), "docs/labs.md", "exec"), {})
    assert "7/7 checks pass: all pass" in capsys.readouterr().out
