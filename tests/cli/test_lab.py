"""`attnlab lab list | start | check`: states, one line per property, exit codes, one-line errors."""

from __future__ import annotations

from pathlib import Path

from attnlab import labs
from attnlab.cli import lab as lab_command
from attnlab.cli.main import main
from attnlab.labs import LABS

STUDENTS = Path(__file__).parents[1] / "labs" / "students"


def test_the_default_folder_is_the_librarys():
    assert lab_command.DEFAULT_DIR == labs.DEFAULT_DIR


def test_start_check_and_list_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["lab", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("labs in labs/")
    rows = {line.split()[0]: line for line in out[1:]}
    assert list(rows) == list(LABS)
    assert all("not started" in row for row in rows.values())
    assert "[A] Attention" in rows["sdpa"] and "attention(q, k, v" in rows["sdpa"]

    assert main(["lab", "start", "sdpa"]) == 0
    assert "wrote labs/sdpa.py" in capsys.readouterr().out
    assert main(["lab", "check", "sdpa"]) == 1  # the untouched stub fails, readably
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "lab sdpa (labs/sdpa.py):"
    assert lines[1].startswith("  FAIL  shapes of out and weights: not written yet: raised NotImplementedError in "
                               "attention() at sdpa.py:")
    assert len(lines) == 2 + len(LABS["sdpa"].checks)
    assert lines[-1] == f"0/{len(LABS['sdpa'].checks)} checks pass: {len(LABS['sdpa'].checks)} failing"

    (tmp_path / "labs" / "sdpa.py").write_text((STUDENTS / "sdpa.py").read_text())
    assert main(["lab", "check", "sdpa"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("  PASS  ") for line in lines[1:-1]) and lines[-1].endswith("all pass")
    assert main(["lab", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "passing" in rows["sdpa"] and "not started" in rows["rotary"]


def test_a_failing_property_says_what_was_expected_and_what_came(tmp_path, capsys):
    (tmp_path / "pre_ln_layer.py").write_text("def pre_ln_layer(x, self_attn, ffn, norm1, norm2, mask=None):\n"
                                              "    x = x + self_attn(norm1(x))[0]\n    return x + ffn(norm2(x))\n")
    assert main(["lab", "check", "pre-ln-layer", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "  PASS  equals attnlab's pre-LN TransformerLayer" in out  # no mask given there
    assert ("  FAIL  causal mask: causal mask: output at position 0 changed when token 5 changed (by " in out
            and "hand the mask to self_attn" in out)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_LABS", "")  # restored after the test, whatever main() sets
    assert main(["lab", "check", "flash", "--dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("attnlab lab: error: no lab named 'flash'; the labs are: "
                                       + ", ".join(LABS) + "\n")
    assert main(["lab", "check", "rotary", "--dir", str(tmp_path)]) == 2
    assert f"run `attnlab lab start rotary --dir {tmp_path}` first" in capsys.readouterr().err
    (tmp_path / "rotary.py").write_text("def rotate(x, positions, *, base=10000.0):\n    return x +\n")
    assert main(["lab", "check", "rotary", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"attnlab lab: error: {tmp_path / 'rotary.py'}:2: syntax error: invalid syntax\n"
    assert main(["lab", "start", "rotary", "--dir", str(tmp_path)]) == 2
    assert "already started" in capsys.readouterr().err
    assert main(["lab", "start", "rotary", "--dir", str(tmp_path), "--force"]) == 0
    assert main(["--lab", str(tmp_path / "none"), "lab", "list"]) == 2
    assert "lab folder" in capsys.readouterr().err


def test_a_piece_that_fails_its_checks_is_not_registered_with_a_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_LABS", "")
    (tmp_path / "sdpa.py").write_text((STUDENTS / "sdpa.py").read_text())
    assert main(["lab", "start", "rotary", "--dir", str(tmp_path)]) == 0
    try:
        assert main(["lab", "list", "--dir", str(tmp_path), "--lab", str(tmp_path)]) == 0
    finally:
        labs.forget()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"attnlab lab: warning: lab rotary of {tmp_path} is not registered: 7 check(s) fail "
                             "(shape and dtype, position 0 is the identity")
    assert err[0].endswith("see `attnlab lab check rotary`")
    assert err[1] == f"attnlab lab: lab pieces from {tmp_path}: attention.kernel=lab-sdpa"
