"""Markdown helpers shared by the reference generators (docs/tools/*_page.py)."""

from __future__ import annotations

import html
import textwrap


def cell(text: str) -> str:
    """Prose for one table cell: on one line, its `|` escaped (a cell separator otherwise), HTML
    special characters and brackets escaped outside code spans (a help text's `<id>` would vanish
    as a tag, its `[SEP]` read as a link)."""
    parts = " ".join(str(text).split()).split("`")
    for i in range(0, len(parts), 2):  # even pieces lie outside code spans
        # `[SEP]` would read as a link to a cross-reference target (mkdocs-autorefs)
        parts[i] = html.escape(parts[i], quote=False).replace("[", "\\[").replace("]", "\\]")
    return "`".join(parts).replace("|", "\\|")


def code(value: str) -> str:
    """`value` as an inline code span on one line (longer fences when it holds backticks)."""
    value = " ".join(str(value).split()).replace("|", "\\|")
    fence = "``" if "`" in value else "`"
    return f"{fence} {value} {fence}" if fence == "``" else f"`{value}`"


def text_block(text: str) -> str:
    """`text` verbatim in a fenced block (what the terminal shows), dedented."""
    body = textwrap.dedent(text).strip("\n").rstrip()  # relative indentation kept (aligned examples)
    fence = "````" if "```" in body else "```"
    return f"{fence}text\n{body}\n{fence}"
