"""safetensors I/O and the strict, tie-aware state loader."""

import errno
import os

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


# ---------------------------------------------------------------- every weights writer honours the umask

def _write_weights(writer, folder):
    """Write weights to `folder` the way `writer` does; returns the folders written."""
    import attnlab
    from attnlab import build_model, presets
    from attnlab.cli.main import main
    from attnlab.tokenizers import Tokenizer
    from attnlab.io.checkpoints import save_checkpoint
    from attnlab.training.optim import build_optimizer
    from tests.interop.helpers import tiny_gpt2_folder

    tok = Tokenizer.train(["the cat sat"], kind="char", special_tokens=["<pad>", "<unk>"])
    model = build_model(presets.get("tiny-decoder"))
    if writer == "checkpoint":
        save_checkpoint(folder / "checkpoints", step=1, model=model, optimizer=build_optimizer(model, lr=0.01),
                        schedule_state={}, data_generator=torch.Generator())
        return [folder / "checkpoints"]
    if writer == "attnlab.save":
        attnlab.save(model, folder / "model", tokenizer=tok)
        return [folder / "model"]
    if writer == "tokenizer":
        tok.save(folder / "tok")
        return [folder / "tok"]
    tiny_gpt2_folder(folder / "hf")  # (transformers' own files: not attnlab's to judge)
    assert main(["convert", str(folder / "hf"), str(folder / "ours"), "--to", "attnlab"]) == 0
    assert main(["convert", str(folder / "ours"), str(folder / "back"), "--to", "hf"]) == 0
    return [folder / "ours", folder / "back"]


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o027], ids=lambda m: f"umask-{m:03o}")
@pytest.mark.parametrize("writer", ["checkpoint", "attnlab.save", "convert", "tokenizer"])
def test_every_file_written_follows_the_umask(tmp_path, writer, mask):
    old = os.umask(mask)
    try:
        written = _write_weights(writer, tmp_path)
    finally:
        os.umask(old)
    entries = [p for folder in written for p in [folder, *folder.rglob("*")]]
    assert any(p.suffix == ".safetensors" for p in entries) or writer == "tokenizer"
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in entries}
    expected = {name: oct((0o777 if (tmp_path / name).is_dir() else 0o666) & ~mask) for name in modes}
    assert modes == expected


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_a_failed_safetensors_write_names_the_file(tmp_path, monkeypatch, code):
    import safetensors.torch
    from safetensors import SafetensorError

    def full_disk(tensors, filename, metadata=None):  # the message safetensors' Rust writer gives
        raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(code)} (os error {code})")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError) as info:
        write_safetensors({"x": torch.ones(3)}, tmp_path / "w.safetensors")
    assert (info.value.errno, info.value.filename) == (code, str(tmp_path / "w.safetensors"))
