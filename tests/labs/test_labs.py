"""Every lab grades attnlab's own implementation as passing, an untouched stub as failing (with the
NotImplementedError named), a student's independent solution as passing, and a typical mistake
as failing on the property it breaks, with what was expected and what came."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab import labs
from attnlab.labs import LABS, LabError

STUDENTS = Path(__file__).parent / "students"


def _write(folder: Path, lab_name: str, text: str) -> Path:
    path = folder / LABS[lab_name].filename
    path.write_text(text, encoding="utf-8")
    return path


def _failing(report) -> dict[str, str]:
    return {r.name: r.detail for r in report.results if not r.passed}


@pytest.mark.parametrize("name", LABS)
def test_the_reference_solution_passes_every_check(tmp_path, name):
    _write(tmp_path, name, LABS[name].solution)
    report = labs.check(name, tmp_path)
    assert report.passed, report.text()
    assert len(report.results) == len(LABS[name].checks) >= 4


@pytest.mark.parametrize("name", LABS)
def test_an_independent_student_solution_passes(name):
    """Written from the stub's docstring alone: the contract is enough to pass."""
    report = labs.check(name, path=STUDENTS / LABS[name].filename)
    assert report.passed, report.text()


@pytest.mark.parametrize("name", LABS)
def test_the_untouched_stub_fails_every_check_naming_not_implemented(tmp_path, name):
    path = labs.start(name, tmp_path)
    report = labs.check(name, tmp_path)
    assert not any(r.passed for r in report.results)
    first = report.results[0].detail
    assert first.startswith("not written yet: raised NotImplementedError in ") and f"{path.name}:" in first
    line = int(first.split(f"{path.name}:")[1].split()[0].rstrip(")"))
    assert "raise NotImplementedError" in path.read_text().splitlines()[line - 1]
    assert all(r.detail.startswith("not written yet") for r in report.results)
    assert report.text().splitlines()[-1] == f"0/{len(report.results)} checks pass: {len(report.results)} failing"


@pytest.mark.parametrize("name", LABS)
def test_the_stub_states_the_contract(name):
    stub = LABS[name].stub
    compile(stub, LABS[name].filename, "exec")
    assert "raise NotImplementedError" in stub and "Returns:" in stub and "Args:" in stub


