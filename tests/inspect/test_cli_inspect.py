import os

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.io.weights import read_safetensors
from attnlab.interop.serialization import save
from attnlab.tokenizers import Tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the park"]


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder", "rnn_encoder_decoder"])
def test_inspect_attention_cli(tmp_path, arch, capsys):
    tok = Tokenizer.train(TEXTS, kind="char")
    cfg = ModelConfig(arch=arch, vocab_size=len(tok), d_model=16, num_layers=1, num_heads=2, d_ff=32,
                      dropout=0.0, position={"scheme": "learned", "max_len": 64},
                      rnn={"cell": "lstm", "attention": "general", "hidden_size": 16})
    save(build_model(cfg), tmp_path / "ckpt", tokenizer=tok)
    out = tmp_path / "maps"
    argv = ["inspect", "attention", str(tmp_path / "ckpt"), "--text", "the cat", "--out", str(out)]
    if arch != "decoder":
        argv += ["--target", "a dog"]
    assert main(argv) == 0
    maps = read_safetensors(out / "attention.safetensors")
    assert maps
    for name, w in maps.items():
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        assert (out / f"{name}.png").is_file()
    if arch == "rnn_encoder_decoder":
        assert maps["attention"].shape == (1, 1, 5, 7)  # target x source
    assert main(["inspect", "attention", str(tmp_path / "nothing"), "--text", "x"]) == 2


def test_inspect_cost_cli(capsys):
    assert main(["inspect", "cost", "vaswani-base", "--seq-len", "4096"]) == 0
    text = capsys.readouterr().out
    assert "T* = 3,072" in text and "above" in text


def test_inspect_cost_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit):
        main(["inspect", "cost", "tiny-decoder", "--seq-len", "0"])
    assert main(["inspect", "cost", "no-such-preset", "--seq-len", "8"]) == 2


def test_inspect_small_instruments_cli(tmp_path, capsys):
    assert main(["inspect", "kernel-regression", "--out", str(tmp_path / "nw.png")]) == 0
    assert main(["inspect", "rank-collapse", "--depth", "4", "--out", str(tmp_path / "rank.png")]) == 0
    assert main(["inspect", "gradient-flow", "--seq-len", "12", "--out", str(tmp_path / "grad.png")]) == 0
    for name in ("nw.png", "rank.png", "grad.png"):
        assert open(tmp_path / name, "rb").read(4) == b"\x89PNG"
    assert main(["inspect", "kernel-regression", "--bandwidths", "0,1", "--out", str(tmp_path / "x.png")]) == 2
    assert not os.path.exists(tmp_path / "x.png")
