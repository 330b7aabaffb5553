"""`attnlab convert`: Hugging Face folder -> attnlab folder -> Hugging Face folder, same outputs;
an `attnlab train` run or one of its checkpoints -> a Hugging Face folder transformers loads
without a warning about token ids, with attnlab's logits; anything else is a one-line error."""

import json
import shutil

import pytest
import torch
import transformers

import attnlab
from attnlab.cli.main import main
from attnlab.interop.serialization import load
from attnlab.io.weights import load_state, read_safetensors
from tests.interop.helpers import TOL, real_max_diff, single_thread, tiny_gpt2_folder
from tests.interop.test_export_special import token_ids, token_messages, transformers_messages
from tests.training.helpers import tiny_config

pytestmark = pytest.mark.usefixtures(single_thread.__name__)


@pytest.fixture
def hf_gpt2(tmp_path):
    return tiny_gpt2_folder(tmp_path / "hf"), tmp_path


def test_both_directions(hf_gpt2, capsys):
    hf, tmp = hf_gpt2
    ids = torch.randint(0, 40, (2, 9))
    assert main(["convert", str(tmp / "hf"), str(tmp / "ours")]) == 0
    assert json.loads((tmp / "ours" / "config.json").read_text())["arch"] == "decoder"
    assert main(["convert", str(tmp / "ours"), str(tmp / "back"), "--to", "hf"]) == 0
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp / "back").eval()
    with torch.no_grad():
        want = hf(input_ids=ids).logits
        assert real_max_diff(load(tmp / "ours")(ids), want) <= TOL
        assert real_max_diff(back(input_ids=ids).logits, want) <= TOL
    captured = capsys.readouterr()
    assert "converted hf" in captured.err and captured.out == ""  # quiet: the config only on request