# a typical mistake per lab: (lab, the student's file, the check that catches it, words of its message)
MISTAKES = {
    "sdpa: the mask ignored": ("sdpa", """
import torch
def attention(q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0):
    w = torch.softmax(q @ k.transpose(-2, -1) * scale + (0 if bias is None else bias), -1)
    return w @ v, w
""", "causal mask", "output at position 0 changed when token 5 changed"),
    "sdpa: no scale": ("sdpa", """
import torch
def attention(q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0):
    s = q @ k.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ v, w
""", "equals the eager kernel", "weights (no mask): at index"),
    "sdpa: NaN for a query with no key": ("sdpa", """
import torch
def attention(q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ v, w
""", "query with no key", "gave NaN, expected zero weights"),
    "rotary: interleaved pairs": ("rotary", """
import torch
def rotate(x, positions, *, base=10000.0):
    d = x.shape[-1]
    a = positions.float()[:, None, :, None] * base ** (-torch.arange(0, d, 2).float() / d)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin()), -1).flatten(-2)
""", "equals attnlab's RotaryEmbedding", "positions 3..8, Dh=16: at index"),
    "rotary: absolute (a shift per position)": ("rotary", """
import torch
def rotate(x, positions, *, base=10000.0):
    return x + 0.1 * positions.float()[:, None, :, None]
""", "scores depend on i - j only", "when every position moves by 11"),
    "bpe: ties to the largest pair": ("bpe-merge", (STUDENTS / "bpe_merge.py").read_text().replace(
        "key=lambda item: (-item[1], item[0])", "key=lambda item: (-item[1], tuple(-i for i in item[0]))"),
        "best_pair breaks ties by smallest (left, right)", "expected ((2, 5), 1), got ((9, 1), 1)"),
    "bpe: overlapping merges": ("bpe-merge", (STUDENTS / "bpe_merge.py").read_text().replace(
        "            i += 2", "            i += 1"), "merge_pair", "merge_pair([1, 2, 3, 1, 2], (1, 2), 9)"),
    "beam: no length penalty": ("beam-search", (STUDENTS / "beam_search.py").read_text().replace(
        "total / len(tokens) ** length_penalty", "total"), "length penalty", "expected"),
    "beam: the prompt returned too": ("beam-search", (STUDENTS / "beam_search.py").read_text().replace(
        "return max(finished, key=lambda f: f[0])[1]", "return prompt + max(finished, key=lambda f: f[0])[1]"),
        "returns the new tokens", "got"),
    "pre-ln: post-LN": ("pre-ln-layer", """
def pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask=None):
    x = norm1(x + self_attn(x, mask=mask)[0])
    return norm2(x + ffn(x))
""", "equals attnlab's pre-LN TransformerLayer", "got the post-LN layer"),
    "pre-ln: no residual": ("pre-ln-layer", """
def pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask=None):
    x = self_attn(norm1(x), mask=mask)[0]
    return ffn(norm2(x))
""", "residual path", "expected x itself"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_typical_mistake_fails_on_the_property_it_breaks(tmp_path, mistake):
    name, text, check, words = MISTAKES[mistake]
    _write(tmp_path, name, text)
    failing = _failing(labs.check(name, tmp_path))
    assert check in failing, failing
    assert words in failing[check]


def test_an_error_in_the_student_code_names_the_file_and_line(tmp_path):
    _write(tmp_path, "pre-ln-layer", "def pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask=None):\n"
                                     "    return x + undefined_name\n")
    detail = labs.check("pre-ln-layer", tmp_path).results[0].detail
    assert detail == ("raised NameError: name 'undefined_name' is not defined "
                      "(at pre_ln_layer.py:2: return x + undefined_name)")


def test_a_missing_function_is_named(tmp_path):
    _write(tmp_path, "rotary", "def rotation(x, positions, *, base=10000.0):\n    return x\n")
    assert "defines no `rotate`" in labs.check("rotary", tmp_path).results[0].detail


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(LabError, match="no lab named 'attention'; the labs are: sdpa, pre-ln-layer"):
        labs.check("attention", tmp_path)
    with pytest.raises(LabError, match=r"sdpa.py does not exist; run `attnlab lab start sdpa --dir .*` first"):
        labs.check("sdpa", tmp_path)
    _write(tmp_path, "sdpa", "def attention(q, k, v\n    pass\n")
    with pytest.raises(LabError, match=r"sdpa.py:1: syntax error: "):
        labs.check("sdpa", tmp_path)
    _write(tmp_path, "sdpa", "import numpy_of_my_own\n")
    with pytest.raises(LabError, match=r"importing it raised ModuleNotFoundError: No module named 'numpy_of_my_own' "
                                       r"\(at sdpa.py:1"):
        labs.check("sdpa", tmp_path)


def test_start_never_overwrites_the_students_work(tmp_path):
    path = labs.start("sdpa", tmp_path / "new")  # the folder is made
    assert path.read_text() == LABS["sdpa"].stub
    labs.start("sdpa", tmp_path / "new")  # an untouched stub may be written again
    path.write_text("# my work\n")
    with pytest.raises(LabError, match="already started .* pass --force"):
        labs.start("sdpa", tmp_path / "new")
    assert path.read_text() == "# my work\n"
    labs.start("sdpa", tmp_path / "new", force=True)
    assert path.read_text() == LABS["sdpa"].stub


def test_state_follows_the_work(tmp_path):
    lab = LABS["rotary"]
    assert labs.state(lab, tmp_path) == "not started"
    labs.start("rotary", tmp_path)
    assert labs.state(lab, tmp_path) == "started"
    _write(tmp_path, "rotary", (STUDENTS / "rotary.py").read_text())
    assert labs.state(lab, tmp_path) == "passing"
    _write(tmp_path, "rotary", MISTAKES["rotary: interleaved pairs"][1])
    assert labs.state(lab, tmp_path) == "started"
