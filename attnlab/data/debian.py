"""Debian's package descriptions and their translations (the archive's `Translation-LANG` index
files, the Debian Description Translation Project), as aligned text.

A Translation file is a list of stanzas:

    Package: 0ad
    Description-md5: d943033bedada21853d2ae54a2578a7b
    Description-de: Echtzeit-Strategiespiel über antike Kriegsführung
     0 A.D. ist ein freies, quelloffenes, ...
     .
     Dieses Paket enthält ...

The first line of a description is its synopsis; the continuation lines (one leading space)
are the long description, whose paragraphs are separated by ` .`. Every language's file keys a
description by the md5 of its English text, so two languages pair by `Description-md5`:

    >>> english = read_descriptions(Path("Translation-en"))      # {md5: Description}
    >>> pairs = description_pairs(english, read_descriptions(Path("Translation-de")))

A `Packages` index lists each binary package with its `Section` (admin, games, sound, ...) and
the same `Description-md5`, so a description also gets a label (`section_rows`).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Description:
    package: str
    synopsis: str
    paragraphs: tuple[str, ...]


def _wide(char: str) -> bool:
    """A full-width character (CJK ideographs, kana, full-width forms): text written without spaces."""
    return unicodedata.east_asian_width(char) in "WF"


def _join_lines(lines: list[str]) -> str:
    """Wrapped lines as one: a space where a line breaks, none between two full-width characters
    (Chinese and Japanese descriptions wrap inside words)."""
    text = ""
    for line in filter(None, lines):
        text += line if text and _wide(text[-1]) and _wide(line[0]) else (" " if text else "") + line
    return text


def _paragraphs(lines: list[str]) -> tuple[str, ...]:
    """The long description's paragraphs, each on one line (whitespace runs as one space)."""
    out, current = [], []
    for line in lines:
        if line.strip() == ".":
            out.append(current)
            current = []
        else:
            current.append(line.strip())
    out.append(current)
    return tuple(re.sub(r"\s+", " ", _join_lines(p)).strip() for p in out if any(p))


def parse_descriptions(text: str) -> dict[str, Description]:
    """md5 -> Description for every stanza of a Translation file's text (the first stanza of an
    md5 wins; stanzas without a description or md5 are skipped)."""
    found: dict[str, Description] = {}
    for stanza in re.split(r"\n\s*\n", text):
        package = md5 = None
        synopsis, body, in_description = "", [], False
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")):
                if in_description:
                    body.append(line)
                continue
            key, _, value = line.partition(":")
            in_description = key.startswith("Description-") and key != "Description-md5"
            if key == "Package":
                package = value.strip()
            elif key == "Description-md5":
                md5 = value.strip()
            elif in_description:
                synopsis = value.strip()
        if package and md5 and synopsis and md5 not in found:
            found[md5] = Description(package, synopsis, _paragraphs(body))
    return found


def read_descriptions(path: str | Path) -> dict[str, Description]:
    """`parse_descriptions` of a Translation file on disk (UTF-8)."""
    return parse_descriptions(Path(path).read_text(encoding="utf-8", errors="replace"))


def description_pairs(source: dict[str, Description], target: dict[str, Description],
                      min_chars: int = 3) -> list[tuple[str, str, str]]:
    """(md5, source text, target text): each description's synopsis pair, and its paragraphs
    pair by pair where both sides have the same number of paragraphs (where they do not, the
    translation is of another version or merged paragraphs, and only the synopses pair).
    Pairs where either side is shorter than `min_chars` or the two sides are identical (an
    untranslated paragraph, a command line) are dropped; repeats are kept once."""
    pairs: dict[tuple[str, str], str] = {}
    for md5, src in source.items():
        tgt = target.get(md5)
        if tgt is None:
            continue
        candidates = [(src.synopsis, tgt.synopsis)]
        if len(src.paragraphs) == len(tgt.paragraphs):
            candidates += list(zip(src.paragraphs, tgt.paragraphs))
        for s, t in candidates:
            if min(len(s), len(t)) >= min_chars and s != t:
                pairs.setdefault((s, t), md5)
    return [(md5, s, t) for (s, t), md5 in pairs.items()]


def read_sections(path: str | Path) -> dict[str, str]:
    """Description-md5 -> section from a `Packages` index (the area prefix `contrib/`, `non-free/`
    dropped); a description shared by packages of different sections maps to "" (ambiguous)."""
    sections: dict[str, str] = {}
    for stanza in Path(path).read_text(encoding="utf-8", errors="replace").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        md5, section = fields.get("Description-md5"), fields.get("Section", "").rpartition("/")[2]
        if md5 and section:
            sections[md5] = section if sections.get(md5, section) == section else ""
    return sections


def headline(d: Description, max_words: int = 80) -> str:
    """The synopsis (given a full stop) and the first paragraph, cut at `max_words` words: the
    text a section label is predicted from."""
    words = " ".join([d.synopsis + ("." if d.synopsis[-1:].isalnum() else ""), *d.paragraphs[:1]]).split()
    return " ".join(words[:max_words])


def summary_pairs(descriptions: dict[str, Description], min_words: int = 20,
                  max_words: int = 400) -> list[tuple[str, str, str]]:
    """(md5, long description, synopsis): the long description's paragraphs joined by a space (cut
    at `max_words` words) as the document, the one-line synopsis as its summary. Descriptions whose
    long part is shorter than `min_words` words (a pointer to another package, a bare list) are
    left out; a repeated (document, summary) pair is kept once."""
    pairs: dict[tuple[str, str], str] = {}
    for md5, d in descriptions.items():
        words = " ".join(d.paragraphs).split()
        if len(words) >= min_words and len(d.synopsis.split()) >= 2:
            pairs.setdefault((" ".join(words[:max_words]), d.synopsis), md5)
    return [(md5, document, summary) for (document, summary), md5 in pairs.items()]


def section_rows(descriptions: dict[str, Description], sections: dict[str, str],
                 max_words: int = 80) -> list[tuple[str, str, str]]:
    """(md5, text, section): a description's synopsis and first paragraph (cut at `max_words`
    words) with its package's section; descriptions without an unambiguous section are left out,
    and a text that occurs with two sections is left out entirely."""
    rows: dict[str, tuple[str, str]] = {}
    labels: dict[str, set[str]] = {}
    for md5, d in descriptions.items():
        section = sections.get(md5)
        if not section:
            continue
        text = headline(d, max_words)
        labels.setdefault(text, set()).add(section)
        rows.setdefault(text, (md5, section))
    return [(md5, text, section) for text, (md5, section) in rows.items() if len(labels[text]) == 1]
