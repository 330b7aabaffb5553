"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages are generated at every build, and
MathJax is copied into the site.

docs/reference/{cli,config,api}.md hold a title, a few lines of introduction and a marker line
`<!-- generated: NAME -->`; the marker is replaced by what the generator NAME writes from the
code (docs/tools/NAME_page.py). Generated at build time, the pages cannot go stale, and a build
(strict) fails when a generator fails or a marker is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))  # the generators beside this file

import api_page  # noqa: E402
import cli_page  # noqa: E402
import config_page  # noqa: E402
from mkdocs.exceptions import PluginError  # noqa: E402

GENERATORS = {"cli": cli_page.cli_markdown, "config": config_page.config_markdown, "api": api_page.api_markdown}
PAGES = {"reference/cli.md": "cli", "reference/config.md": "config", "reference/api.md": "api"}


def marker(name: str) -> str:
    return f"<!-- generated: {name} -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    name = PAGES.get(page.file.src_uri)
    if name is None:
        return markdown
    if marker(name) not in markdown:
        raise PluginError(f"{page.file.src_uri}: the line {marker(name)} is missing (docs/tools/hooks.py puts the "
                          "generated reference there)")
    return markdown.replace(marker(name), GENERATORS[name]())


def on_post_build(config) -> None:
    """Copy MathJax 2 (the jupyter-server-mathjax package's copy, a `docs` extra) to
    SITE/assets/mathjax, where mkdocs.yml's extra_javascript loads it: math renders offline."""
    spec = importlib.util.find_spec("jupyter_server_mathjax")  # found, not imported (it needs a server)
    static = spec and os.path.join(spec.submodule_search_locations[0], "static")
    if not static or not os.path.isfile(os.path.join(static, "MathJax.js")):
        raise PluginError("MathJax is missing: pip install -c constraints.txt -e '.[docs]' (jupyter-server-mathjax)")
    shutil.copytree(static, os.path.join(config["site_dir"], "assets", "mathjax"), dirs_exist_ok=True)
