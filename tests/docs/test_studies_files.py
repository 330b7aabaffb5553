"""The docs' links to study plots name plots the MkDocs hook (docs/tools/studies_files.py) serves,
and the hook serves the committed PNGs under the site paths the pages use."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    spec = importlib.util.spec_from_file_location("studies_files", ROOT / "docs" / "tools" / "studies_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_plot_the_pages_show_is_served():
    served = {site_path for site_path, _ in _hook().study_plots()}
    pages = {"studies/index.md": "studies/", "index.md": ""}
    shown = set()
    for page, base in pages.items():
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        shown |= {base + link for link in re.findall(r"!\[.*?\]\(([^)]+\.png)\)", text)}
    assert len(shown) >= 6
    assert shown <= served, shown - served


def test_served_plots_are_the_committed_files():
    plots = dict(_hook().study_plots())
    assert plots["studies/files/rnn_vs_transformer/bleu_vs_time.png"] == (
        ROOT / "examples" / "studies" / "rnn_vs_transformer" / "bleu_vs_time.png")
    assert plots["studies/files/vit_digits/attention.png"] == ROOT / "examples" / "vit_digits" / "attention.png"
    assert all(path.is_file() for path in plots.values())
