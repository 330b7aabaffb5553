"""The viewer page's builder, without a browser: its embedded data decodes (here, independently
of the page's script) to the weights the capture computes, every attention kind is there, the
sparse patterns are the kernels' own, and the page names nothing to load.
The page's script in a real browser: test_viewer_browser.py."""

import base64
import json
import re
import tomllib
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.inspect.attention_maps import attention_maps, attention_modules
from attnlab.inspect.viewer import (MAX_TOKENS, AttentionMap, AttentionKind, AttentionView, attention_html,
                                    capture_view, render_html, write_attention_html)
from attnlab.interop.serialization import save
from attnlab.tokenizers import Tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the park"]
SOURCE, TARGET = "the cat sat on the mat", "a dog ran"
QUANTUM = 1 / 510 + 1e-6  # round(255 w) / 255 is within half a step of w


def tiny_model(arch: str, tok: Tokenizer, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=len(tok), d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0,
                      position={"scheme": "learned", "max_len": 64},
                      rnn={"cell": "lstm", "attention": "general", "hidden_size": 16}, **extra)
    return build_model(cfg).eval()


def inputs(arch: str, tok: Tokenizer) -> tuple[list[int], list[int] | None]:
    return tok.encode(SOURCE), (tok.encode(TARGET) if arch in ("encoder_decoder", "rnn_encoder_decoder") else None)


def reference_maps(model, src: list[int], tgt: list[int] | None) -> dict[str, torch.Tensor]:
    """The capture's weights of the one example, (H, Tq, Tk) per module, on the CPU (the model's device
    runs it)."""
    device = next(model.parameters()).device
    args = [torch.tensor([src], device=device)] + ([torch.tensor([tgt], device=device)] if tgt is not None else [])
    return {n: w[0].cpu() for n, w in attention_maps(model, *args).items()}


def decode_page(html: str) -> tuple[dict, dict[str, dict]]:
    """The page's data block and, per module, its kind, dequantised weights (H, Tq, Tk) and allowed mask."""
    block = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    data = json.loads(block.group(1))
    raw = zlib.decompress(base64.b64decode(data["blob"]))
    assert len(raw) == data["bytes"]
    maps = {}
    for kind in data["kinds"]:
        for m in kind["maps"]:
            h, t_q, t_k = m["shape"]
            w = np.frombuffer(raw, np.uint8, h * t_q * t_k, m["offset"]).reshape(h, t_q, t_k) / 255
            allowed = None if m["allowed"] is None else \
                np.frombuffer(raw, np.uint8, t_q * t_k, m["allowed"]).reshape(t_q, t_k).astype(bool)
            maps[m["name"]] = {"kind": kind, "map": m, "weights": torch.tensor(w, dtype=torch.float32),
                               "allowed": None if allowed is None else torch.tensor(allowed)}
    return data, maps


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(TEXTS, kind="char")


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder", "rnn_encoder_decoder"])
def test_embedded_weights_decode_to_the_captured_ones(arch, tok, device):
    model = tiny_model(arch, tok).to(device)
    src, tgt = inputs(arch, tok)
    data, maps = decode_page(attention_html(model, src, tgt, tokenizer=tok))
    ref = reference_maps(model, src, tgt)
    assert set(maps) == set(ref) == set(attention_modules(model))
    for name, w in ref.items():
        torch.testing.assert_close(maps[name]["weights"], w, atol=QUANTUM, rtol=0)
    assert data["tokens"]["source"] == [tok.id_to_token(i) for i in src]
    assert data["tokens"]["target"] == (None if tgt is None else [tok.id_to_token(i) for i in tgt])
    assert data["notice"] is None


def test_encoder_decoder_gives_encoder_decoder_and_cross_attention_kinds(tok):
    model = tiny_model("encoder_decoder", tok)
    src, tgt = inputs("encoder_decoder", tok)
    data, maps = decode_page(attention_html(model, src, tgt, tokenizer=tok))
    kinds = {k["id"]: k for k in data["kinds"]}
    assert set(kinds) == {"encoder.layers.*.self_attn", "decoder.layers.*.self_attn", "decoder.layers.*.cross_attn"}
    cross = kinds["decoder.layers.*.cross_attn"]
    assert (cross["queries"], cross["keys"]) == ("target", "source") and "cross-attention" in cross["label"]
    assert [m["layer"] for m in cross["maps"]] == [0, 1]
    assert cross["maps"][1]["shape"] == [2, len(tgt), len(src)]
    assert cross["maps"][1]["allowed"] is None  # every source token may be read
    assert (kinds["encoder.layers.*.self_attn"]["queries"], kinds["decoder.layers.*.self_attn"]["queries"]) == \
        ("source", "target")
    decoder_self = maps["decoder.layers.0.self_attn"]["allowed"]
    assert torch.equal(decoder_self, torch.ones(len(tgt), len(tgt), dtype=torch.bool).tril())


