"""``attnlab tokenizer train|encode|decode|info`` through ``attnlab.cli.main.main``.

The parser is built with only the ``tokenizer`` subcommand registered, so that these tests
do not depend on the other subcommands' modules.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from attnlab.cli import main as cli_main
from attnlab.tokenizers import Tokenizer


@pytest.fixture
def run(monkeypatch, capsys):
    monkeypatch.setattr(cli_main, "SUBCOMMANDS", ["tokenizer"])

    def call(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = cli_main.main(["tokenizer", *argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("the cat sat on the mat\nthe dog sat on the log\n" * 20, encoding="utf-8")
    return path


def test_registered_in_main():
    assert "tokenizer" in cli_main.SUBCOMMANDS


def test_train_encode_decode_info(run, corpus, tmp_path):
    out_dir = tmp_path / "tok"
    code, out, err = run("train", str(corpus), "--kind", "bpe", "--vocab-size", "270", "--output", str(out_dir))
    assert code == 0
    assert json.loads(out.splitlines()[0].removeprefix("settings: "))["vocab_size"] == 270
    assert "trained bpe tokenizer: vocab_size 270, 13 merges" in out and "merges" in err  # summary, progress
    saved = Tokenizer.load(out_dir)

    code, out, _ = run("encode", "--tokenizer", str(out_dir), "the cat", "sat")
    assert code == 0
    assert out.splitlines() == [" ".join(map(str, saved.encode(t))) for t in ("the cat", "sat")]

    code, out, _ = run("encode", "-t", str(out_dir), "--tokens", "the cat")
    assert out.split() == saved.tokenize("the cat")

    code, out, _ = run("encode", "-t", str(out_dir), stdin="the dog\non the log\n")
    assert out.splitlines() == [" ".join(map(str, saved.encode(t))) for t in ("the dog", "on the log")]

    ids = saved.encode("the cat sat")
    code, out, _ = run("decode", "-t", str(out_dir), *map(str, ids))
    assert (code, out) == (0, "the cat sat\n")
    code, out, _ = run("decode", "-t", str(out_dir), stdin=",".join(map(str, ids)) + "\n")
    assert out == "the cat sat\n"

    code, out, _ = run("info", "-t", str(out_dir), "--json")
    info = json.loads(out)
    assert info["kind"] == "bpe" and info["vocab_size"] == 270 and info["special_tokens"] == {"<|endoftext|>": 0}


def test_wordpiece_with_special_tokens(run, corpus, tmp_path):
    out_file = tmp_path / "wp.json"
    code, out, _ = run("train", str(corpus), "--kind", "wordpiece", "--vocab-size", "60", "--quiet",
                       "--output", str(out_file))
    assert code == 0 and out_file.is_file()
    code, out, _ = run("encode", "-t", str(out_file), "--add-special-tokens", "--tokens", "The cat")
    assert out.strip() == "[CLS] the cat [SEP]"
    code, out, _ = run("info", "-t", str(out_file))
    assert "template: bert" in out and "lowercase: True" in out


def test_errors_exit_with_code_2(run, tmp_path, corpus):
    code, _, err = run("info", "-t", str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in err
    code, _, err = run("train", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "x"))
    assert code == 2 and "files" in err
    code, _, err = run("train", str(corpus), "--vocab-size", "10", "-o", str(tmp_path / "x"))
    assert code == 2 and "vocab_size" in err
    assert not (tmp_path / "x").exists()  # nothing half-written
    tok = Tokenizer.train([corpus], kind="char")
    tok.save(tmp_path / "c.json")
    code, _, err = run("decode", "-t", str(tmp_path / "c.json"), "1", "x")
    assert code == 2 and "'x' is not an integer" in err


def test_training_on_files_without_text_is_refused_and_saves_nothing(run, tmp_path):
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    code, _, err = run("train", str(tmp_path / "empty.txt"), str(tmp_path / "blank.txt"), "--kind", "char",
                       "-o", str(tmp_path / "tok"))
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"attnlab tokenizer: error: {str(tmp_path / 'empty.txt')!r}, {str(tmp_path / 'blank.txt')!r}: no text "
        "(empty, or whitespace only); nothing to train a char tokenizer on")
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("sub", ["train", "encode", "decode", "info"])
def test_help_has_an_example(run, sub):
    with pytest.raises(SystemExit) as exit_info:
        run(sub, "--help")
    assert exit_info.value.code == 0


def test_help_text_contains_example(monkeypatch, capsys):
    monkeypatch.setattr(cli_main, "SUBCOMMANDS", ["tokenizer"])
    for sub in ("train", "encode", "decode", "info"):
        with pytest.raises(SystemExit):
            cli_main.main(["tokenizer", sub, "--help"])
        assert "example:" in capsys.readouterr().out
    assert cli_main.main(["tokenizer"]) == 2  # no sub-subcommand: usage
