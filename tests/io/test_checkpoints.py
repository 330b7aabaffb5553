"""Reading a run's checkpoints back: the one `resolve_checkpoint` names is the one asked for (or
an error naming what is missing and what remains), and a checkpoint is read only with the
tokenizer it was trained with (its sha256 is in state.json), through every reader: attnlab.load,
`attnlab generate`, `attnlab eval`, `attnlab train --resume`, `attnlab convert`."""

import json
import shutil

import pytest

import attnlab
from attnlab.cli.main import main
from attnlab.io.cache import sha256_file
from attnlab.io.checkpoints import CheckpointError, read_state, resolve_checkpoint
from tests.interop.helpers import single_thread
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures(single_thread.__name__)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished runs of the same model on the same text: one with a character tokenizer,
    one with a word tokenizer (another vocabulary); checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLAB_CACHE", str(root / "cache"))
        for kind in ("char", "word"):
            cfg = tiny_config(root, out_dir=str(root / kind), max_steps=4, eval_every=2, checkpoint_every=2)
            cfg["data"]["tokenizer"] = {"kind": kind}
            (root / f"{kind}.json").write_text(json.dumps(cfg))
            assert main(["train", str(root / f"{kind}.json")]) == 0
    return root


@pytest.fixture
def run(runs, tmp_path, monkeypatch):
    """A copy of the char run (a test may break it), and the word run's tokenizer.json."""
    from attnlab.tokenizers import Tokenizer

    monkeypatch.setenv("ATTNLAB_CACHE", str(runs / "cache"))
    shutil.copytree(runs / "char", tmp_path / "run")
    other = runs / "word" / "tokenizer.json"
    assert Tokenizer.load(other).vocab_size != Tokenizer.load(tmp_path / "run" / "tokenizer.json").vocab_size
    return tmp_path / "run", other


# ---------------------------------------------------------------- the tokenizer a checkpoint was trained with

def test_each_checkpoint_records_its_runs_tokenizer(run):
    folder, _ = run
    for checkpoint in sorted((folder / "checkpoints").glob("step-*")):
        assert read_state(checkpoint)["tokenizer_sha256"] == sha256_file(folder / "tokenizer.json")


@pytest.mark.parametrize("command", [["generate", "{run}", "--prompt", "the"], ["eval", "{run}"],
                                     ["train", "--resume", "{run}"], ["convert", "{run}", "{out}"]],
                         ids=lambda c: c[0])
def test_another_runs_tokenizer_is_refused_naming_both_files(run, tmp_path, capsys, command, monkeypatch):
    folder, other = run
    shutil.copy(other, folder / "tokenizer.json")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([a.format(run=folder, out=tmp_path / "out") for a in command]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    checkpoint = folder / "checkpoints" / "step-00000004"
    assert err.startswith(f"attnlab {command[0]}: error: {folder / 'tokenizer.json'} is not the tokenizer "
                          f"{checkpoint} was trained with"), err
    assert str(checkpoint / "state.json") in err
    assert not (tmp_path / "out").exists()


def test_attnlab_load_refuses_another_runs_tokenizer(run):
    folder, other = run
    shutil.copy(other, folder / "tokenizer.json")
    for path in (folder, folder / "checkpoints", folder / "checkpoints" / "step-00000002"):
        with pytest.raises(CheckpointError, match="is not the tokenizer"):
            attnlab.load(path, with_tokenizer=True)


def test_a_checkpoint_from_before_the_hash_loads_as_it_did(run, capsys):
    folder, other = run
    for state_file in (folder / "checkpoints").glob("step-*/state.json"):
        state = json.loads(state_file.read_text())
        del state["tokenizer_sha256"]
        state_file.write_text(json.dumps(state))
    model, tokenizer = attnlab.load(folder, with_tokenizer=True)
    assert tokenizer.vocab_size == model.config.vocab_size
    assert main(["generate", str(folder), "--prompt", "the", "--max-new-tokens", "3"]) == 0


# ---------------------------------------------------------------- the checkpoint asked for, or an error

def test_a_deleted_best_checkpoint_is_an_error_naming_it_and_those_that_remain(run, capsys):
    folder, _ = run
    index = json.loads((folder / "checkpoints" / "index.json").read_text())
    assert (index["best"], index["latest"]) == ("step-00000004", "step-00000004")
    shutil.rmtree(folder / "checkpoints" / "step-00000004")
    for which in ("best", "latest"):
        with pytest.raises(CheckpointError) as info:
            resolve_checkpoint(folder, which)
        message = str(info.value)
        assert f"the {which} checkpoint {folder / 'checkpoints' / 'step-00000004'} is missing" in message
        assert "checkpoints there: step-00000002" in message and str(folder / "checkpoints" / "index.json") in message
    assert main(["generate", str(folder), "--prompt", "the", "--max-new-tokens", "3"]) == 2
    assert "step-00000004 is missing" in capsys.readouterr().err
    # what the message offers: the remaining checkpoint by its folder, or the newest once the index is gone
    assert resolve_checkpoint(folder / "checkpoints" / "step-00000002") == folder / "checkpoints" / "step-00000002"
    (folder / "checkpoints" / "index.json").unlink()
    assert resolve_checkpoint(folder, "best") == folder / "checkpoints" / "step-00000002"


def test_a_run_without_a_best_takes_its_latest(run):
    folder, _ = run
    index_file = folder / "checkpoints" / "index.json"
    index = json.loads(index_file.read_text())
    index_file.write_text(json.dumps({"latest": "step-00000002"}))  # as a run without validation writes it
    assert resolve_checkpoint(folder, "best") == folder / "checkpoints" / "step-00000002"
    assert index["best"] == "step-00000004"
