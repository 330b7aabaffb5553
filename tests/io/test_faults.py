"""A full disk (ENOSPC) or a failing one (EIO) under each writer of attnlab's files: the checkpoint,
metrics.jsonl, the tokenizer, an export (`attnlab convert`, `attnlab.save`). Each gives one line
naming the file it was writing (`attnlab CMD: error: PATH: no space left on device`, exit 2, as
for any OSError: attnlab.cli.main.describe_error), keeps what was there before whole, and
leaves no temporary behind.

The faults are injected where the bytes go down: the write() of files opened through pathlib
(every text and JSON writer, and metrics.jsonl's append) writes half of what it is given and
then fails with no file name, as a real write() does; safetensors' writer (Rust, out of
Python's reach) fails with the message it gives on a full disk.
"""

import errno
import json
import os
import pathlib

import pytest
import torch

import attnlab
from attnlab.cli.main import main
from attnlab.io.cache import sha256_file
from attnlab.io.checkpoints import read_index, read_state
from tests.interop.helpers import single_thread, tiny_gpt2_folder
from tests.training.helpers import tiny_config, write_corpus

pytestmark = pytest.mark.usefixtures("isolated_cache", single_thread.__name__)

CODES = pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
_REAL_OPEN = pathlib.Path.open


class _FailingFile:
    """A file whose write() puts down half of what it is given and then fails."""

    def __init__(self, file, code):
        self._file, self._code = file, code

    def write(self, data):
        self._file.write(data[:len(data) // 2])
        self._file.flush()
        raise OSError(self._code, os.strerror(self._code))  # a real write() names no file

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def fail_writes(monkeypatch, code, when):
    """Files opened for writing through pathlib whose path satisfies `when(path)` fail (above)."""

    def open_(self, mode="r", *args, **kwargs):
        file = _REAL_OPEN(self, mode, *args, **kwargs)
        return _FailingFile(file, code) if any(c in mode for c in "wax") and when(self) else file

    monkeypatch.setattr(pathlib.Path, "open", open_)


def fail_safetensors(monkeypatch, code, when):
    """safetensors files whose path satisfies `when(path)` fail as on a full (or failing) disk."""
    import safetensors.torch
    from safetensors import SafetensorError

    real = safetensors.torch.save_file

    def save_file(tensors, filename, metadata=None):
        if when(pathlib.Path(filename)):
            pathlib.Path(filename).write_bytes(b"half a file")  # what the writer had put down
            raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(code)} (os error {code})")
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def leftovers(folder):
    """Temporaries and folders set aside under `folder` (attnlab.io.files names them so)."""
    return sorted(str(p) for p in pathlib.Path(folder).rglob("*") if p.name.startswith((".tmp-", ".old-")))


def one_error_line(capsys, command, path, code):
    """The command's stderr ends with one line naming `path` (progress lines may come before)."""
    err = capsys.readouterr().err
    assert err.endswith(f"\nattnlab {command}: error: {path}: {os.strerror(code).lower()}\n") \
        or err == f"attnlab {command}: error: {path}: {os.strerror(code).lower()}\n", err
    assert err.count(": error:") == 1, err


# ---------------------------------------------------------------- a run: checkpoints, metrics.jsonl, tokenizer.json

def _train(tmp_path, **train):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path, max_steps=4, checkpoint_every=2, eval_every=2, **train)))
    return main(["train", str(cfg)])


@CODES
@pytest.mark.parametrize("file", ["model.safetensors", "state.json"])
def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(tmp_path, capsys, monkeypatch, code, file):
    second = lambda path: ".tmp-step-00000004-" in str(path) and path.name.startswith((file, f".tmp-{file}-"))
    (fail_safetensors if file.endswith(".safetensors") else fail_writes)(monkeypatch, code, second)
    run = tmp_path / "run"
    assert _train(tmp_path) == 2
    one_error_line(capsys, "train", run / "checkpoints" / "step-00000004" / file, code)
    assert read_index(run / "checkpoints")["latest"] == "step-00000002"
    assert read_state(run / "checkpoints" / "step-00000002")["step"] == 2  # whole: every sha256 checks
    assert not (run / "checkpoints" / "step-00000004").exists() and leftovers(tmp_path) == []
    assert not (run / ".attnlab.lock").exists()


