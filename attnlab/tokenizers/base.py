"""What every tokenizer model provides to :class:`attnlab.tokenizers.Tokenizer`.

A *model* turns ordinary text (no special tokens in it) into ids and token strings back into
text. Special tokens, templates ([CLS] ... [SEP]), truncation and padding live one level up,
in ``Tokenizer``, and are shared by all kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar


class TokenModel(ABC):
    """Base class of the BPE, WordPiece, character and word models.

    Attributes:
        kind: ``"bpe"``, ``"wordpiece"``, ``"char"`` or ``"word"``.
        vocab: token string → id.
        unk_token: the token that stands for what the vocabulary cannot spell, or ``None``.
    """

    kind: ClassVar[str]
    vocab: dict[str, int]
    unk_token: str | None

    #: A per-word cache is cleared when it grows past this many entries.
    CACHE_SIZE: ClassVar[int] = 100_000

    @abstractmethod
    def encode_text(self, text: str) -> list[int]:
        """Ids of ``text``, which holds no special tokens."""

    @abstractmethod
    def decode_tokens(self, tokens: list[str]) -> str:
        """Text of a list of token strings (special tokens included, as they are)."""

    def _check_unk(self) -> None:
        if self.unk_token is not None and self.unk_token not in self.vocab:
            raise ValueError(f"unk_token {self.unk_token!r} is not in the vocabulary; add it to vocab")
