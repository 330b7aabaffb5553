"""`attnlab train --nnodes 2` through torchrun's rendezvous. Two launchers on this machine, meeting
over loopback, stand for two machines of one process each: they take exactly the steps of one
process with twice the gradient accumulation, rank 0 alone writes the run folder, and one process
resumes the run from its checkpoint to the end an uninterrupted run reaches. Also: the launcher's
flags, where they may stand, and the errors for bad values (before any process starts)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli.main import main
from attnlab.io.checkpoints import checkpoint_name
from attnlab.parallel.launch import Nodes, free_port, pop_launch, split_endpoint, torchrun_command
from attnlab.training import TrainConfig, Trainer
from tests.training.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]
STEPS, MORE = 4, 2  # the two-machine run's steps, then the steps the one-process resume adds


def _config(folder: Path, out: Path, grad_accum: int, max_steps: int = STEPS) -> dict:
    cfg = tiny_config(folder, out_dir=str(out), max_steps=max_steps, eval_every=STEPS, checkpoint_every=2,
                      grad_accum=grad_accum)
    cfg["model"]["dropout"] = 0.0  # ranks draw dropout masks from their own generators
    cfg["schedule"] = {"name": "constant", "warmup_steps": 0}  # the same rates whatever max_steps says
    return cfg


def _process_tree(pid: int) -> list[int]:
    """pid and every process below it (read from /proc; torchrun starts its ranks in new sessions,
    so killing the launcher's process group alone would leave them behind)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    return tree


def _launch_nodes(argvs: list[list[str]], folder: Path, timeout_s: float) -> list[tuple[int | None, str]]:
    """Run `attnlab ARGV` for each ARGV at once (one launcher per "machine"); (exit code, output)
    each. Whatever still runs at the deadline is killed with everything it started."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ATTNLAB_CACHE": str(folder / "cache")}
    logs = [folder / f"node{i}.log" for i in range(len(argvs))]
    procs = []
    try:
        for argv, log in zip(argvs, logs):
            with open(log, "w") as out:
                procs.append(subprocess.Popen([sys.executable, "-m", "attnlab.cli.main", *argv], stdout=out,
                                              stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                for pid in _process_tree(p.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            p.wait()
    return [(p.returncode if p.returncode is not None else None, log.read_text()) for p, log in zip(procs, logs)]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module", params=["static", pytest.param("c10d", marks=pytest.mark.slow)])
def two_nodes(request, tmp_path_factory):
    """The two-machine run: with --node-rank (static rendezvous), or numbered as they meet (c10d)."""
    folder = tmp_path_factory.mktemp(f"nodes-{request.param}")
    (folder / "run.json").write_text(json.dumps(_config(folder / "data", folder / "run", grad_accum=1)))
    endpoint = f"127.0.0.1:{free_port()}"
    argvs = [["train", str(folder / "run.json"), "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", endpoint]
             + (["--node-rank", str(rank)] if request.param == "static" else []) for rank in (0, 1)]
    return folder, _launch_nodes(argvs, folder, timeout_s=240)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process with grad_accum 2, run straight to STEPS + MORE."""
    folder = tmp_path_factory.mktemp("single")
    trainer = Trainer(TrainConfig.from_dict(_config(folder / "data", folder / "run", 2, STEPS + MORE)),
                      log=lambda text: None, show_progress=False)
    trainer.fit()
    return folder / "run", {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_two_machines_take_the_steps_of_one_process_with_double_accumulation(two_nodes, single):
    folder, launched = two_nodes
    for code, output in launched:
        assert code == 0, output[-3000:]
    assert sum("summary:" in output for _, output in launched) == 1  # rank 0 prints; the other rank is silent
    run = folder / "run"
    for step in (2, STEPS):
        assert (run / "checkpoints" / checkpoint_name(step)).is_dir()
    train = [m for m in _metrics(run) if "train_loss" in m]
    assert [m["step"] for m in train] == list(range(1, STEPS + 1))  # written once, by rank 0
    reference = [m for m in _metrics(single[0]) if "train_loss" in m][:STEPS]
    for ours, theirs in zip(train, reference):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-6, abs=1e-6), (ours, theirs)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5, abs=1e-6), (ours, theirs)


def test_the_two_machine_run_resumes_in_one_process(two_nodes, single, capsys):
    folder, launched = two_nodes
    assert all(code == 0 for code, _ in launched), launched[0][1][-3000:]
    run = folder / "run"
    # one process keeps the batches of 2 ranks x grad_accum 1 with grad_accum 2
    assert main(["train", "--resume", str(run), f"--train.max_steps={STEPS + MORE}", "--train.grad_accum=2"]) == 0
    capsys.readouterr()
    train = [m for m in _metrics(run) if "train_loss" in m]
    assert [m["step"] for m in train] == list(range(1, STEPS + MORE + 1))  # went on from step STEPS
    reference = [m for m in _metrics(single[0]) if "train_loss" in m]
    for ours, theirs in zip(train[STEPS:], reference[STEPS:]):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-6, abs=1e-6), (ours, theirs)
    resumed = attnlab.load(run).state_dict()  # the run folder: its latest checkpoint
    for name, tensor in single[1].items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")


