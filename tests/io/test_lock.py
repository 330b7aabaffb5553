"""attnlab.io.lock: one writer per folder — a live holder refuses, a stale lock is taken over,
the file goes on every exit."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from attnlab.io.lock import LOCK_NAME, RunLock, RunLockedError, pid_alive, read_lock


def _write_lock(folder, **record):
    folder.mkdir(parents=True, exist_ok=True)
    holder = {"pid": 1, "host": socket.gethostname(), "started": "2024-01-01 00:00:00",
              "command": "attnlab train a.json", "token": "theirs", **record}
    (folder / LOCK_NAME).write_text(json.dumps(holder))
    return holder


@pytest.fixture
def sleeper():
    """A live process that is not this one: its PID stands for another run."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the PID runs nothing now
    return proc.pid


def test_the_lock_records_its_holder_and_goes_on_release(tmp_path):
    folder = tmp_path / "run"
    with RunLock(folder, command="attnlab train x.json") as lock:
        holder = read_lock(lock.path)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        assert holder["command"] == "attnlab train x.json" and holder["started"][:2] == "20"
    assert not (folder / LOCK_NAME).exists()
    assert not folder.exists()  # the lock made the folder and nothing was written there: no trace


@pytest.mark.parametrize("exit_with", [RuntimeError, KeyboardInterrupt])
def test_the_lock_is_released_on_an_error_and_on_ctrl_c(tmp_path, exit_with):
    (tmp_path / "run").mkdir()
    with pytest.raises(exit_with):
        with RunLock(tmp_path / "run"):
            raise exit_with()
    assert not (tmp_path / "run" / LOCK_NAME).exists() and (tmp_path / "run").is_dir()  # its own folder stays


def test_a_live_holder_refuses_and_keeps_its_lock(tmp_path, sleeper):
    holder = _write_lock(tmp_path / "run", pid=sleeper.pid)
    before = (tmp_path / "run" / LOCK_NAME).read_bytes()
    with pytest.raises(RunLockedError, match=f"in use by another run: PID {sleeper.pid} on host") as err:
        RunLock(tmp_path / "run", what="train.out_dir").acquire()
    assert "train.out_dir=" in str(err.value) and holder["command"] in str(err.value)
    assert "\n" not in str(err.value)
    assert (tmp_path / "run" / LOCK_NAME).read_bytes() == before


def test_a_stale_lock_on_this_host_is_taken_over_with_a_note(tmp_path):
    _write_lock(tmp_path / "run", pid=_dead_pid())
    notes = []
    with RunLock(tmp_path / "run", note=notes.append) as lock:
        assert read_lock(lock.path)["pid"] == os.getpid()
        assert len(notes) == 1 and "took over" in notes[0] and "no longer runs" in notes[0]
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert not [p for p in (tmp_path / "run").iterdir()]  # nothing set aside is left behind


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="needs /proc to read start times")
def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path):
    # a live PID (this process) whose recorded start time is another process's: the PID was reused
    _write_lock(tmp_path / "run", pid=os.getpid(), proc_start=1)
    notes = []
    with RunLock(tmp_path / "run", note=notes.append):
        assert notes and "took over" in notes[0]
    assert pid_alive(os.getpid()) and not pid_alive(os.getpid(), proc_start=1)


def test_a_lock_from_another_host_is_refused_with_how_to_remove_it(tmp_path):
    _write_lock(tmp_path / "run", pid=_dead_pid(), host="some-other-host")
    with pytest.raises(RunLockedError, match="some-other-host") as err:
        RunLock(tmp_path / "run").acquire()
    assert f"rm {tmp_path / 'run' / LOCK_NAME}" in str(err.value)
    assert (tmp_path / "run" / LOCK_NAME).exists()


def test_an_unreadable_lock_is_waited_on_while_fresh_and_taken_over_when_old(tmp_path, monkeypatch):
    import attnlab.io.lock as lock_module

    monkeypatch.setattr(lock_module, "_FRESH_S", 60.0)
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / LOCK_NAME
    path.write_text("")  # a holder between creating the file and writing it
    with pytest.raises(RunLockedError, match="try again"):
        RunLock(tmp_path / "run").acquire()
    old = time.time() - 120  # ... or one that crashed right there
    os.utime(path, (old, old))
    notes = []
    with RunLock(tmp_path / "run", note=notes.append):
        assert "unreadable" in notes[0]


def test_the_lock_is_reentrant_within_a_process_and_exclusive_across(tmp_path):
    outer = RunLock(tmp_path / "run").acquire()
    with RunLock(tmp_path / "run"):  # the command line holds it; the trainer takes it again
        assert outer.path.exists()
    assert outer.path.exists()  # the inner release leaves the outer holder's file
    other = subprocess.run([sys.executable, "-c", (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('lock', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "try: m.RunLock(sys.argv[2]).acquire()\nexcept m.RunLockedError as e: print(e); sys.exit(3)"),
        lock_module_path(), str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert other.returncode == 3 and f"PID {os.getpid()}" in other.stdout
    outer.release()
    assert not outer.path.exists()


def test_release_never_removes_a_lock_another_run_now_holds(tmp_path):
    lock = RunLock(tmp_path / "run").acquire()
    _write_lock(tmp_path / "run", pid=os.getpid() + 1)  # replaced behind its back (a user removed it, another took it)
    lock.release()
    assert read_lock(tmp_path / "run" / LOCK_NAME)["token"] == "theirs"


def test_a_file_where_the_folder_should_be_is_named(tmp_path):
    (tmp_path / "run").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        RunLock(tmp_path / "run", what="out_dir").acquire()


def lock_module_path():
    import attnlab.io.lock

    return attnlab.io.lock.__file__


def test_a_take_over_that_lost_the_race_puts_the_new_lock_back(tmp_path):
    # judged stale (token "old"), but another process replaced it before the take-over moved it
    _write_lock(tmp_path / "run", pid=os.getpid(), token="fresh")
    notes = []
    RunLock(tmp_path / "run", note=notes.append)._take_over({"token": "old"}, "a stale lock")
    assert read_lock(tmp_path / "run" / LOCK_NAME)["token"] == "fresh" and not notes
    assert [p.name for p in (tmp_path / "run").iterdir()] == [LOCK_NAME]


@pytest.mark.parametrize("mask", [0o022, 0o002], ids=lambda m: f"umask-{m:03o}")
def test_the_lock_file_follows_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        with RunLock(tmp_path / "run", command="x"):
            mode = (tmp_path / "run" / LOCK_NAME).stat().st_mode & 0o777
    finally:
        os.umask(old)
    assert mode == 0o666 & ~mask
