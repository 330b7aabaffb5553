"""Special tokens: the roles they play, and finding them in text so they are never split.

A *role* names what a special token is for: ``pad``, ``unk``, ``bos``, ``eos``, ``cls``,
``sep``, ``mask`` (BERT), ``start``, ``delim``, ``extract`` (GPT-1's input transformations,
Radford et al. 2018). Roles are inferred from the usual spellings (``[PAD]``, ``<pad>``,
``<|endoftext|>``, ...) or given explicitly. T5's sentinels ``<extra_id_0>``, ``<extra_id_1>``,
... are special tokens too (Raffel et al. 2020).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import regex

ROLES = ("pad", "unk", "bos", "eos", "cls", "sep", "mask", "start", "delim", "extract")

#: Spellings recognised for each role, most specific first.
ROLE_SPELLINGS: dict[str, tuple[str, ...]] = {
    "pad": ("[PAD]", "<pad>", "<|pad|>", "<|padding|>"),
    "unk": ("[UNK]", "<unk>", "<|unk|>"),
    "bos": ("<s>", "<bos>", "<|bos|>", "<|startoftext|>", "<|begin_of_text|>", "<|endoftext|>"),
    "eos": ("</s>", "<eos>", "<|eos|>", "<|end_of_text|>", "<|endoftext|>"),
    "cls": ("[CLS]", "<cls>"),
    "sep": ("[SEP]", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
    "start": ("[START]",),
    "delim": ("[DELIM]",),
    "extract": ("[EXTRACT]",),
}

_SENTINEL = re.compile(r"<extra_id_(\d+)>")


def infer_roles(tokens: Iterable[str]) -> dict[str, str]:
    """Guess each role's token from its spelling.

    GPT-2's ``<|endoftext|>`` plays both ``bos`` and ``eos`` (as in GPT-2 itself).

    Example:
        >>> infer_roles(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        {'pad': '[PAD]', 'unk': '[UNK]', 'cls': '[CLS]', 'sep': '[SEP]', 'mask': '[MASK]'}
    """
    present = set(tokens)
    roles = {}
    for role, spellings in ROLE_SPELLINGS.items():
        for spelling in spellings:
            if spelling in present:
                roles[role] = spelling
                break
    return roles


def check_roles(roles: dict[str, str]) -> None:
    """Raise ``ValueError`` for a role name attnlab does not know."""
    for role, token in roles.items():
        if role not in ROLES:
            raise ValueError(f"roles: unknown role {role!r}; known roles are {', '.join(ROLES)}")
        if not isinstance(token, str) or not token:
            raise ValueError(f"roles: the token for {role!r} must be a non-empty string, got {token!r}")


def sentinel_index(token: str) -> int | None:
    """The number of a T5 sentinel: ``"<extra_id_3>"`` → 3; ``None`` for other tokens."""
    match = _SENTINEL.fullmatch(token)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class AddedToken:
    """A token matched in raw text before any other processing, and never split.

    Attributes:
        content: the token's text.
        id: its id.
        special: left out by ``decode(..., skip_special_tokens=True)``.
        lstrip / rstrip: the match also swallows whitespace on its left / right.
        single_word: only matched when not inside a word.
        normalized: kept for Hugging Face files; attnlab always matches the raw text.
    """

    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


class SpecialSplitter:
    """Cuts text around added tokens, longest match first at each position.

    Example:
        >>> SpecialSplitter(["<|endoftext|>"]).split("a<|endoftext|>b")
        [('a', False), ('<|endoftext|>', True), ('b', False)]
    """

    def __init__(self, tokens: Iterable[str | AddedToken]) -> None:
        added = {t.content if isinstance(t, AddedToken) else t: t for t in tokens}
        ordered = sorted(added, key=lambda t: (-len(t), t))
        self._tokens = ordered
        alternatives = []
        for content in ordered:
            token = added[content]
            body = f"({regex.escape(content)})"
            if isinstance(token, AddedToken):
                if token.single_word:
                    body = rf"(?<!\w){body}(?!\w)"
                body = (r"\s*" if token.lstrip else "") + body + (r"\s*" if token.rstrip else "")
            alternatives.append(body)
        self._regex = regex.compile("|".join(alternatives)) if alternatives else None

    def split(self, text: str) -> list[tuple[str, bool]]:
        """``(segment, is_added_token)`` pairs covering ``text``; empty segments are left out.

        Whitespace swallowed by ``lstrip``/``rstrip`` tokens is dropped.
        """
        if self._regex is None:
            return [(text, False)] if text else []
        parts: list[tuple[str, bool]] = []
        pos = 0
        for match in self._regex.finditer(text):
            if match.start() > pos:
                parts.append((text[pos:match.start()], False))
            parts.append((self._tokens[match.lastindex - 1], True))
            pos = match.end()
        if pos < len(text):
            parts.append((text[pos:], False))
        return parts
