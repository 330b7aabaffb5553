"""GNU gettext `.mo` catalogues: read (and, for tests and fixtures, write) the binary format.

Layout (GNU gettext manual, "The Format of GNU MO Files",
https://www.gnu.org/software/gettext/manual/html_node/MO-Files.html); all numbers are
uint32 in the byte order the magic number reveals:

    offset  0   magic 0x950412de           (read as 0xde120495: the other byte order)
            4   revision (major 0 or 1)
            8   N  number of strings
           12   O  offset of the table of original strings
           16   T  offset of the table of translated strings
           20   S, H  size and offset of the hash table (ignored here)
    O + 8i      (length, offset) of original string i   (the bytes at offset, length bytes, NUL after)
    T + 8i      (length, offset) of translation i

An original is `msgctxt EOT msgid` when it has a context (EOT = 0x04) and `msgid NUL
msgid_plural` for plural forms, whose translation holds the forms separated by NUL. The
entry with the empty msgid is the header (metadata), not a message.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

MAGIC = 0x950412DE
CONTEXT_SEPARATOR = "\x04"


@dataclass(frozen=True)
class Message:
    """One catalogue entry: `msgid` (the English source), `msgstr` (the translation; the first
    form for plurals), optional `context` (msgctxt) and `plural` (msgid_plural)."""

    msgid: str
    msgstr: str
    context: str | None = None
    plural: str | None = None


def read_mo(data: bytes, *, source: str = "catalogue", encoding: str = "utf-8") -> list[Message]:
    """Parse a `.mo` file's bytes (module docstring) into its messages, header left out.

    Args:
        data: the whole file.
        source: a name for error messages (e.g. the file path).
        encoding: the strings' encoding (LibreOffice and most catalogues: UTF-8).

    Returns:
        the messages in table order (gettext sorts the originals), untranslated ones (empty
        msgstr) included.

    Raises:
        ValueError: not a .mo file (bad magic), an unknown major revision, or a table or
            string that points outside the file.
    """
    if len(data) < 28:
        raise ValueError(f"{source}: {len(data)} bytes is too short for a .mo file (28-byte header)")
    for order in ("<", ">"):
        if struct.unpack(order + "I", data[:4])[0] == MAGIC:
            break
    else:
        raise ValueError(f"{source}: not a .mo file (magic {data[:4].hex()}, expected 950412de in either byte order)")
    revision, n, originals, translations = struct.unpack(order + "4I", data[4:20])
    if revision >> 16 not in (0, 1):
        raise ValueError(f"{source}: unsupported .mo major revision {revision >> 16}")

    def string(table: int, i: int) -> str:
        at = table + 8 * i
        if at + 8 > len(data):
            raise ValueError(f"{source}: string table entry {i} at byte {at} lies outside the file")
        length, offset = struct.unpack(order + "2I", data[at:at + 8])
        if offset + length > len(data):
            raise ValueError(f"{source}: string {i} (bytes {offset}..{offset + length}) lies outside the file")
        return data[offset:offset + length].decode(encoding)

    out = []
    for i in range(n):
        original, translated = string(originals, i), string(translations, i)
        context = None
        if CONTEXT_SEPARATOR in original:
            context, original = original.split(CONTEXT_SEPARATOR, 1)
        msgid, _, plural = original.partition("\0")
        if not msgid and context is None:
            continue  # the header
        out.append(Message(msgid, translated.split("\0")[0], context, plural or None))
    return out


def read_mo_file(path: str | os.PathLike) -> list[Message]:
    """`read_mo` of a file on disk (errors name the path)."""
    path = Path(path)
    return read_mo(path.read_bytes(), source=str(path))


def write_mo(messages: Sequence[Message], *, header: str = "Content-Type: text/plain; charset=UTF-8\n",
             byte_order: str = "<") -> bytes:
    """A `.mo` file holding `messages` (and the header as the empty msgid), without a hash table.

    Args:
        messages: the entries; plural translations are not represented (one form).
        header: the metadata string stored under the empty msgid.
        byte_order: "<" little-endian or ">" big-endian.

    Returns:
        the file's bytes; `gettext.GNUTranslations` and `read_mo` both read them.

    Raises:
        ValueError: a byte order other than "<" or ">".
    """
    if byte_order not in ("<", ">"):
        raise ValueError(f"byte_order must be '<' or '>', got {byte_order!r}")
    entries = [(b"", header.encode("utf-8"))]
    for m in messages:
        key = (m.context + CONTEXT_SEPARATOR if m.context is not None else "") + m.msgid
        if m.plural is not None:
            key += "\0" + m.plural
        entries.append((key.encode("utf-8"), m.msgstr.encode("utf-8")))
    entries.sort(key=lambda e: e[0])  # gettext's binary search expects sorted originals
    n = len(entries)
    originals, translations = 28, 28 + 8 * n
    offset = 28 + 16 * n
    tables = [b"", b""]
    blob = b""
    for column in (0, 1):
        for entry in entries:
            s = entry[column]
            tables[column] += struct.pack(byte_order + "2I", len(s), offset + len(blob))
            blob += s + b"\0"
    head = struct.pack(byte_order + "7I", MAGIC, 0, n, originals, translations, 0, 0)
    return head + tables[0] + tables[1] + blob
