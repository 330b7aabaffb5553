"""The Ding English-German dictionary in dictd format (Debian's `dict-de-en`): an index of
`headword<TAB>offset<TAB>length` lines (numbers in dictd's base 64) into the uncompressed data,
each entry a headword line followed by its definition lines (German translations indented by
three spaces, grammar in {..}, usage in [..], glosses in (..)). `dictd_sentence_pairs` and
`dictd_lexicon_pairs` turn it into English->German pairs (the `de-en` and `de-en-lexicon`
corpora, `attnlab.data.corpora`).
"""

from __future__ import annotations

import re
from typing import Iterator

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _dictd_number(text: str) -> int:
    n = 0
    for char in text:
        n = n * 64 + _B64.index(char)
    return n


def _is_sentence(text: str, min_words: int = 3) -> bool:
    return bool(re.match(r"^[A-ZÄÖÜ\"'‘“][^\[\]{}|<>/]*[.!?]$", text)) and len(text.split()) >= min_words


def dictd_entries(index_text: str, data: bytes) -> Iterator[tuple[str, list[str]]]:
    """(headword, definition lines) of each entry of a dictd index + uncompressed data."""
    for line in index_text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[0].startswith("00"):
            continue
        offset, length = _dictd_number(fields[1]), _dictd_number(fields[2])
        lines = data[offset: offset + length].decode("utf-8", errors="replace").split("\n")
        yield lines[0].strip(), lines[1:]


def dictd_sentence_pairs(index_text: str, data: bytes) -> list[tuple[str, str]]:
    """English->German pairs from the Ding dictionary in dictd format (index + data), keeping
    entries whose English headword and first German translation are full sentences.

    Returns:
        sorted unique (english, german) pairs.
    """
    pairs = set()
    for english, lines in dictd_entries(index_text, data):
        if not _is_sentence(english):
            continue
        german = " ".join(x.strip() for x in lines if x.strip() and not x.startswith(" (") and
                          not (x.startswith(" [") and not x.startswith("   ")))
        german = re.sub(r"\{[^}]*\}|\[[^\]]*\]|<[^>]*>", "", german).split(";")[0]
        german = re.sub(r"\s+", " ", german).strip()
        if _is_sentence(german, min_words=1):
            pairs.add((english, german))
    return sorted(pairs)


def dictd_lexicon_pairs(index_text: str, data: bytes) -> list[tuple[str, str]]:
    """English->German word and phrase pairs of the Ding dictionary: every entry whose English
    headword is not a sentence, with the first German translation (grammar {..}, usage [..]
    and glosses (..) removed); entries whose translation is empty or the headword itself are
    skipped. The first entry of a headword wins.

    Returns:
        sorted (english, german) pairs, one per English headword.
    """
    pairs: dict[str, str] = {}
    for english, lines in dictd_entries(index_text, data):
        if english in pairs or _is_sentence(english) or not re.search(r"[^\W\d_]{2}", english):
            continue
        german = " ".join(x.strip() for x in lines if x.startswith("   "))  # translation lines are indented
        german = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\([^)]*\)|<[^>]*>", "", german).split(";")[0]
        german = re.sub(r"\s+", " ", german).strip(" ,")
        if re.search(r"[^\W\d_]{2}", german) and german.lower() != english.lower():
            pairs[english] = german
    return sorted(pairs.items())