@CODES
def test_metrics_jsonl_that_cannot_be_appended_to_keeps_whole_lines(tmp_path, capsys, monkeypatch, code):
    appends = []

    def third_append(path):
        appends.extend([path] if path.name == "metrics.jsonl" else [])
        return len(appends) == 3

    fail_writes(monkeypatch, code, third_append)
    run = tmp_path / "run"
    assert _train(tmp_path) == 2
    one_error_line(capsys, "train", run / "metrics.jsonl", code)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 2 and all(line.endswith("\n") and json.loads(line)["step"] for line in lines)
    assert leftovers(tmp_path) == []


@CODES
def test_a_runs_tokenizer_that_cannot_be_written_is_named(tmp_path, capsys, monkeypatch, code):
    fail_writes(monkeypatch, code, lambda path: path.name.startswith(".tmp-tokenizer.json-"))
    assert _train(tmp_path) == 2
    one_error_line(capsys, "train", tmp_path / "run" / "tokenizer.json", code)
    assert leftovers(tmp_path) == [] and not (tmp_path / "run" / "tokenizer.json").exists()


@CODES
def test_attnlab_tokenizer_train_onto_an_earlier_file_keeps_it(tmp_path, capsys, monkeypatch, code):
    corpus, _ = write_corpus(tmp_path)
    out = tmp_path / "tok.json"
    assert main(["tokenizer", "train", str(corpus), "--kind", "char", "--output", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    fail_writes(monkeypatch, code, lambda path: path.name.startswith(".tmp-tok.json-"))
    assert main(["tokenizer", "train", str(corpus), "--kind", "word", "--output", str(out)]) == 2
    one_error_line(capsys, "tokenizer", out, code)
    assert out.read_bytes() == before and leftovers(tmp_path) == []


# ---------------------------------------------------------------- exports

@pytest.fixture
def export(tmp_path, capsys):
    """An attnlab folder `attnlab convert` wrote from a tiny GPT-2 (the hf folder beside it), and
    the sha256 of each of its files."""
    tiny_gpt2_folder(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ours"), "--to", "attnlab"]) == 0
    capsys.readouterr()
    return tmp_path / "ours", {p.name: sha256_file(p) for p in (tmp_path / "ours").iterdir()}


@CODES
@pytest.mark.parametrize("file", ["model.safetensors", "config.json"])
def test_attnlab_convert_onto_an_earlier_export_keeps_it(tmp_path, capsys, monkeypatch, export, code, file):
    out, before = export
    in_temporary = lambda path: path.parent.name.startswith(".tmp-ours-") and path.name == file
    (fail_safetensors if file.endswith(".safetensors") else fail_writes)(monkeypatch, code, in_temporary)
    assert main(["convert", str(tmp_path / "hf"), str(out), "--to", "attnlab"]) == 2
    # a file of safetensors' writer is named; a buffered write() names no file: the export is
    one_error_line(capsys, "convert", out / file if file.endswith(".safetensors") else out, code)
    assert {p.name: sha256_file(p) for p in out.iterdir()} == before and leftovers(tmp_path) == []


@CODES
def test_attnlab_save_onto_an_earlier_folder_keeps_it(tmp_path, monkeypatch, export, code):
    out, before = export
    model = attnlab.load(out)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # other weights: a write that went through would show
    fail_safetensors(monkeypatch, code, lambda path: path.parent.name.startswith(".tmp-ours-"))
    with pytest.raises(OSError) as info:
        attnlab.save(model, out)
    assert (info.value.errno, info.value.filename) == (code, str(out / "model.safetensors"))
    assert {p.name: sha256_file(p) for p in out.iterdir()} == before and leftovers(tmp_path) == []
