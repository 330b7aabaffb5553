"""safetensors I/O and the strict, tie-aware state loader."""

import pytest
import torch

from attnlab.io.weights import load_state, read_safetensors, unique_state, write_safetensors


def _tied() -> torch.nn.ModuleDict:
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    return torch.nn.ModuleDict({"emb": emb, "head": head})


def test_load_state_changes_nothing_when_a_tensor_is_wrong():
    layer = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    bad = {"0.weight": torch.ones(4, 3), "0.bias": torch.ones(4), "1.weight": torch.ones(2, 5), "1.bias": torch.ones(2)}
    with pytest.raises(ValueError, match=r"shape mismatch for 1\.weight.*\(2, 4\).*\(2, 5\)"):
        load_state(layer, bad)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


def test_load_state_refuses_tied_names_that_disagree():
    model = _tied()
    load_state(model, {"emb.weight": torch.ones(5, 3)})  # one name of a tie is enough
    assert torch.equal(model["head"].weight, torch.ones(5, 3))
    with pytest.raises(ValueError, match="one tied tensor"):
        load_state(model, {"emb.weight": torch.ones(5, 3), "head.weight": torch.zeros(5, 3)})


def test_unique_state_round_trips_through_one_file(tmp_path):
    model = _tied()
    state = unique_state(model)
    assert list(state) == ["emb.weight"]  # the tie is stored once, under its first name
    write_safetensors(state, tmp_path / "w.safetensors", metadata={"format": "attnlab"})
    back = _tied()
    load_state(back, read_safetensors(tmp_path / "w.safetensors"))
    assert torch.equal(back["head"].weight, model["emb"].weight)


def test_a_truncated_file_is_named(tmp_path):
    write_safetensors({"x": torch.ones(100)}, tmp_path / "w.safetensors")
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cannot read .*w\.safetensors"):
        read_safetensors(tmp_path / "w.safetensors")
