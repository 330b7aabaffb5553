"""Text normalization applied before a tokenizer splits text into words.

A :class:`Normalizer` is built from, and saved as, the ``normalizer`` block of a Hugging Face
``tokenizer.json``: ``BertNormalizer``, ``NFC``/``NFD``/``NFKC``/``NFKD``, ``Lowercase`` and a
``Sequence`` of those. Keeping the block itself makes saving lossless.

BERT's clean-up follows the Rust implementation behind ``BertTokenizerFast`` (Devlin et al.
2019, and Google's ``tokenization.py``), in this order:

1. drop NUL, U+FFFD and control/format/private-use characters (categories Cc, Cf, Co, Cs;
   tab, newline and carriage return count as whitespace instead); turn every whitespace
   character into a plain space;
2. put spaces around CJK ideographs so that each one becomes a word;
3. strip accents: NFD, then drop non-spacing marks (Mn);
4. lower-case.

Character classes come from Python's ``unicodedata`` (Unicode 14 on Python 3.11). Hugging
Face's Rust code takes them from older (categories) and newer (lower-casing) Unicode tables,
so the two differ on about 560 code points added to Unicode after version 9 (rare scripts,
e.g. U+0898-U+089F); text in other characters is normalized identically.
"""

from __future__ import annotations

import unicodedata
from typing import Any

#: Characters with Unicode's White_Space property (as Rust's ``char::is_whitespace``).
_WHITESPACE = frozenset(
    map(chr, [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
              0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
)
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})
#: clean_text on ASCII: tab, newline and return become spaces; other controls go.
_ASCII_CLEAN = {**{c: None for c in [*range(32), 127]}, 9: " ", 10: " ", 13: " "}

#: CJK Unified Ideographs and their extensions, as BERT defines "Chinese characters".
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def is_whitespace(char: str) -> bool:
    """True for characters BERT treats as a space (White_Space, tab, newline, return)."""
    return char in _WHITESPACE


def is_control(char: str) -> bool:
    """True for characters BERT's clean-up drops (tab, newline and return are whitespace)."""
    return char not in "\t\n\r" and unicodedata.category(char) in _CONTROL_CATEGORIES


def is_cjk(char: str) -> bool:
    """True for a CJK ideograph (each becomes its own word in BERT)."""
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in _CJK_RANGES)


def is_punctuation(char: str) -> bool:
    """True for ASCII punctuation/symbols (``$``, ``+``, ``^`` too) and Unicode P* characters."""
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def clean_text(text: str) -> str:
    """BERT step 1: drop control characters and normalize whitespace to ``" "``.

    Example:
        >>> clean_text("a\\tb\\x00c\\u200bd")
        'a bcd'
    """
    if text.isascii():  # fast path: the same rules, as a translation table
        return text.translate(_ASCII_CLEAN)
    out = []
    for char in text:
        if char == "\x00" or char == "\ufffd" or is_control(char):
            continue
        out.append(" " if char in _WHITESPACE else char)
    return "".join(out)


def space_cjk(text: str) -> str:
    """BERT step 2: surround each CJK ideograph with spaces: ``"a中b"`` → ``"a 中 b"``."""
    if text.isascii():
        return text
    return "".join(f" {c} " if is_cjk(c) else c for c in text)


def lowercase(text: str) -> str:
    """Lower-case one character at a time, as Hugging Face does (``"ΟΔΟΣ"`` → ``"οδοσ"``).

    ``str.lower`` would write a final sigma (``"οδος"``); the per-character rule does not.
    """
    if text.isascii():
        return text.lower()
    return "".join(c.lower() for c in text)


def strip_accents(text: str) -> str:
    """BERT step 3: NFD, then drop non-spacing marks: ``"Café"`` → ``"Cafe"``."""
    if text.isascii():
        return text
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


class Normalizer:
    """A text normalizer described by a Hugging Face ``normalizer`` block.

    Args:
        spec: the JSON block, e.g. ``{"type": "BertNormalizer", "lowercase": True, ...}``,
            or ``None`` for no normalization.

    Raises:
        ValueError: if the block's ``type`` is not one attnlab implements.
    """

    SUPPORTED = ("BertNormalizer", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Sequence")

    def __init__(self, spec: dict[str, Any] | None) -> None:
        self.spec = spec
        self._steps = _compile(spec) if spec is not None else []

    @classmethod
    def bert(cls, lowercase: bool = True, strip_accents: bool | None = None) -> "Normalizer":
        """BERT's normalizer; ``strip_accents=None`` means "strip when lower-casing"."""
        return cls({"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                    "strip_accents": strip_accents, "lowercase": lowercase})

    def __call__(self, text: str) -> str:
        for step in self._steps:
            text = step(text)
        return text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Normalizer) and self.spec == other.spec

    def __repr__(self) -> str:
        return f"Normalizer({self.spec!r})"


def _compile(spec: dict[str, Any]) -> list:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return [lambda text, form=kind: unicodedata.normalize(form, text)]
    if kind == "Lowercase":
        return [lowercase]
    if kind == "Sequence":
        return [step for sub in spec.get("normalizers", []) for step in _compile(sub)]
    if kind == "BertNormalizer":
        do_lower = bool(spec.get("lowercase", True))
        do_strip = spec.get("strip_accents")
        steps = []
        if spec.get("clean_text", True):
            steps.append(clean_text)
        if spec.get("handle_chinese_chars", True):
            steps.append(space_cjk)
        if do_lower if do_strip is None else do_strip:
            steps.append(strip_accents)
        if do_lower:
            steps.append(lowercase)
        return steps
    raise ValueError(
        f"normalizer: unsupported type {kind!r} in {spec!r}; attnlab reads {', '.join(Normalizer.SUPPORTED)}"
    )
