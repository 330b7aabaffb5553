import json

import pytest
import torch

from attnlab import build_model, presets
from attnlab.io.checkpoints import training_state as ck
from attnlab.io.checkpoints import CheckpointError, load_checkpoint, resolve_checkpoint, save_checkpoint
from attnlab.training.optim import build_optimizer


def _setup(seed=0):
    torch.manual_seed(seed)
    model = build_model(presets.get("tiny-decoder"))
    opt = build_optimizer(model, lr=0.01)
    x = torch.randint(0, 97, (2, 8))
    model(x).sum().backward()
    opt.step()
    return model, opt, torch.Generator().manual_seed(5)


def _save(folder, step, model, opt, gen, **kw):
    return save_checkpoint(folder, step=step, model=model, optimizer=opt, schedule_state={"name": "constant", "step_count": step},
                           data_generator=gen, **kw)


def test_round_trip_restores_everything(tmp_path):
    model, opt, gen = _setup()
    torch.manual_seed(123)
    path = _save(tmp_path, 7, model, opt, gen, extra={"best": 1.5})
    expected_draw, expected_data = torch.rand(3), torch.rand(3, generator=gen)
    model2, opt2, gen2 = _setup(seed=1)
    state = load_checkpoint(path, model=model2, optimizer=opt2, data_generator=gen2)
    assert state["step"] == 7 and state["extra"]["best"] == 1.5
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    for k in s1["state"]:
        for name in s1["state"][k]:
            assert torch.equal(s1["state"][k][name], s2["state"][k][name])
    assert torch.equal(torch.rand(3), expected_draw) and torch.equal(torch.rand(3, generator=gen2), expected_data)
    assert model2.embed.token.weight is model2.head.proj.weight  # tying survives
    assert not list(path.glob("*.pt")) and {p.name for p in path.iterdir()} == {"model.safetensors", "optimizer.safetensors", "state.json"}


def test_keeps_last_n_and_the_best(tmp_path):
    model, opt, gen = _setup()
    for step, metric in [(1, 3.0), (2, 1.0), (3, 2.0), (4, 2.5), (5, None)]:
        _save(tmp_path, step, model, opt, gen, metric=metric, keep_last=2)
    names = sorted(p.name for p in tmp_path.glob("step-*"))
    assert names == ["step-00000002", "step-00000004", "step-00000005"]
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["best"] == "step-00000002" and index["latest"] == "step-00000005"
    assert resolve_checkpoint(tmp_path, "best").name == "step-00000002"


def test_crash_during_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, gen = _setup()
    good = _save(tmp_path, 1, model, opt, gen)
    before = {p.name: p.read_bytes() for p in good.iterdir()}

    def crash(tensors, filename, *a, **k):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(ck, "write_safetensors", crash)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 2, model, opt, gen)
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("step-")] == ["step-00000001"]
    assert resolve_checkpoint(tmp_path).name == "step-00000001"
    load_checkpoint(resolve_checkpoint(tmp_path), model=_setup()[0])


@pytest.mark.parametrize("damage", ["truncate", "flip", "state"])
def test_corrupted_checkpoint_is_a_clear_error(tmp_path, damage):
    model, opt, gen = _setup()
    path = _save(tmp_path, 1, model, opt, gen)
    target = path / ("state.json" if damage == "state" else "model.safetensors")
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(path, model=model, optimizer=opt, data_generator=gen)


def test_a_checkpoint_for_another_model_is_a_clear_error(tmp_path):
    model, opt, gen = _setup()
    path = _save(tmp_path, 1, model, opt, gen)
    other = build_model(presets.get("tiny-decoder", d_model=64))
    with pytest.raises(CheckpointError, match="model"):
        load_checkpoint(path, model=other)
    with pytest.raises(FileNotFoundError):
        resolve_checkpoint(tmp_path / "nothing")
