"""`attnlab inspect patch` through the real entry point on saved models: the heatmaps, the viewer
pages and patch.json, whose first-layer row restores the clean metric exactly at the one changed
position; a recurrent model's memory and alignment; errors named by flag, nothing written."""

import json
import math
import os

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.interop.serialization import load, save
from attnlab.tokenizers import Tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the park"]


def _saved(tmp_path, arch, **rnn):
    tok = Tokenizer.train(TEXTS, kind="char")
    cfg = ModelConfig(arch=arch, vocab_size=len(tok), d_model=16, num_layers=2, num_heads=2, d_ff=32,
                      dropout=0.0, position={"scheme": "learned", "max_len": 64},
                      rnn={"cell": "lstm", "attention": "additive", "hidden_size": 16, **rnn})
    save(build_model(cfg), tmp_path / "ckpt", tokenizer=tok)
    return str(tmp_path / "ckpt")


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_patch_cli_writes_heatmaps_pages_and_exact_scores(tmp_path, arch, capsys):
    ckpt, out = _saved(tmp_path, arch), tmp_path / "patching"
    argv = ["inspect", "patch", ckpt, "--clean", "the cat sat", "--corrupted", "the dog sat", "--target", "o",
            "--wrong", "a"] + (["--prefix", "a d"] if arch == "encoder_decoder" else [])
    assert main(argv + ["--out", str(out)]) == 0
    summary = json.loads((out / "patch.json").read_text())
    side = "resid" if arch == "decoder" else "resid_encoder"
    sweep = summary["sweeps"][side]
    assert sweep["rows"][0].endswith("layers.0.hook_resid_pre") and len(sweep["columns"]) == 11
    first = sweep["values"][0]
    changed = [4, 5, 6]  # "cat" -> "dog"
    assert any(first[p] != sweep["corrupted"] for p in changed)
    assert all(first[p] == sweep["corrupted"] for p in range(11) if p not in changed)
    for stem in summary["sweeps"]:
        assert (out / f"patch_{stem}.png").read_bytes()[:4] == b"\x89PNG"
        page = (out / f"patch_{stem}.html").read_text()
        assert page.startswith("<!DOCTYPE html>") and "attnlab-data" in page
    if arch == "encoder_decoder":
        assert set(summary["sweeps"]) == {"resid_encoder", "resid_decoder"}
    assert "highest score" in capsys.readouterr().out
    assert main(argv + ["--over", "heads", "--out", str(out / "heads"), "--direction", "noise"]) == 0
    heads = json.loads((out / "heads" / "patch.json").read_text())["sweeps"]
    assert all(len(s["columns"]) == 2 and s["axis"] == "head" for s in heads.values())


def test_patch_cli_one_changed_token_restores_exactly(tmp_path):
    ckpt, out = _saved(tmp_path, "decoder"), tmp_path / "p"
    assert main(["inspect", "patch", ckpt, "--clean", "the cat", "--corrupted", "the mat", "--target", "s",
                 "--out", str(out)]) == 0
    sweep = json.loads((out / "patch.json").read_text())["sweeps"]["resid"]
    first = sweep["values"][0]
    assert first[4] == sweep["clean"] and sweep["clean"] != sweep["corrupted"]
    model, tok = load(ckpt, with_tokenizer=True)
    with torch.no_grad():  # "clean" is the clean text's log p(target), computed here without the command
        for text, key in (("the cat", "clean"), ("the mat", "corrupted")):
            logp = model.eval()(torch.tensor([tok.encode(text)]))[0, -1].double().log_softmax(-1)
            assert math.isclose(sweep[key], float(logp[tok.encode("s")[0]]), rel_tol=0, abs_tol=1e-6)
    assert all(first[p] == sweep["corrupted"] for p in range(7) if p != 4)


def test_patch_cli_rnn_memory_and_alignment(tmp_path):
    ckpt, out = _saved(tmp_path, "rnn_encoder_decoder"), tmp_path / "rnn"
    base = ["inspect", "patch", ckpt, "--clean", "the cat", "--corrupted", "the mat", "--target", "s",
            "--prefix", "a dog"]
    assert main(base + ["--out", str(out)]) == 0
    assert main(base + ["--over", "pattern", "--out", str(out)]) == 0
    summary = json.loads((out / "patch.json").read_text())["sweeps"]["pattern_alignment"]
    assert summary["rows"] == ["attention.hook_pattern"] and len(summary["columns"]) == 5  # target positions
    assert (out / "patch_resid_memory.png").is_file()
    assert main(base + ["--over", "heads", "--out", str(tmp_path / "x")]) == 2
    assert not os.path.exists(tmp_path / "x")


def test_patch_cli_errors_name_the_flag(tmp_path, capsys):
    ckpt = _saved(tmp_path, "decoder")
    out = tmp_path / "never"
    base = ["inspect", "patch", ckpt, "--out", str(out)]
    assert main(base + ["--clean", "the cat", "--corrupted", "the cats", "--target", "s"]) == 2
    assert "--clean is 7 tokens, --corrupted 8" in capsys.readouterr().err
    assert main(base + ["--clean", "the cat", "--corrupted", "the mat", "--target", "sat"]) == 2
    assert "--target 'sat' encodes to 3 tokens" in capsys.readouterr().err
    assert main(base + ["--clean", "the cat", "--corrupted", "the mat", "--target", "s", "--prefix", "a"]) == 2
    assert "--prefix is for encoder-decoders" in capsys.readouterr().err
    assert main(base + ["--clean", "the cat", "--corrupted", "the mat", "--target", "s", "--position", "7"]) == 2
    assert "--position 7 is outside the 7 output positions" in capsys.readouterr().err
    assert not os.path.exists(out)
