"""Verse-aligned Bible translations from SWORD modules (Debian `sword-text-*` packages).

A SWORD "zText" module stores a Bible as compressed blocks of OSIS markup, one entry per verse,
ordered by its versification (the list of books and the verses per chapter, which `pysword`
knows for every scheme). This module reads the files, turns each verse's OSIS into plain text
and pairs two translations by (book, chapter, verse):

    >>> from attnlab.data.bible import ZTextModule, verse_pairs
    >>> english = ZTextModule(root, "engWEB2015eb").verses()   # {("Gen", 1, 1): "In the beginning, ..."}
    >>> pairs = verse_pairs(english, ZTextModule(root, "spaRV1909eb").verses())

Two modules may use different versifications (the World English Bible follows NRSVA, the
Reina-Valera 1909 the KJV's): where they number a chapter differently its verses would pair
with the wrong ones, so only chapters with the same verse count in both are kept, and only books
both have (the WEB's deuterocanon has no Spanish side here).

Splits (`split_pairs`): held-out verses (1 in `every`, chosen by a hash of the reference, so the
split does not depend on the order or on the other language) or held-out books. The corpus
builder then drops every training pair whose English or Spanish text also occurs in the held-out
part (repeated verses, e.g. the refrains of Psalm 136, would otherwise put test sentences in
training).
"""

from __future__ import annotations

import html
import re
import struct
import zlib
from pathlib import Path

Reference = tuple[str, int, int]  # (OSIS book name, chapter, verse)

# held out by `split_pairs(..., by="book")`: a narrative, a prophet, two letters (345 verses)
HELD_OUT_BOOKS = ("Ruth", "Jonah", "Phil", "Jas")

_DROPPED = re.compile(r"<note\b[^>]*>.*?</note>|<title\b(?![^>]*canonical=\"true\")[^>]*>.*?</title>", re.S)
_TAG = re.compile(r"<[^>]+>")
_SPACE_BEFORE = re.compile(r"\s+([,.;:!?’”)\]»])")
_SPACE_AFTER = re.compile(r"([“‘(\[«¡¿])\s+")


def osis_to_text(osis: str) -> str:
    """A verse's OSIS markup as plain text: notes and non-canonical headings dropped, the other
    tags removed (their text kept), entities decoded, whitespace runs as one space.

    A dropped note often sits where the text had its space ("God<note>...</note>created"), so it
    becomes a space, and spaces that end up before closing punctuation are removed.

    Example:
        >>> osis_to_text('<w lemma="x">God</w><note>Elohim</note><w>created</w> light<note>a</note>.')
        'God created light.'
    """
    text = _DROPPED.sub(" ", osis)
    text = html.unescape(_TAG.sub("", text))
    text = re.sub(r"\s+", " ", text)
    text = _SPACE_AFTER.sub(r"\1", _SPACE_BEFORE.sub(r"\1", text))
    return text.strip()


_BLOCK_LETTER = {"BOOK": "b", "CHAPTER": "c", "VERSE": "v"}


