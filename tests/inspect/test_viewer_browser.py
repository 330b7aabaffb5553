"""The viewer page in a real browser: headless Chromium driven by selenium, the network off.

A page written by `attnlab inspect attention --html` is opened from file://; hovering a token
must highlight exactly the weights attnlab computed (within the page's uint8 quantisation),
the heatmaps must paint them, and the page must request nothing. Chromium is required: without
it these tests FAIL and say how to install it (`.ci/install-browser`, or
`apt-get install -y chromium chromium-driver`); they never skip.
Set ATTNLAB_VIEWER_SCREENSHOT=path.png to keep a screenshot of the head view.
"""

import os
import shutil
import tempfile

import pytest
import torch

from attnlab.cli.main import main
from attnlab.interop.serialization import save
from tests.inspect.test_viewer import SOURCE, TARGET, TEXTS, inputs, reference_maps, tiny_model

ATOL = 1 / 255  # the page holds round(255 w) / 255
INSTALL = ("run .ci/install-browser (or: apt-get install -y chromium chromium-driver), and "
           "pip install selenium (the `test` extra)")
RED_CHANNEL = """
const c = document.querySelector(`#grid canvas[data-layer='${arguments[0]}'][data-head='${arguments[1]}']`);
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, red = [];
for (let p = 0; p < d.length; p += 4) red.push(d[p]);
return [c.height, c.width, red];
"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1200,900"]


def _chromium() -> tuple[str, str]:
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(f"the viewer's browser test needs Chromium and its driver (found browser={browser}, "
                    f"chromedriver={driver}): {INSTALL}")
    return browser, driver


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(f"the viewer's browser test needs selenium: {INSTALL}")
    binary, driver_path = _chromium()
    profile = tempfile.mkdtemp(prefix="attnlab-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                                   "downloadThroughput": 0, "uploadThroughput": 0})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def tok():
    from attnlab.tokenizers import Tokenizer

    return Tokenizer.train(TEXTS, kind="char")


def _page(tmp_path, tok, arch: str, *cli, **extra):
    """A saved run, its page written by the command line, and the weights attnlab computes."""
    model = tiny_model(arch, tok, **extra)
    with torch.no_grad():  # peaked maps (weights over all of [0, 1]), so that a wrong index or colour shows
        for name, p in model.named_parameters():
            if name.endswith(("qkv_proj.weight", "q_proj.weight", "kv_proj.weight")):
                p.normal_(0, 1, generator=torch.Generator().manual_seed(0))
    save(model, tmp_path / arch, tokenizer=tok)
    page = tmp_path / f"{arch}.html"
    argv = ["inspect", "attention", str(tmp_path / arch), "--text", SOURCE, "--html", str(page), *cli]
    if arch in ("encoder_decoder", "rnn_encoder_decoder"):
        argv += ["--target", TARGET]
    assert main(argv) == 0
    return page, reference_maps(model, *inputs(arch, tok))


def _open(driver, page) -> str:
    driver.get_log("performance")  # drop what came before this page
    url = page.resolve().as_uri()
    driver.get(url)
    state = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.attnlabViewer.ready.then(() => done('ready'), err => done(String(err)));")
    assert state == "ready"
    return url


def _hover(driver, side: str, index: int) -> dict:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    token = driver.find_elements(By.CSS_SELECTOR, f"#head-panel .tok.{side[0]}")[index]
    ActionChains(driver).move_to_element(token).perform()
    return driver.execute_script("return window.attnlabViewer.highlighted();")


def _requests(driver) -> list[str]:
    import json

    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_hover_highlights_the_weights_attnlab_computed(browser, tmp_path, tok):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page, ref = _page(tmp_path, tok, "decoder")
    url = _open(browser, page)
    query = 9
    shown = _hover(browser, "query", query)
    assert (shown["map"], shown["side"], shown["index"]) == ("layers.0.self_attn", "query", query)
    expected = ref["layers.0.self_attn"][:, query]  # (H, Tk)
    assert [h["head"] for h in shown["heads"]] == [0, 1]
    torch.testing.assert_close(torch.tensor([h["weights"] for h in shown["heads"]]), expected, atol=ATOL, rtol=0)
    # the lines drawn: one per head and key with weight, opacity = weight, none into the future
    lines = browser.find_elements(By.CSS_SELECTOR, "#lines line")
    assert lines
    for line in lines:
        h, j = int(line.get_attribute("data-head")), int(line.get_attribute("data-key"))
        assert int(line.get_attribute("data-query")) == query and j <= query
        assert abs(float(line.get_attribute("stroke-opacity")) - float(expected[h, j])) <= ATOL
    assert len(lines) == int((torch.round(expected * 255) > 0).sum())
    # a head unticked leaves the lines and the highlight; another layer shows its own weights
    browser.find_element(By.CSS_SELECTOR, '#heads input[data-head="1"]').click()
    _hover(browser, "query", query)
    assert [h["head"] for h in browser.execute_script("return window.attnlabViewer.highlighted();")["heads"]] == [0]
    assert browser.find_elements(By.CSS_SELECTOR, '#lines line[data-head="0"]')
    assert not browser.find_elements(By.CSS_SELECTOR, '#lines line[data-head="1"]')
    Select(browser.find_element(By.ID, "layer")).select_by_visible_text("layer 1")
    shown = _hover(browser, "key", 3)  # a key: the weights of every query on it
    assert (shown["map"], shown["side"], shown["index"]) == ("layers.1.self_attn", "key", 3)
    torch.testing.assert_close(torch.tensor([h["weights"] for h in shown["heads"]]),
                               ref["layers.1.self_attn"][:, :, 3], atol=ATOL, rtol=0)
    shot = tmp_path / "head-view.png"
    browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 10_000
    if os.environ.get("ATTNLAB_VIEWER_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["ATTNLAB_VIEWER_SCREENSHOT"])
    assert _requests(browser) == [url]  # the page itself, nothing else
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


def test_cross_attention_and_model_view_heatmaps(browser, tmp_path, tok):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page, ref = _page(tmp_path, tok, "encoder_decoder")
    url = _open(browser, page)
    Select(browser.find_element(By.ID, "kind")).select_by_visible_text(
        "cross-attention: decoder.layers.*.cross_attn (target -> source)")
    shown = _hover(browser, "query", 2)
    assert shown["map"] == "decoder.layers.0.cross_attn"
    torch.testing.assert_close(torch.tensor([h["weights"] for h in shown["heads"]]),
                               ref["decoder.layers.0.cross_attn"][:, 2], atol=ATOL, rtol=0)
    browser.find_element(By.ID, "tab-model").click()
    thumbs = browser.find_elements(By.CSS_SELECTOR, "#grid canvas")
    assert len(thumbs) == 4  # 2 layers x 2 heads
    # each thumbnail paints its map: white (w = 0) to #08306b (w = 1), red channel 255 - 247 w
    for layer in range(2):
        for head in range(2):
            t_q, t_k, pixels = browser.execute_script(RED_CHANNEL, layer, head)
            painted = (255 - torch.tensor(pixels, dtype=torch.float32).view(t_q, t_k)) / 247
            torch.testing.assert_close(painted, ref[f"decoder.layers.{layer}.cross_attn"][head], atol=2 / 247, rtol=0)
    thumbs[3].click()
    assert browser.find_element(By.ID, "zoom-canvas").size["width"] > 200
    assert "decoder.layers.1.cross_attn" in browser.find_element(By.ID, "zoom").text
    assert _requests(browser) == [url]


def test_rnn_alignment_sparse_pattern_and_long_input_notice(browser, tmp_path, tok):
    from selenium.webdriver.common.by import By

    page, ref = _page(tmp_path, tok, "rnn_encoder_decoder")
    _open(browser, page)
    assert "RNN alignment" in browser.find_element(By.ID, "kind").text
    shown = _hover(browser, "query", 1)
    torch.testing.assert_close(torch.tensor(shown["heads"][0]["weights"]), ref["attention"][0, 1], atol=ATOL, rtol=0)

    window, cut = 2, 12
    page, ref = _page(tmp_path, tok, "encoder", "--max-tokens", str(cut),
                      attention={"kernel": "sliding_window", "kernel_options": {"window": window}})
    _open(browser, page)
    notice = browser.find_element(By.ID, "notice")
    assert notice.is_displayed() and "first 12" in notice.text and "22 tokens" in notice.text
    query = 6
    shown = _hover(browser, "query", query)
    keys = browser.find_elements(By.CSS_SELECTOR, "#head-panel .tok.k")
    assert len(keys) == cut
    blocked = [j for j, k in enumerate(keys) if "blocked" in k.get_attribute("class").split()]
    assert blocked == [j for j in range(cut) if abs(j - query) > window]  # the window's pattern, greyed out
    weights = torch.tensor([h["weights"] for h in shown["heads"]])
    assert weights[:, blocked].abs().max() == 0
