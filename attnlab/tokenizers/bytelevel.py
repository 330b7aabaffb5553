"""GPT-2's byte-level alphabet and its pre-tokenizer.

Byte-level BPE works on UTF-8 bytes, so every string can be encoded and nothing is ever
unknown. GPT-2 writes each of the 256 bytes as one printable character, so that tokens stay
readable strings in ``encoder.json`` / ``vocab.json``: printable Latin-1 bytes stand for
themselves and the rest (control bytes, space, ...) are moved to U+0100 onwards; a space
becomes ``Ġ`` (U+0120), a newline ``Ċ`` (U+010A).

Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", section 2.2.
"""

from __future__ import annotations

import functools

import regex

#: GPT-2's split pattern: contractions, letter runs, number runs, other symbol runs (each with
#: an optional leading space), then whitespace (a run before a non-space leaves its last space
#: to the next word).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.lru_cache(maxsize=None)
def byte_to_char() -> dict[int, str]:
    """The GPT-2 byte → character table (a bijection on the 256 bytes).

    Example:
        >>> byte_to_char()[ord("a")], byte_to_char()[ord(" ")], byte_to_char()[ord("\\n")]
        ('a', 'Ġ', 'Ċ')
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


@functools.lru_cache(maxsize=None)
def char_to_byte() -> dict[str, int]:
    """The inverse of :func:`byte_to_char`."""
    return {c: b for b, c in byte_to_char().items()}


def alphabet() -> list[str]:
    """The 256 byte characters in code point order: the printable bytes first, then the
    moved ones. GPT-2's ``encoder.json`` gives them ids 0-255 in this order."""
    return sorted(byte_to_char().values())


@functools.lru_cache(maxsize=None)
def _latin1_to_char() -> dict[int, str]:
    """:func:`byte_to_char` as a ``str.translate`` table over Latin-1 characters (byte b is
    character b in Latin-1), for the bytes that are not their own character."""
    return {b: c for b, c in byte_to_char().items() if chr(b) != c}


def to_byte_chars(text: str) -> str:
    """Spell ``text``'s UTF-8 bytes in the byte alphabet: ``" héllo"`` → ``"ĠhÃ©llo"``."""
    return text.encode("utf-8").decode("latin-1").translate(_latin1_to_char())


def decode_byte_tokens(tokens: list[str]) -> str:
    """Join byte-level tokens back into text.

    A token made only of byte characters gives those bytes; any other token (for instance a
    special token holding a space) gives its own UTF-8 bytes, as Hugging Face's ByteLevel
    decoder does. Byte sequences that are not valid UTF-8 (a cut through a multi-byte
    character) become U+FFFD.
    """
    table = char_to_byte()
    out = bytearray()
    for token in tokens:
        try:
            out.extend(table[c] for c in token)
        except KeyError:
            out.extend(token.encode("utf-8"))
    return out.decode("utf-8", errors="replace")


def split_text(text: str, pattern: regex.Pattern[str]) -> list[str]:
    """Split ``text`` into the pattern's matches, keeping any unmatched gap as a piece too.

    GPT-2's pattern matches every character, so there are no gaps with it; a custom pattern
    may leave some, and keeping them makes sure no text is ever dropped (Hugging Face's
    ``Split(behavior="isolated")`` does the same). When the matches cover the text (as GPT-2's
    always do), ``findall`` alone gives the pieces, without a Python step per match.

    Example:
        >>> split_text("Hello world!!  ok", regex.compile(GPT2_PATTERN))
        ['Hello', ' world', '!!', ' ', ' ok']
    """
    if not pattern.groups:  # (with groups, findall returns the groups, not the matches)
        pieces = pattern.findall(text)
        if sum(map(len, pieces)) == len(text) and "" not in pieces:
            return pieces
    pieces = []
    pos = 0
    for match in pattern.finditer(text):
        start, end = match.span()
        if start > pos:
            pieces.append(text[pos:start])
        if end > start:
            pieces.append(text[start:end])
        pos = end
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces
