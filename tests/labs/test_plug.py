"""A passing lab piece plugs into attnlab's registries: the student's kernel and rotary scheme run
inside models, cached decoding, `attnlab train` and `attnlab generate`; a model saved with one
and loaded without it says which lab to load and how."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import attnlab
from attnlab import ModelConfig, build_model, labs
from attnlab.cli.main import main
from attnlab.config.validate import ConfigError
from attnlab.decoding import generate
from attnlab.decoding.runner import make_runner
from attnlab.nn.kernels import KERNELS
from attnlab.nn.kernels.eager import EagerKernel
from attnlab.nn.positions import POSITION_SCHEMES
from tests.training.helpers import tiny_config

STUDENTS = Path(__file__).parent / "students"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv("ATTNLAB_LABS", "")  # restored (unset) after the test, whatever main() set
    yield
    labs.forget()


@pytest.fixture
def folder(tmp_path):
    """A student's labs folder: the kernel and the rotary scheme solved, the layer only started."""
    out = tmp_path / "labs"
    out.mkdir()
    for name in ("sdpa.py", "rotary.py"):
        shutil.copy(STUDENTS / name, out / name)
    labs.start("pre-ln-layer", out)
    return out


def _config(kernel: str, scheme: str) -> ModelConfig:
    return ModelConfig(arch="decoder", vocab_size=40, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                       norm_placement="pre", position={"scheme": scheme, "rotary_dim": 4},
                       attention={"kernel": kernel, "num_kv_heads": 2})


def test_use_registers_the_passing_pieces_only(folder):
    registered, skipped = labs.use(folder)
    assert registered == {"sdpa": ["attention.kernel=lab-sdpa"], "rotary": ["position.scheme=lab-rotary"]}
    assert skipped == {}  # the started layer has no seam: neither registered nor skipped
    labs.forget()
    assert "lab-sdpa" not in KERNELS and "lab-rotary" not in POSITION_SCHEMES
    (folder / "rotary.py").write_text("def rotate(x, positions, *, base=10000.0):\n    return x\n")
    registered, skipped = labs.use(folder)
    assert list(registered) == ["sdpa"] and "lab-rotary" not in POSITION_SCHEMES
    assert "check(s) fail (equals attnlab's RotaryEmbedding" in skipped["rotary"]
    with pytest.raises(labs.LabError, match="lab folder .*nowhere does not exist"):
        labs.use(folder / "nowhere")


def test_the_students_pieces_run_inside_a_model_and_its_cached_decoding(folder):
    labs.use(folder)
    torch.manual_seed(0)
    model = build_model(_config("lab-sdpa", "lab-rotary")).eval()
    reference = build_model(_config("eager", "rotary")).eval()
    reference.load_state_dict(model.state_dict())
    x = torch.randint(1, 40, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(x, mask), reference(x, mask), atol=1e-5, rtol=1e-5)
        _assert_cached_steps_equal_full(model, x)
        ours = generate(model, x, 6, attention_mask=mask, use_cache=True)
        torch.testing.assert_close(ours, generate(model, x, 6, attention_mask=mask, use_cache=False))
        torch.testing.assert_close(ours, generate(reference, x, 6, attention_mask=mask))
        torch.testing.assert_close(generate(model, x, 5, num_beams=3), generate(reference, x, 5, num_beams=3))
    # the model calls the student's function: plugged in directly (past the checks), one that
    # outputs zeros changes the logits
    with torch.no_grad():
        before = model(x, mask)
        labs.LABS["sdpa"].plug(SimpleNamespace(attention=lambda q, k, v, **kw: (torch.zeros_like(q), None)))
        assert (model(x, mask) - before).abs().max() > 1e-3
        # and the student's rotation, in the full forward and in each cached step alike: one that
        # leaves q and k as they are still decodes the same with and without the cache
        labs.LABS["sdpa"].plug(SimpleNamespace(attention=EagerKernel()))
        labs.LABS["rotary"].plug(SimpleNamespace(rotate=lambda x, positions, base: x))
        _assert_cached_steps_equal_full(model, x)
        assert not torch.equal(model(x, mask), reference(x, mask))


def _assert_cached_steps_equal_full(model, ids: torch.Tensor) -> None:
    """The decoding runner's cached steps (each layer's `step`) give the logits of a full forward."""
    runner = make_runner(model, use_cache=True, max_len=ids.shape[1])
    steps = [runner.start(ids[:, :3], None)] + [runner.step(ids[:, :L], None) for L in range(4, ids.shape[1] + 1)]
    torch.testing.assert_close(torch.stack(steps, 1), model(ids)[:, 2:], atol=1e-5, rtol=1e-5)


def test_a_model_saved_with_a_lab_piece_says_which_lab_to_load(folder, tmp_path):
    labs.use(folder)
    model = build_model(_config("lab-sdpa", "lab-rotary")).eval()
    attnlab.save(model, tmp_path / "saved")
    x = torch.randint(1, 40, (1, 5))
    with torch.no_grad():
        expected = model(x)
    labs.forget()
    with pytest.raises(ValueError, match=r"saved/config.json: .*attention.kernel: 'lab-sdpa' is the piece of lab "
                                         r"'sdpa' \(attnlab lab\), "
                                         r"not registered here: load the labs folder .* --lab DIR"):
        attnlab.load(tmp_path / "saved")
    with pytest.raises(ConfigError, match="position.scheme: 'lab-rotary' is the piece of lab 'rotary'"):
        _config("eager", "lab-rotary")
    labs.use(folder)
    with torch.no_grad():
        torch.testing.assert_close(attnlab.load(tmp_path / "saved")(x), expected)


def test_train_and_generate_with_the_students_kernel_from_the_command_line(folder, tmp_path, capsys):
    config = tiny_config(tmp_path / "data", max_steps=4, eval_every=2, checkpoint_every=2)
    config["model"]["attention"] = {"kernel": "lab-sdpa"}
    config["model"]["position"]["scheme"] = "lab-rotary"
    (tmp_path / "run.json").write_text(json.dumps(config))
    run = config["train"]["out_dir"]

    assert main(["train", str(tmp_path / "run.json")]) == 2  # without the labs folder: the lab named
    err = capsys.readouterr().err
    assert "'lab-sdpa' is the piece of lab 'sdpa'" in err and "--lab DIR" in err

    assert main(["train", str(tmp_path / "run.json"), "--lab", str(folder)]) == 0
    err = capsys.readouterr().err
    assert f"attnlab train: lab pieces from {folder}: attention.kernel=lab-sdpa, position.scheme=lab-rotary" in err
    saved = json.loads((Path(run) / "config.json").read_text())["model"]
    assert saved["attention"]["kernel"] == "lab-sdpa" and saved["position"]["scheme"] == "lab-rotary"
    losses = [json.loads(line)["train_loss"] for line in (Path(run) / "metrics.jsonl").read_text().splitlines()
              if '"train_loss"' in line]
    assert len(losses) == 4 and losses[-1] < losses[0]  # it learned

    labs.forget()
    assert main(["--lab", str(folder), "generate", run, "--prompt", "the king", "--max-new-tokens", "5",
                 "--no-stream"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the king")
    model, tokenizer = attnlab.load(run, with_tokenizer=True)
    ids = torch.tensor([tokenizer.encode("the king")])
    with torch.no_grad():
        new = generate(model.eval(), ids, 5)[0, ids.shape[1]:].tolist()
    assert tokenizer.decode(new) in out