def test_print_config_prints_the_model_config_and_writes_nothing(hf_gpt2, capsys):
    _, tmp = hf_gpt2
    assert main(["convert", str(tmp / "hf"), str(tmp / "ours"), "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["arch"] == "decoder" and not (tmp / "ours").exists()


def test_tokenizer_is_carried_over(hf_gpt2):
    from attnlab.tokenizers import Tokenizer

    _, tmp = hf_gpt2
    tok = Tokenizer.train(["some text to learn"] * 3, kind="char", special_tokens=["<pad>", "<unk>"])
    tok.save(tmp / "hf")
    assert main(["convert", str(tmp / "hf"), str(tmp / "ours")]) == 0
    model, back = load(tmp / "ours", with_tokenizer=True)
    assert back.encode("text") == tok.encode("text")
    assert main(["convert", str(tmp / "hf"), str(tmp / "plain"), "--no-tokenizer"]) == 0
    assert not (tmp / "plain" / "tokenizer.json").exists()


def test_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    (tmp_path / "neox").mkdir()
    (tmp_path / "neox" / "config.json").write_text(json.dumps({"model_type": "gpt_neox",
                                                                "architectures": ["GPTNeoXForCausalLM"]}))
    (tmp_path / "neox" / "model.safetensors").write_bytes(b"")
    assert main(["convert", str(tmp_path / "neox"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture 'GPTNeoXForCausalLM'" in err
    assert not (tmp_path / "out").exists()


TEXT = "the king hath a crown"
EXACT = 1e-5  # a run exported to transformers: the same fp32 weights, the same arithmetic


@pytest.fixture(scope="module", params=["char", "bpe"])
def run(request, tmp_path_factory):
    """A run folder `attnlab train` wrote (GPT-2-shaped: learned positions), with checkpoints at
    steps 1 and 2 and a char tokenizer (pad, bos = eos) or a BPE one (bos = eos, no pad)."""
    root = tmp_path_factory.mktemp(f"{request.param}-run")
    cfg = tiny_config(root, max_steps=2, eval_every=1, checkpoint_every=1, keep_last=2)
    cfg["model"]["position"] = {"scheme": "learned", "max_len": 32}
    cfg["data"]["tokenizer"] = {"kind": request.param, "vocab_size": 280 if request.param == "bpe" else None}
    (root / "run.json").write_text(json.dumps(cfg))
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLAB_CACHE", str(root / "cache"))
        assert main(["train", str(root / "run.json")]) == 0
    torch.set_num_threads(threads)
    return root / "run"


def _load_hf(folder):
    """(GPT2LMHeadModel, transformers tokenizer, messages logged or warned while loading them)."""
    with transformers_messages() as messages:
        model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return model, tokenizer, messages


def _logits(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return getattr(out, "logits", out)


def test_a_run_folder_converts_its_best_checkpoint(run, tmp_path, capsys):
    assert main(["convert", str(run), str(tmp_path / "hf")]) == 0
    best = json.loads((run / "checkpoints" / "index.json").read_text())["best"]
    assert f"(checkpoint {best})" in capsys.readouterr().err
    hf, hf_tok, messages = _load_hf(tmp_path / "hf")
    assert token_messages(messages) == []
    ours, tok = attnlab.load(run, with_tokenizer=True)  # the run's best checkpoint, read by attnlab
    ids = tok.encode(TEXT)
    assert real_max_diff(_logits(hf, ids), _logits(ours, ids)) <= EXACT
    vocab = hf.config.vocab_size
    assert all(v is None or 0 <= v < vocab for v in token_ids(hf.config).values())
    assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert hf_tok.encode(TEXT, add_special_tokens=False) == ids and len(hf_tok) == tok.vocab_size


def test_a_checkpoint_folder_converts_that_checkpoint(run, tmp_path):
    best = json.loads((run / "checkpoints" / "index.json").read_text())["best"]
    other = next(p for p in sorted((run / "checkpoints").glob("step-*")) if p.name != best)
    assert main(["convert", str(other), str(tmp_path / "hf")]) == 0
    hf, _, messages = _load_hf(tmp_path / "hf")
    assert token_messages(messages) == []
    # the reference: the run's model config with this checkpoint's tensors, read directly
    model_config = json.loads((run / "config.json").read_text())["model"]
    reference = attnlab.build_model(attnlab.ModelConfig.from_dict(model_config))
    load_state(reference, read_safetensors(other / "model.safetensors"), source=str(other))
    _, tok = attnlab.load(run, with_tokenizer=True)
    ids = tok.encode(TEXT)
    got = _logits(hf, ids)
    assert real_max_diff(got, _logits(reference.eval(), ids)) <= EXACT
    assert real_max_diff(got, _logits(attnlab.load(run), ids)) > 1e-4  # not the best checkpoint's weights
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def _lonely_checkpoint(run, tmp_path):
    """A checkpoint copied out of its run: no config.json two folders up."""
    source = sorted((run / "checkpoints").glob("step-*"))[0]
    return shutil.copytree(source, tmp_path / "copied" / source.name)


def _empty_run(run, tmp_path):
    (tmp_path / "fresh" / "checkpoints").mkdir(parents=True)
    shutil.copy(run / "config.json", tmp_path / "fresh" / "config.json")
    return tmp_path / "fresh"


def _unknown_config(run, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"hidden": 3}))
    return tmp_path / "other"


def _notes(run, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("not a model")
    return tmp_path / "notes"


@pytest.mark.parametrize("make, message", [
    (_notes, "is not a model folder: expected config.json"),
    (_unknown_config, "nor an `attnlab train` run config (no 'model')"),
    (_lonely_checkpoint, "config.json is missing: a checkpoint is read with the config.json of its run"),
    (_empty_run, "no checkpoint under"),
    (lambda run, tmp_path: run / "metrics.jsonl", "is a file, not a model folder"),
], ids=["no-model-files", "unknown-config", "checkpoint-outside-its-run", "run-without-checkpoints", "a-file"])
@pytest.mark.parametrize("run", ["char"], indirect=True)  # one run is enough to copy from
def test_a_folder_that_is_no_model_is_a_one_line_error(run, tmp_path, capsys, make, message):
    source = make(run, tmp_path)
    assert main(["convert", str(source), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab convert: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


_KILLED_MID_WRITE = """
import os, signal, sys
from attnlab.interop import serialization

def write_then_die(*args, **kwargs):  # SIGKILL with the new export half written: no cleanup runs
    serialization_write(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)

serialization_write, serialization.write_safetensors = serialization.write_safetensors, write_then_die
from attnlab.cli.main import main
main(["convert", sys.argv[1], sys.argv[2], "--to", "attnlab"])
"""


def test_a_convert_killed_mid_write_leaves_nothing_once_the_export_is_written_again(hf_gpt2):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    hf, tmp = hf_gpt2
    assert main(["convert", str(tmp / "hf"), str(tmp / "ours")]) == 0  # the earlier export
    root = Path(__file__).resolve().parents[2]
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_WRITE, str(tmp / "hf"), str(tmp / "ours")], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [p.name for p in tmp.glob(".tmp-ours-*")], "the killed writer left no temporary: nothing tested"
    assert main(["convert", str(tmp / "hf"), str(tmp / "ours")]) == 0
    assert sorted(p.name for p in tmp.iterdir()) == ["hf", "ours"]
    ids = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        assert real_max_diff(load(tmp / "ours")(ids), hf(input_ids=ids).logits) <= TOL
