"""`attnlab inspect attribute`: each method writes its PNG, numbers that agree with the library
(completeness for integrated gradients, rows of shares for rollout and flow, the model's own
prediction in the lens's last layer) and a viewer page; bad flags are refused."""

import json

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.inspect.attention_flow import attention_flow, attention_rollout, self_attention_maps
from attnlab.interop.serialization import load, save
from attnlab.tokenizers import Tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the park"]


def _checkpoint(tmp_path, arch):
    tok = Tokenizer.train(TEXTS, kind="char")
    cfg = ModelConfig(arch=arch, vocab_size=len(tok), d_model=16, num_layers=2, num_heads=2, d_ff=32,
                      dropout=0.0, position={"scheme": "learned", "max_len": 64},
                      rnn={"cell": "lstm", "attention": "general", "hidden_size": 16})
    torch.manual_seed(0)
    path = tmp_path / f"ckpt_{arch}"
    save(build_model(cfg), path, tokenizer=tok)
    return path, tok


def _run(path, out, *flags):
    assert main(["inspect", "attribute", str(path), "--out", str(out), *flags]) == 0
    return json.loads((out / "attribution.json").read_text())


@pytest.mark.parametrize("method", ["ig", "grad_x_input"])
def test_token_attributions_of_a_decoder(tmp_path, method, capsys):
    path, tok = _checkpoint(tmp_path, "decoder")
    out = tmp_path / method
    got = _run(path, out, "--text", "the cat", "--method", method, "--target", "s", "--steps", "64",
               "--html", str(tmp_path / "page.html"))
    assert (out / f"{method}.png").is_file() and len(got["scores"]) == len("the cat")
    model = load(path)
    ids = torch.tensor([tok.encode("the cat")])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids)[0, -1], -1)[tok.encode("s")[0]]
    assert got["value"] == pytest.approx(float(logp), abs=1e-5)
    if method == "ig":  # completeness: the scores account for f(x) - f(baseline)
        assert sum(got["scores"]) == pytest.approx(got["value"] - got["baseline_value"], abs=1e-3)
        assert abs(got["delta"]) < 1e-3
    page = (tmp_path / "page.html").read_text()
    assert "attnlab-data" in page and "log p(" in page
    assert "plot:" in capsys.readouterr().out


@pytest.mark.parametrize("method", ["rollout", "flow"])
def test_rollout_and_flow_rows_are_shares(tmp_path, method):
    path, tok = _checkpoint(tmp_path, "decoder")
    got = _run(path, tmp_path / method, "--text", "a dog", "--method", method, "--html", str(tmp_path / "r.html"))
    rows = torch.tensor(got[method])
    assert rows.shape == (5, 5)
    torch.testing.assert_close(rows.sum(-1), torch.ones(5))
    assert (rows.triu(1) == 0).all()  # a decoder's position never draws on later tokens
    model = load(path)  # through every layer: the library's (tested on its own) on the same maps
    maps = self_attention_maps(model, torch.tensor([tok.encode("a dog")]))
    expected = attention_rollout(maps) if method == "rollout" else attention_flow(maps)
    torch.testing.assert_close(rows, expected[0])
    assert (tmp_path / method / f"{method}.png").is_file() and (tmp_path / "r.html").is_file()


def test_logit_lens_last_layer_is_the_prediction(tmp_path, capsys):
    path, tok = _checkpoint(tmp_path, "decoder")
    got = _run(path, tmp_path / "lens", "--text", "the", "--method", "logit_lens", "--top-k", "2")
    model = load(path)
    with torch.no_grad():
        predicted = model(torch.tensor([tok.encode("the")]))[0].argmax(-1)
    assert torch.equal(torch.tensor(got["top_ids"])[-1, :, 0], predicted)
    assert (tmp_path / "lens" / "logit_lens.png").is_file()
    assert "layer  2 at the last position" in capsys.readouterr().out


def test_encoder_decoder_sides(tmp_path):
    path, tok = _checkpoint(tmp_path, "encoder_decoder")
    src = _run(path, tmp_path / "s", "--text", "the cat", "--target", "a dog", "--steps", "32")
    model = load(path)
    tgt_ids = torch.tensor([tok.encode("a dog")])
    with torch.no_grad():  # the target's teacher-forced log-likelihood: position t predicts token t + 1
        logp = torch.log_softmax(model(torch.tensor([tok.encode("the cat")]), tgt_ids)[0, :-1], -1)
    assert src["value"] == pytest.approx(float(logp.gather(-1, tgt_ids[0, 1:, None]).sum()), abs=1e-4)
    tgt = _run(path, tmp_path / "t", "--text", "the cat", "--target", "a dog", "--side", "target", "--steps", "32")
    assert len(src["scores"]) == 7 and len(tgt["scores"]) == 5
    for got in (src, tgt):
        assert sum(got["scores"]) == pytest.approx(got["value"] - got["baseline_value"], abs=2e-3)
    flow = _run(path, tmp_path / "f", "--text", "the cat", "--target", "a dog", "--method", "flow", "--side", "target")
    assert torch.tensor(flow["flow"]).shape == (5, 5)


@pytest.mark.parametrize("arch,flags,message", [
    ("decoder", ["--side", "source"], "--side is for encoder-decoders"),
    ("encoder_decoder", [], "--target is needed"),
    ("encoder_decoder", ["--target", "a"], "at least 2 tokens"),
    ("rnn_encoder_decoder", ["--target", "a dog", "--method", "rollout"], "no stack of self-attention"),
    ("encoder", [], "without a head"),
    ("decoder", ["--method", "logit_lens", "--top-k", "1000"], "--top-k 1000"),
    ("decoder", ["--position", "9"], "position=9"),
])
def test_bad_flags_are_refused(tmp_path, arch, flags, message, capsys):
    path, _ = _checkpoint(tmp_path, arch)
    assert main(["inspect", "attribute", str(path), "--text", "the cat", "--out", str(tmp_path / "o"), *flags]) == 2
    assert message in capsys.readouterr().err
