"""The attention viewer's pages of `attnlab inspect attribute --html`, in headless Chromium (the
fixtures of test_viewer_browser.py; Chromium required, never skipped): hovering the scored
prediction shows |attribution| / max over the input tokens, and a rollout page's first layer
shows the rollout through layer 1, as attribution.json holds them."""

import json

import torch

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.interop.serialization import save
from attnlab.tokenizers import Tokenizer
from tests.inspect.test_viewer_browser import ATOL, _hover, _open, browser  # noqa: F401 (a fixture)

TEXT = "the cat sat"


def _pages(tmp_path):
    tok = Tokenizer.train(["the cat sat on the mat"], kind="char")
    cfg = ModelConfig(arch="decoder", vocab_size=len(tok), d_model=16, num_layers=2, num_heads=2, d_ff=32,
                      dropout=0.0, position={"scheme": "learned", "max_len": 32})
    torch.manual_seed(0)
    save(build_model(cfg), tmp_path / "run", tokenizer=tok)
    out = {}
    for method in ("ig", "rollout"):
        page = tmp_path / f"{method}.html"
        assert main(["inspect", "attribute", str(tmp_path / "run"), "--text", TEXT, "--method", method,
                     "--out", str(tmp_path / method), "--html", str(page)]) == 0
        out[method] = (page, json.loads((tmp_path / method / "attribution.json").read_text()))
    return out


def test_attribution_pages_show_what_attribution_json_holds(browser, tmp_path):  # noqa: F811
    pages = _pages(tmp_path)
    page, numbers = pages["ig"]
    _open(browser, page)
    shown = _hover(browser, "query", 0)
    scores = torch.tensor(numbers["scores"])
    torch.testing.assert_close(torch.tensor(shown["heads"][0]["weights"], dtype=torch.float32), scores.abs() / scores.abs().max(),
                               atol=ATOL, rtol=0)
    page, numbers = pages["rollout"]
    _open(browser, page)
    shown = _hover(browser, "query", len(TEXT) - 1)
    assert shown["map"] == "rollout through layer 1"
    last = browser.execute_script("return window.attnlabViewer.highlighted();")
    assert torch.tensor(last["heads"][0]["weights"]).sum().item() > 0.99  # a row of shares
