"""The argparse types: a bad number is refused naming the flag, before any work (a download, a
training run) starts; nan and inf are no sizes or budgets."""

import argparse

import pytest

from attnlab.cli.argtypes import positive_float, positive_int
from attnlab.cli.main import main


def test_positive_float_takes_finite_positive_numbers_only():
    assert positive_float("0.5") == 0.5 and positive_float("4") == 4.0 and positive_float("1e-3") == 1e-3
    refused = [(text, f"must be a finite number > 0, got {text}") for text in ("0", "-1", "nan", "inf", "-inf")]
    for text, message in refused + [("x", "expected a number, got 'x'")]:
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^{message}$"):
            positive_float(text)
    assert positive_int("3") == 3


@pytest.mark.parametrize("argv, flag", [
    (["demo", "--sample-chars", "-5"], "--sample-chars"),
    (["demo", "--sample-chars", "0"], "--sample-chars"),
    (["demo", "--minutes", "inf"], "--minutes"),
    (["demo", "--minutes", "nan"], "--minutes"),
    (["inspect", "gradient-flow", "--spectral-norm", "nan"], "--spectral-norm"),
    (["inspect", "gradient-flow", "--spectral-norm", "-1"], "--spectral-norm"),
    (["parallel", "cost", "tiny-encoder-decoder", "--tgt-len", "-4"], "tgt_len"),
    (["parallel", "cost", "tiny-decoder", "--tgt-len", "0"], "tgt_len"),
])
def test_a_bad_number_is_one_error_line_naming_the_flag(argv, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))  # nothing fetched: refused before any download
    try:
        rc = main(argv)
    except SystemExit as exit_:  # argparse refuses a value before the subcommand runs
        rc = exit_.code
    assert rc == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith(f"attnlab {argv[0]}") and flag in lines[0], captured.err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists() and captured.out == ""