class ZTextModule:
    """One SWORD zText module read straight from its files: `{ot,nt}.?zv` (per verse entry: block
    number, offset and length, `<IIH`), `.?zs` (per block: offset, compressed and plain size,
    `<III`) and `.?zz` (the zlib blocks). Each block is decompressed once (pysword's reader does
    it again for every verse: 90 s instead of 2 s for a Bible). Entry indices come from the
    module's versification (pysword's `BibleStructure`).

    Raises:
        ValueError: no module `name` under `root`, or a driver/compression other than zText/ZIP.
    """

    def __init__(self, root: str | Path, name: str) -> None:
        try:
            from pysword.books import BibleStructure
            from pysword.modules import SwordModules
        except ImportError as err:  # pragma: no cover - a dependency of attnlab
            raise ImportError("reading SWORD Bible modules needs `pysword` (pip install pysword)") from err
        root = Path(root)
        found = SwordModules(str(root)).parse_modules()
        if name not in found:
            raise ValueError(f"{root}: no SWORD module {name!r} (found: {', '.join(sorted(found)) or 'none'})")
        conf = found[name]
        driver, compress = conf.get("moddrv", "").lower(), conf.get("compresstype", "ZIP").upper()
        if driver != "ztext" or compress != "ZIP":
            raise ValueError(f"SWORD module {name!r}: driver {driver!r} with {compress!r} compression; only zText "
                             "modules with ZIP compression are read")
        self.folder = root / conf["datapath"].lstrip("./")
        self.letter = _BLOCK_LETTER[conf.get("blocktype", "BOOK").upper()]
        self.structure = BibleStructure(conf.get("versification", "KJV").lower())
        self._files: dict[str, tuple[list, list, bytes]] = {}
        self._blocks: dict[tuple[str, int], bytes] = {}

    def _testament(self, testament: str) -> tuple[list, list, bytes]:
        if testament not in self._files:
            base = self.folder / f"{testament}.{self.letter}z"
            entries = list(struct.iter_unpack("<IIH", Path(f"{base}v").read_bytes()))
            blocks = list(struct.iter_unpack("<III", Path(f"{base}s").read_bytes()))
            self._files[testament] = (entries, blocks, Path(f"{base}z").read_bytes())
        return self._files[testament]

    def entry(self, testament: str, index: int) -> str:
        """The raw (OSIS) text of entry `index` of `testament` ("ot" or "nt"); "" past the end."""
        entries, blocks, data = self._testament(testament)
        if index >= len(entries):
            return ""
        block, start, length = entries[index]
        if (testament, block) not in self._blocks:
            offset, size, _ = blocks[block]
            self._blocks[(testament, block)] = zlib.decompress(data[offset:offset + size])
        return self._blocks[(testament, block)][start:start + length].decode("utf-8", errors="replace")

    def chapter_lengths(self) -> dict[tuple[str, int], int]:
        """(OSIS book, chapter) -> verse count in the module's versification."""
        return {(book.osis_name, c): n for books in self.structure.get_books().values() for book in books
                for c, n in enumerate(book.chapter_lengths, start=1)}

    def verses(self) -> dict[Reference, str]:
        """Every non-empty verse as plain text (`osis_to_text`), keyed by (OSIS book, chapter, verse)."""
        verses: dict[Reference, str] = {}
        for testament, books in self.structure.get_books().items():
            for book in books:
                refs = [(book.osis_name, chapter, verse) for chapter, count in enumerate(book.chapter_lengths, start=1)
                        for verse in range(1, count + 1)]
                indices = self.structure.ref_to_indicies(books=[book.name])[testament]
                for ref, index in zip(refs, indices):
                    text = osis_to_text(self.entry(testament, index))
                    if text:
                        verses[ref] = text
        return verses


def verse_pairs(source: dict[Reference, str], target: dict[Reference, str],
                same_chapters: set[tuple[str, int]] | None = None,
                max_ratio: float = 2.0) -> list[tuple[Reference, str, str]]:
    """(reference, source text, target text) for every reference both sides have, in canonical
    order; with `same_chapters`, only verses of those (book, chapter)s (see the module docstring).
    Pairs whose lengths in characters differ by more than `max_ratio` are dropped: they are the
    places where the two numberings still disagree (a verse split differently, a closing
    greeting numbered apart) or where one side carries extra matter (the WEB appends a glossary
    to Revelation 22:21); in the WEB/RV1909 pairing that is 63 of 31,046.
    """
    pairs = []
    for ref, text in source.items():
        other = target.get(ref)
        if other is None or (same_chapters is not None and ref[:2] not in same_chapters):
            continue
        if max(len(text), len(other)) <= max_ratio * min(len(text), len(other)):
            pairs.append((ref, text, other))
    return pairs


def held_out_verse(ref: Reference, every: int) -> bool:
    """Whether `split_pairs(by="verse")` holds this verse out: a stable hash of its reference,
    1 in `every`."""
    return zlib.crc32(f"{ref[0]} {ref[1]}:{ref[2]}".encode()) % every == 0


def split_pairs(pairs: list[tuple[Reference, str, str]], by: str = "verse", every: int = 30,
                books: tuple[str, ...] = HELD_OUT_BOOKS) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, valid) pairs: valid is every `every`-th verse by hash (`by="verse"`) or the verses
    of `books` (`by="book"`). (The corpus builder then drops training pairs that share a sentence
    with valid: `attnlab.data.corpora.disjoint_pairs`.)

    Raises:
        ValueError: `by` is neither "verse" nor "book".
    """
    if by not in ("verse", "book"):
        raise ValueError(f"by must be 'verse' or 'book', got {by!r}")
    held = (lambda ref: ref[0] in books) if by == "book" else (lambda ref: held_out_verse(ref, every))
    train = [(s, t) for ref, s, t in pairs if not held(ref)]
    return train, [(s, t) for ref, s, t in pairs if held(ref)]