def test_rnn_attention_model_gives_its_alignment(tok):
    model = tiny_model("rnn_encoder_decoder", tok)
    src, tgt = inputs("rnn_encoder_decoder", tok)
    view = capture_view(model, src, tgt, tokenizer=tok)
    (kind,) = view.kinds
    (alignment,) = kind.maps
    assert "RNN alignment" in kind.label and (kind.queries, kind.keys) == ("target", "source")
    assert alignment.name == "attention" and alignment.heads == [0] and alignment.allowed is None
    assert alignment.weights.shape == (1, len(tgt), len(src))
    torch.testing.assert_close(alignment.weights.sum(-1), torch.ones(1, len(tgt)))
    torch.testing.assert_close(alignment.weights, reference_maps(model, src, tgt)["attention"])


def _window(t: int, w: int) -> torch.Tensor:
    i = torch.arange(t)
    return (i[:, None] - i[None, :]).abs() <= w


def _blocks(t: int, b: int) -> torch.Tensor:
    i = torch.arange(t)
    return (i[:, None] // b == i[None, :] // b) & (i[None, :] <= i[:, None])


@pytest.mark.parametrize("arch, kernel, options, expected", [
    ("encoder", "sliding_window", {"window": 2}, lambda t: _window(t, 2)),
    ("decoder", "sliding_window", {"window": 3}, lambda t: _window(t, 3).tril()),
    ("decoder", "local_block", {"block_size": 4}, lambda t: _blocks(t, 4)),
    ("decoder", "auto", {}, lambda t: torch.ones(t, t, dtype=torch.bool).tril()),
])
def test_sparse_kernels_pattern_is_the_allowed_mask(arch, kernel, options, expected, tok):
    model = tiny_model(arch, tok, attention={"kernel": kernel, "kernel_options": options})
    src = tok.encode(SOURCE)
    _, maps = decode_page(attention_html(model, src, tokenizer=tok))
    for name, m in maps.items():
        allowed = m["allowed"]
        assert torch.equal(allowed, expected(len(src))), name
        assert m["weights"][:, ~allowed].abs().max() == 0  # nothing outside the pattern
        assert m["weights"][:, allowed].min() > 0  # and every allowed key weighted: the zeros are the pattern
        assert f"kernel {'sdpa' if kernel == 'auto' else kernel}" in m["map"]["note"]  # auto resolves to sdpa


def test_memory_compressed_keys_are_labelled_as_blocks(tok):
    model = tiny_model("decoder", tok, attention={"kernel": "memory_compressed",
                                                   "kernel_options": {"compression": 3, "block_size": 4}})
    src = tok.encode(SOURCE)
    _, maps = decode_page(attention_html(model, src, tokenizer=tok))
    compressed = maps["layers.1.self_attn"]["map"]  # DMCA: odd layers attend to the compressed memory
    n_blocks = -(-len(src) // 3)
    assert compressed["shape"] == [2, len(src), n_blocks]
    assert compressed["keyLabels"] == [f"#{j}" for j in range(n_blocks)] and compressed["allowed"] is None
    assert maps["layers.0.self_attn"]["map"]["keyLabels"] is None


def test_page_is_self_contained(tok):
    model = tiny_model("encoder_decoder", tok)
    page = attention_html(model, *inputs("encoder_decoder", tok), tokenizer=tok)
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/", page, re.I)  # no URL at all
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\bsrc\s*=|@import|url\(", page, re.I)
    assert "default-src 'none'" in page  # and the Content-Security-Policy forbids any request
    assert page.count("<script") == 2 and page.count("<style") == 1


def test_tokens_cannot_break_out_of_the_data_block():
    evil = ["</script><script>alert(1)</script>", "<!--", "a&b", "\u2028"]
    view = AttentionView(evil, None, [AttentionKind("k", "self", "source", "source", [
        AttentionMap("layers.0.self_attn", 0, [0], torch.full((1, 4, 4), 0.25))])])
    page = render_html(view, title="<b>title</b>")
    assert page.count("</script>") == 2 and "<b>title" not in page
    data, maps = decode_page(page)
    assert data["tokens"]["source"] == evil and data["title"] == "<b>title</b>"
    torch.testing.assert_close(maps["layers.0.self_attn"]["weights"], torch.full((1, 4, 4), 0.25), atol=QUANTUM, rtol=0)


def test_long_input_runs_its_first_max_tokens_with_a_notice(tok):
    model = tiny_model("encoder", tok)
    src = tok.encode(SOURCE)  # 22 tokens
    data, maps = decode_page(attention_html(model, src, tokenizer=tok, max_tokens=8))
    assert "22 tokens" in data["notice"] and "first 8" in data["notice"]
    assert data["tokens"]["source"] == [tok.id_to_token(i) for i in src[:8]]
    ref = reference_maps(model, src[:8], None)  # the model run on the first 8, not a crop of the full run
    for name, w in ref.items():
        torch.testing.assert_close(maps[name]["weights"], w, atol=QUANTUM, rtol=0)
    assert MAX_TOKENS == 512


def test_heads_and_names_select_what_the_page_holds(tok):
    model = tiny_model("encoder_decoder", tok)
    src, tgt = inputs("encoder_decoder", tok)
    data, maps = decode_page(attention_html(model, src, tgt, tokenizer=tok, names="*.cross_attn", heads=[1]))
    assert set(maps) == {"decoder.layers.0.cross_attn", "decoder.layers.1.cross_attn"}
    ref = reference_maps(model, src, tgt)
    for name, m in maps.items():
        assert m["map"]["heads"] == [1]
        torch.testing.assert_close(m["weights"], ref[name][1:2], atol=QUANTUM, rtol=0)


def test_bad_input_is_refused(tok, tmp_path):
    decoder, seq2seq = tiny_model("decoder", tok), tiny_model("encoder_decoder", tok)
    src = tok.encode(SOURCE)
    for call, words in [
        (lambda: capture_view(decoder, src, src), "target_ids are for encoder-decoders"),
        (lambda: capture_view(seq2seq, src), "target_ids are needed"),
        (lambda: capture_view(decoder, src, max_tokens=0), "max_tokens"),
        (lambda: capture_view(decoder, []), "input_ids is empty"),
        (lambda: capture_view(decoder, torch.zeros(2, 3, dtype=torch.long)), "input_ids must be one sequence"),
        (lambda: capture_view(decoder, src, names="nothing.*"), "matches no attention module"),
        (lambda: write_attention_html(tmp_path, decoder, src), "is a folder"),
    ]:
        with pytest.raises(ValueError, match=words):
            call()


def test_write_is_atomic_and_cli_writes_the_page(tok, tmp_path, monkeypatch, capsys):
    model = tiny_model("encoder_decoder", tok)
    save(model, tmp_path / "ckpt", tokenizer=tok)
    monkeypatch.chdir(tmp_path)
    argv = ["inspect", "attention", "ckpt", "--text", SOURCE, "--target", TARGET]
    assert main(argv + ["--html", "page/attention.html"]) == 0
    assert not (tmp_path / "attention_maps").exists()  # --html alone writes the page only
    assert "viewer: page/attention.html" in capsys.readouterr().out
    _, maps = decode_page((tmp_path / "page" / "attention.html").read_text(encoding="utf-8"))
    src, tgt = inputs("encoder_decoder", tok)
    for name, w in reference_maps(model, src, tgt).items():
        torch.testing.assert_close(maps[name]["weights"], w, atol=QUANTUM, rtol=0)
    assert main(argv + ["--html", "both.html", "--out", "maps", "--max-tokens", "4"]) == 0
    assert (tmp_path / "maps" / "attention.safetensors").is_file()
    data, maps = decode_page((tmp_path / "both.html").read_text(encoding="utf-8"))
    assert "first 4" in data["notice"] and maps["decoder.layers.0.cross_attn"]["map"]["shape"] == [2, 4, 4]
    assert "first 4" in capsys.readouterr().out
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv + ["--html", "page"]) == 2  # a folder: refused before anything is written
    assert main(["inspect", "attention", "ckpt", "--text", SOURCE, "--html", "x.html"]) == 2  # no --target
    assert main(argv + ["--out", "maps2", "--max-tokens", "4"]) == 2  # --max-tokens without --html: refused
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert [p.name for p in (tmp_path / "page").iterdir()] == ["attention.html"]  # no temporary left


def test_assets_are_package_data():
    """The page's script and style are files next to viewer.py: the wheel must carry them."""
    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    listed = config["tool"]["setuptools"].get("package-data", {}).get("attnlab.inspect", [])
    assert {"viewer.js", "viewer.css"} <= set(listed), \
        'pyproject.toml needs [tool.setuptools.package-data] "attnlab.inspect" = ["viewer.js", "viewer.css"]'
    for name in ("viewer.js", "viewer.css"):
        assert (root / "attnlab" / "inspect" / name).is_file()