def test_launch_flags_are_taken_out_in_either_form_the_last_one_winning():
    nproc, nodes, rest = pop_launch(["--optim.lr", "1e-3", "--nnodes", "2", "--rdzv-endpoint=node0:29500",
                                     "--nproc", "4", "--node-rank=1", "--rdzv-id", "job7", "--resume"])
    assert (nproc, nodes, rest) == (4, Nodes(2, "node0:29500", 1, "job7"), ["--optim.lr", "1e-3", "--resume"])
    assert pop_launch(["--nnodes=1", "--nnodes", "3", "--rdzv-endpoint", "h:1"])[1].count == 3
    assert pop_launch([]) == (1, Nodes(), [])


def test_torchrun_is_told_the_machines_and_the_rendezvous(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cmd = torchrun_command(8, ["train", "run.json"], Nodes(2, "node0:29500"))
    assert cmd[3:9] == ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500", "--rdzv-id=attnlab",
                        "--nproc-per-node=8", "-m"] and "--standalone" not in cmd
    cmd = torchrun_command(1, ["train", "run.json"], Nodes(3, "[fe80::1]:29500", rank=2, run_id="r1"))
    assert cmd[3:9] == ["--nnodes=3", "--rdzv-backend=static", "--node-rank=2", "--rdzv-endpoint=[fe80::1]:29500",
                        "--rdzv-id=r1", "--nproc-per-node=1"]
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # every machine of a SLURM job shares its id
    assert "--rdzv-id=4242" in torchrun_command(1, ["train"], Nodes(2, "node0:29500"))
    assert torchrun_command(2, ["train"], Nodes(1))[3:5] == ["--standalone", "--nproc-per-node=2"]


@pytest.mark.parametrize("text, expected", [("node0:29500", ("node0", 29500)), ("10.0.0.7:1", ("10.0.0.7", 1)),
                                            ("[::1]:65535", ("::1", 65535))])
def test_endpoints(text, expected):
    assert split_endpoint(text) == expected


@pytest.mark.parametrize("flags, message", [
    (["--nnodes", "0"], "--nnodes expects a positive integer, got '0'"),
    (["--nnodes", "two"], "--nnodes expects a positive integer, got 'two'"),
    (["--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0"], "--rdzv-endpoint expects HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0:"], "--rdzv-endpoint expects HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", ":29500"], "--rdzv-endpoint expects HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0:70000"], "--rdzv-endpoint expects HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "::1:29500"], "--rdzv-endpoint expects HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--node-rank", "2"],
     "--node-rank expects an integer from 0 to 1 (--nnodes 2), got 2"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--node-rank", "-1"], "--node-rank expects an integer from 0 to 1"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-id", "my run"], "--rdzv-id expects a name without spaces"),
    (["--nproc", "0", "--nnodes", "2"], "--nproc expects a positive integer, got '0'"),
])
@pytest.mark.parametrize("before_config", [False, True])
def test_bad_launch_flags_are_refused_before_anything_starts(tmp_path, capsys, flags, message, before_config):
    (tmp_path / "run.json").write_text(json.dumps(_config(tmp_path / "data", tmp_path / "run", grad_accum=1)))
    config = [str(tmp_path / "run.json")]
    assert main(["train", *flags, *config] if before_config else ["train", *config, *flags]) == 2
    err = capsys.readouterr().err
    assert f"attnlab train: error: {message}" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_layout_is_checked_against_every_process_of_every_machine(tmp_path, capsys):
    cfg = _config(tmp_path / "data", tmp_path / "run", grad_accum=1)
    cfg["parallel"] = {"dp": 2}  # 2 processes in all: 2 on each of 2 machines is 4
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    assert main(["train", str(tmp_path / "run.json"), "--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", "h:1"]) == 2
    assert "needs 2 processes, this run has 4" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_interrupted_run_on_several_machines_names_their_flags(monkeypatch):
    from attnlab.cli.train import _resume_line

    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _resume_line("runs/x") == ("attnlab train --resume runs/x --nproc 4 --nnodes 2 --rdzv-endpoint HOST:PORT "
                                      "(on every machine)")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert _resume_line("runs/x") == "attnlab train --resume runs/x --nproc 8"


def test_the_launcher_passes_its_machines_to_torchrun_and_warns_of_tp_across_them(tmp_path, capsys, monkeypatch):
    import attnlab.parallel.launch as launch

    started = []
    monkeypatch.setattr(launch, "relaunch", lambda nproc, argv, nodes=None: started.append((nproc, argv, nodes)) or 0)
    cfg = _config(tmp_path / "data", tmp_path / "run", grad_accum=1)
    cfg["parallel"] = {"tp": 2}
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    run = str(tmp_path / "run.json")
    assert main(["train", "--nnodes", "2", "--rdzv-endpoint", "h:1", run, "--nproc", "2", "--optim.lr", "1e-3"]) == 0
    assert main(["train", run, "--nproc", "1", "--nnodes=2", "--rdzv-endpoint=h:1", "--node-rank", "1"]) == 0
    assert started == [(2, ["train", run, "--optim.lr", "1e-3"], Nodes(2, "h:1")),  # the flags stay here
                       (1, ["train", run], Nodes(2, "h:1", rank=1))]
    err = capsys.readouterr().err
    assert err.count("parallel.tp=2 does not divide --nproc 1: tensor-parallel groups span machines") == 1, err
