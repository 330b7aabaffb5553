"""The one atomic file writer and the one atomic folder writer: a crash mid-write leaves the old
content, a folder attnlab did not write is never deleted, an earlier attnlab folder is replaced."""

import errno
import json
import os

import pytest

from attnlab.io import files
from attnlab.io.files import (FileFormatError, atomic_file, atomic_folder, atomic_write_bytes, atomic_write_json,
                              atomic_write_text, read_json, read_text)


def test_text_bytes_and_json_are_written(tmp_path):
    assert atomic_write_text(tmp_path / "sub" / "a.txt", "héllo\n") == tmp_path / "sub" / "a.txt"
    assert (tmp_path / "sub" / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    atomic_write_bytes(tmp_path / "b.bin", b"\0\1")
    assert (tmp_path / "b.bin").read_bytes() == b"\0\1"
    atomic_write_json(tmp_path / "c.json", {"k": "ü", "n": [1, 2]})
    text = (tmp_path / "c.json").read_text(encoding="utf-8")
    assert text.endswith("}\n") and "ü" in text and read_json(tmp_path / "c.json") == {"k": "ü", "n": [1, 2]}


@pytest.mark.parametrize("where", ["during the write", "at the rename"])
def test_a_crash_mid_write_leaves_the_old_file(tmp_path, monkeypatch, where):
    target = atomic_write_text(tmp_path / "f.json", "old")
    if where == "during the write":
        with pytest.raises(RuntimeError):
            with atomic_file(target) as tmp:
                tmp.write_text("half of the ne")
                raise RuntimeError("killed")
    else:
        def broken_replace(src, dst):
            raise OSError("disk full")

        monkeypatch.setattr(files.os, "replace", broken_replace)
        with pytest.raises(OSError, match="disk full"):
            atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.json"]  # no temporary left behind


def test_a_file_writer_refuses_a_folder(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        atomic_write_text(tmp_path / "d", "x")


def test_folder_crash_leaves_nothing_new_and_the_old_folder_whole(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_folder(tmp_path / "out") as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []
    with atomic_folder(tmp_path / "out") as tmp:
        (tmp / "config.json").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_folder(tmp_path / "out") as tmp:
            (tmp / "config.json").write_text("new")
            raise RuntimeError("crash")
    assert (tmp_path / "out" / "config.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_folder_attnlab_did_not_write_is_never_deleted(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.txt").write_text("mine")
    (docs / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"docs.*did not write.*notes\.txt"):
        with atomic_folder(docs) as tmp:
            (tmp / "config.json").write_text("{}")
            (tmp / "model.safetensors").write_bytes(b"")
    assert sorted(p.name for p in docs.iterdir()) == ["config.json", "notes.txt"]
    assert (docs / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["docs"]  # the temporary is gone too
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        with atomic_folder(tmp_path / "file"):
            pytest.fail("a file target must be refused before the block runs")


def test_an_earlier_attnlab_folder_and_an_empty_folder_are_replaced(tmp_path):
    with atomic_folder(tmp_path / "m") as tmp:
        (tmp / "config.json").write_text("1")
        (tmp / "tokenizer.json").write_text("{}")
    with atomic_folder(tmp_path / "m") as tmp:  # the same files and more: replaced whole
        (tmp / "config.json").write_text("2")
        (tmp / "tokenizer.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"w")
    assert json.loads((tmp_path / "m" / "config.json").read_text()) == 2
    (tmp_path / "empty").mkdir()
    with atomic_folder(tmp_path / "empty") as tmp:
        (tmp / "a").write_text("a")
    assert [p.name for p in (tmp_path / "empty").iterdir()] == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "m"]


def test_read_json_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(FileFormatError, match=r"bad.json: expected a JSON object \(is not valid JSON"):
        read_json(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        read_json(tmp_path / "list.json")
    (tmp_path / "latin1.json").write_bytes('{"k": "é"}'.encode("latin-1"))
    with pytest.raises(FileFormatError, match=r"latin1.json: expected a JSON object \(byte 0xe9 at offset 7"):
        read_json(tmp_path / "latin1.json")
    with pytest.raises(IsADirectoryError) as info:
        read_json(tmp_path)
    assert info.value.filename == str(tmp_path)


def test_read_text_names_the_file_and_what_it_should_hold(tmp_path):
    (tmp_path / "a.txt").write_bytes("héllo\r\nworld".encode("utf-8"))
    assert read_text(tmp_path / "a.txt") == "héllo\nworld"
    (tmp_path / "b.txt").write_bytes(b"ok\n\xff\xfe")
    expected = r"b.txt: expected a corpus \(byte 0xff at offset 3 is not UTF-8\)"
    with pytest.raises(FileFormatError, match=expected) as info:
        read_text(tmp_path / "b.txt", expected="a corpus")
    assert info.value.path == tmp_path / "b.txt" and info.value.expected == "a corpus"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_and_folders_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert files.umask() == mask
        atomic_write_text(tmp_path / "f.txt", "x")
        with atomic_file(tmp_path / "g.bin") as tmp:
            tmp.write_bytes(b"y")
        with atomic_folder(tmp_path / "d") as tmp:
            (tmp / "inner.txt").write_text("z")
        open(tmp_path / "plain.txt", "w").close()  # the reference: what open() and mkdir give
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(old)
    mode = lambda p: p.stat().st_mode & 0o777
    assert mode(tmp_path / "f.txt") == mode(tmp_path / "g.bin") == mode(tmp_path / "plain.txt") == 0o666 & ~mask
    assert mode(tmp_path / "d") == mode(tmp_path / "plain") == 0o777 & ~mask
    assert mode(tmp_path / "d" / "inner.txt") == 0o666 & ~mask


# ---------------------------------------------------------------- strict JSON

def test_json_text_writes_nan_and_infinities_as_null():
    data = {"loss": float("nan"), "ppl": float("inf"), "low": -float("inf"), "ok": 1.5, "n": 3, "flag": True,
            "nested": [{"x": float("nan")}, (float("inf"), 2.0)], "text": "NaN"}
    text = files.json_text(data, sort_keys=True)
    assert json.loads(text) == {"loss": None, "ppl": None, "low": None, "ok": 1.5, "n": 3, "flag": True,
                                "nested": [{"x": None}, [None, 2.0]], "text": "NaN"}
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    assert data["loss"] != data["loss"]  # the caller's data is left as it was


def test_atomic_write_json_is_strict(tmp_path):
    atomic_write_json(tmp_path / "s.json", {"val_loss": float("nan")})
    text = (tmp_path / "s.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert read_json(tmp_path / "s.json") == {"val_loss": None}


def test_append_line_adds_whole_lines(tmp_path):
    files.append_line(tmp_path / "m.jsonl", '{"step": 1}')
    files.append_line(tmp_path / "m.jsonl", '{"step": 2}')
    assert (tmp_path / "m.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'


# ---------------------------------------------------------------- what killed writers leave behind

def _dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def _leftover(folder, target, pid, *, host=None, kind=".tmp-", is_dir=False):
    """An entry named as a writer `pid` on `host` (default: this one) would have named it."""
    path = folder / f"{kind}{target}-{pid}-{host or files._host_tag()}-abc123_x"
    if is_dir:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"half")
    else:
        path.write_bytes(b"half")
    return path


@pytest.mark.parametrize("writer", ["file", "folder"])
def test_a_killed_writers_temporaries_go_with_the_next_write_a_live_ones_stay(tmp_path, writer):
    import subprocess
    import sys

    target = "out.json" if writer == "file" else "model"
    dead = _leftover(tmp_path, target, _dead_pid(), is_dir=writer == "folder")
    live_writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kept = [_leftover(tmp_path, target, live_writer.pid, is_dir=writer == "folder"),  # a live writer's
                _leftover(tmp_path, target, _dead_pid(), host="0badbeef"),  # another host's: cannot be judged
                tmp_path / f".tmp-{target}-x1y2z3ab",  # an older attnlab's name: no writer in it
                _leftover(tmp_path, f"{target}-2", _dead_pid())]  # another target's
        kept[2].write_bytes(b"")
        if writer == "file":
            atomic_write_text(tmp_path / target, "{}")
        else:
            with atomic_folder(tmp_path / target) as tmp:
                (tmp / "config.json").write_text("{}")
        assert not dead.exists() and all(p.exists() for p in kept)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target, *(p.name for p in kept)])
    finally:
        live_writer.kill()
        live_writer.wait()


def test_a_folder_set_aside_by_a_killed_swap_stays_until_the_target_is_whole_again(tmp_path):
    aside = _leftover(tmp_path, "model", _dead_pid(), kind=".old-", is_dir=True)  # killed between the renames
    with pytest.raises(RuntimeError):
        with atomic_folder(tmp_path / "model") as tmp:  # a write that fails: the old content is all there is
            raise RuntimeError("crash")
    assert aside.exists()
    with atomic_folder(tmp_path / "model") as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


# ---------------------------------------------------------------- errors name the file, not its temporary

@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_a_failed_write_names_the_target(tmp_path, code):
    atomic_write_text(tmp_path / "f.txt", "old")
    with pytest.raises(OSError) as info:
        with atomic_file(tmp_path / "f.txt"):
            raise OSError(code, os.strerror(code))  # what a buffered write() raises: no file name
    assert (info.value.errno, info.value.filename) == (code, str(tmp_path / "f.txt"))
    with pytest.raises(OSError) as info:
        with atomic_folder(tmp_path / "m") as tmp:
            (tmp / "a.bin").write_bytes(b"x")
            raise OSError(code, os.strerror(code), str(tmp / "a.bin"))
    assert (info.value.errno, info.value.filename) == (code, str(tmp_path / "m" / "a.bin"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    assert (tmp_path / "f.txt").read_text() == "old"


def test_an_error_that_is_not_the_writes_keeps_its_own_words(tmp_path):
    with pytest.raises(ConnectionResetError) as info:
        with atomic_file(tmp_path / "download.bin"):  # e.g. a download written as it arrives
            raise ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
    assert info.value.filename is None
