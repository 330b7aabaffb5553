"""`attnlab embed`: texts in, vectors out (.npy, JSONL), the same as `attnlab.embed`."""

import json

import numpy as np
import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.interop.sentence import embed
from attnlab.interop.serialization import save
from tests.interop.helpers import single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

TEXTS = ["the cat sat on the mat", "a dog", "the mat sat on a cat"]


@pytest.fixture
def folder(tmp_path):
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train(TEXTS * 3, kind="char", special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    cfg = ModelConfig(arch="encoder", vocab_size=tok.vocab_size, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                      dropout=0.0, position={"max_len": 32})
    model = build_model(cfg)
    save(model, tmp_path / "model", tokenizer=tok)
    return tmp_path, model, tok


def test_npy_and_jsonl_outputs(folder):
    tmp, model, tok = folder
    (tmp / "texts.txt").write_text("\n".join(TEXTS[1:]) + "\n")
    assert main(["embed", TEXTS[0], "--file", str(tmp / "texts.txt"), "--model", str(tmp / "model"),
                 "--out", str(tmp / "v.npy")]) == 0
    vectors = np.load(tmp / "v.npy")
    want = embed(TEXTS, model.eval(), tok, max_length=32).numpy()
    assert vectors.shape == (3, 16) and np.allclose(vectors, want, atol=1e-6)
    assert main(["embed", *TEXTS, "--model", str(tmp / "model"), "--out", str(tmp / "v.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp / "v.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == TEXTS
    assert np.allclose(np.array([r["embedding"] for r in rows]), want, atol=1e-6)
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_file_rows_line_up_with_its_lines_blank_ones_included(folder, capsys):
    tmp, model, tok = folder
    lines = ["a dog", "", "the cat sat", "   ", ""]
    (tmp / "lines.txt").write_text("\n".join(lines) + "\n")
    assert main(["embed", "--file", str(tmp / "lines.txt"), "--model", str(tmp / "model"),
                 "--out", str(tmp / "v.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp / "v.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == lines
    want = embed(lines, model.eval(), tok, max_length=32).numpy()  # "" is [CLS] [SEP] with this template
    assert np.allclose(np.array([r["embedding"] for r in rows]), want, atol=1e-6)


def test_a_text_without_tokens_gets_a_zero_row_and_a_warning(tmp_path, capsys):
    from attnlab.tokenizers import Tokenizer

    tok = Tokenizer.train(TEXTS, kind="char", special_tokens=["<pad>", "<unk>"])  # no template: "" has no tokens
    assert tok.encode("", add_special_tokens=True) == []
    model = build_model(ModelConfig(arch="encoder", vocab_size=tok.vocab_size, d_model=16, num_layers=1,
                                    num_heads=2, d_ff=32, dropout=0.0, position={"max_len": 32}))
    save(model, tmp_path / "model", tokenizer=tok)
    (tmp_path / "lines.txt").write_text("\n\na dog\n")
    assert main(["embed", "--file", str(tmp_path / "lines.txt"), "--model", str(tmp_path / "model"),
                 "--out", str(tmp_path / "v.npy")]) == 0
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape == (3, 16) and not vectors[:2].any()
    assert np.allclose(vectors[2], embed(["a dog"], model.eval(), tok, max_length=32).numpy()[0], atol=1e-6)
    err = capsys.readouterr().err
    assert "attnlab embed: warning: 2 text(s) have no tokens (number 1, 2 of the inputs)" in err


def test_max_length_truncates(folder, capsys):
    tmp, model, tok = folder
    assert main(["embed", "the cat sat on the mat", "--model", str(tmp / "model"), "--max-length", "5"]) == 0
    row = json.loads(capsys.readouterr().out)
    want = embed(["the"], model.eval(), tok, max_length=5)[0]  # 3 characters + [CLS] + [SEP]
    assert torch.allclose(torch.tensor(row["embedding"]), want, atol=1e-6)


def test_errors(folder, capsys):
    tmp, _, _ = folder
    assert main(["embed", "--model", str(tmp / "model")]) == 2
    assert main(["embed", "x", "--model", str(tmp / "model"), "--out", str(tmp / "v.csv")]) == 2
    assert main(["embed", "--file", str(tmp / "nope.txt")]) == 2
    err = capsys.readouterr().err
    assert "no texts" in err and ".npy or .jsonl" in err and "nope.txt" in err
    for flag in ("--max-length", "--batch-size"):  # 0 is not "the default"
        assert main(["embed", "x", "--model", str(tmp / "model"), flag, "0"]) == 2
        assert f"{flag} must be a positive" in capsys.readouterr().err
    (tmp / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    assert main(["embed", "--file", str(tmp / "latin1.txt"), "--model", str(tmp / "model")]) == 2
    assert "latin1.txt: expected UTF-8 text" in capsys.readouterr().err
