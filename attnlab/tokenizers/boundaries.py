"""Where words start in rows of token ids: what whole-word masking (BERT) and SpanBERT's spans of
whole words need to know of a tokenizer.

| kind      | token i starts a word when                                                      |
|-----------|----------------------------------------------------------------------------------|
| wordpiece | it does not carry the continuation prefix (``##``)                               |
| bpe, char | its text begins with whitespace and token i-1's text does not end with it        |
| word      | always (each token is a word)                                                    |

and, for every kind, at i = 0 (a window may start inside a word: its rest counts as a word), at
a special token and right after one (``[CLS]``, ``<|endoftext|>`` are words of their own).

Byte-level BPE and characters keep whitespace, and a word's leading space sits in its first
token (GPT-2's ``Ġ``): ``" the king"`` is ``Ġthe Ġking``, two words. Whitespace belongs to the
word after it, so a line break opens the next word (``.\n\nFirst`` is ``.`` then
``\n\nFirst``), and punctuation glued to a word stays in it (``king,`` is one word), as a
whitespace split would have it. BPE's whitespace is read from a token's first and last byte
(ASCII space, tab, line feed, carriage return, vertical tab, form feed); characters use
``str.isspace``. WordPiece and word tokens hold no whitespace: BERT's pre-tokenizer already made
punctuation words of their own. A tokenizer of another kind has no notion of words here: every
token counts as one.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.tokenizers.bytelevel import char_to_byte

_ASCII_SPACE = frozenset(b" \t\n\r\x0b\x0c")
_TABLES: "weakref.WeakKeyDictionary[Any, tuple[tuple, np.ndarray, np.ndarray]]" = weakref.WeakKeyDictionary()


def _edges(kind: str, token: str, prefix: str) -> tuple[bool, bool]:
    """(can this token open a word, does it end in whitespace) for one vocabulary entry."""
    if kind == "wordpiece":
        return not token.startswith(prefix), False
    if kind == "bpe":
        table = char_to_byte()
        first, last = table.get(token[0]), table.get(token[-1])
        return first in _ASCII_SPACE, last in _ASCII_SPACE
    if kind == "char":
        return token[0].isspace(), token[-1].isspace()
    return True, False  # word, or a kind with no notion of words: every token is one


def word_tables(tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-id bool arrays (vocab_size,): `opens` (the token can start a word) and `trails` (its
    text ends with whitespace, so the next token starts no word of its own unless it is whitespace).
    Cached per tokenizer (until its vocabulary or special tokens change)."""
    stamp = (tokenizer.vocab_size, tuple(tokenizer.all_special_ids))
    cached = _TABLES.get(tokenizer)
    if cached is not None and cached[0] == stamp:
        return cached[1], cached[2]
    kind, prefix = tokenizer.kind, getattr(tokenizer.model, "prefix", "##")
    opens = np.ones(tokenizer.vocab_size, dtype=bool)
    trails = np.zeros(tokenizer.vocab_size, dtype=bool)
    for i in range(tokenizer.vocab_size):
        token = tokenizer.id_to_token(i)
        if token:
            opens[i], trails[i] = _edges(kind, token, prefix)
    opens[tokenizer.all_special_ids] = True
    trails[tokenizer.all_special_ids] = False
    _TABLES[tokenizer] = (stamp, opens, trails)
    return opens, trails


def word_starts(tokenizer: Any, ids: Tensor) -> Tensor:
    """(B, T) bool, True where a word starts in each row of `ids` (B, T) (see the module docstring).

    Example:
        >>> from attnlab.tokenizers import Tokenizer
        >>> tok = Tokenizer.train(["the king is dead"] * 5, kind="char")
        >>> word_starts(tok, torch.tensor([tok.encode("the king")]))  # "the", " king"
        tensor([[ True, False, False,  True, False, False, False, False]])

    Raises:
        ValueError: `ids` is not 2-D.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must be (B, T), got shape {tuple(ids.shape)}")
    opens, trails = (torch.from_numpy(t) for t in word_tables(tokenizer))
    special = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    special[tokenizer.all_special_ids] = True
    starts = opens[ids].clone()
    starts[:, 1:] &= ~trails[ids[:, :-1]]
    is_special = special[ids]
    starts |= is_special
    starts[:, 1:] |= is_special[:, :-1]
    starts[:, :1] = True  # (a row of no tokens has no first one)
    return starts
