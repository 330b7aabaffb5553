"""``Tokenizer.train``: from a corpus to a tokenizer of any kind.

==========  ===================================  ===========================================
kind        default special tokens               what is learned
==========  ===================================  ===========================================
bpe         ``<|endoftext|>``                    byte-level merges (``bpe_trainer.py``)
wordpiece   ``[PAD] [UNK] [CLS] [SEP] [MASK]``   WordPiece vocabulary (``wordpiece_trainer.py``)
char        ``<pad> <unk>``                      the most frequent characters
word        ``<pad> <unk>``                      the most frequent words (``word.py``)
==========  ===================================  ===========================================
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from attnlab.tokenizers.bpe import BPEModel
from attnlab.tokenizers.bpe_trainer import train_bpe
from attnlab.tokenizers.bytelevel import GPT2_PATTERN, to_byte_chars
from attnlab.tokenizers.char import CharModel, train_char
from attnlab.tokenizers.corpus import TextsOrFiles, check_has_text, count_words
from attnlab.tokenizers.normalizers import Normalizer
from attnlab.tokenizers.special import ROLES, AddedToken, check_roles, infer_roles
from attnlab.tokenizers.word import WordModel, train_word
from attnlab.tokenizers.wordpiece import WordPieceModel, split_words
from attnlab.tokenizers.wordpiece_trainer import train_wordpiece

KINDS = ("bpe", "wordpiece", "char", "word")

DEFAULT_SPECIAL_TOKENS = {
    "bpe": ["<|endoftext|>"],
    "wordpiece": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "char": ["<pad>", "<unk>"],
    "word": ["<pad>", "<unk>"],
}
DEFAULT_VOCAB_SIZE = {"bpe": 8000, "wordpiece": 8000, "char": None, "word": None}  # char, word: every one seen
DEFAULT_MIN_FREQUENCY = {"bpe": 2, "wordpiece": 2, "char": 1, "word": 1}
RAN_OUT_OF = {"bpe": "pairs to merge", "wordpiece": "pieces", "char": "distinct characters",
              "word": "distinct words"}
UNK_EXAMPLE = {"wordpiece": "[UNK]", "char": "<unk>", "word": "<unk>"}  # the kinds that need an unknown token


def special_tokens_and_roles(
    special_tokens: list[str] | tuple[str, ...] | Mapping[str, str] | None, kind: str
) -> tuple[list[str], dict[str, str]]:
    """Normalise ``special_tokens``: a list (roles inferred from spelling) or ``{role: token}``.

    Raises:
        ValueError: unknown role; a non-string token; no unknown token for wordpiece/char/word.
        TypeError: if ``special_tokens`` is neither a list nor a mapping.
    """
    if special_tokens is None:
        special_tokens = DEFAULT_SPECIAL_TOKENS[kind]
    if isinstance(special_tokens, Mapping):
        roles = dict(special_tokens)
        check_roles(roles)
        tokens = list(dict.fromkeys(roles.values()))
    elif isinstance(special_tokens, (list, tuple)):
        tokens = list(dict.fromkeys(special_tokens))
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise ValueError(f"special_tokens: each token must be a non-empty string, got {token!r}")
        roles = infer_roles(tokens)
    else:
        raise TypeError(
            "special_tokens must be a list of strings or a {role: token} dict "
            f"(roles: {', '.join(ROLES)}); got {type(special_tokens).__name__}"
        )
    if kind in UNK_EXAMPLE and "unk" not in roles:
        raise ValueError(f"special_tokens: a {kind} tokenizer needs an unknown token; add {UNK_EXAMPLE[kind]!r}")
    return tokens, roles


def train_tokenizer(
    texts_or_files: TextsOrFiles,
    kind: str = "bpe",
    vocab_size: int | None = None,
    special_tokens: list[str] | tuple[str, ...] | Mapping[str, str] | None = None,
    min_frequency: int | None = None,
    show_progress: bool = False,
    *,
    lowercase: bool = True,
    pattern: str | None = GPT2_PATTERN,
    add_prefix_space: bool = False,
    criterion: str = "frequency",
) -> dict[str, Any]:
    """Train a model; returns ``Tokenizer(...)`` keyword arguments. See ``Tokenizer.train``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if vocab_size is None:
        vocab_size = DEFAULT_VOCAB_SIZE[kind]
    elif isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    elif vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if min_frequency is None:
        min_frequency = DEFAULT_MIN_FREQUENCY[kind]
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 0:
        raise ValueError(f"min_frequency must be an int >= 0, got {min_frequency!r}")
    tokens, roles = special_tokens_and_roles(special_tokens, kind)

    if kind == "bpe":
        if vocab_size < 256 + len(tokens):  # checked before reading the corpus
            raise ValueError(
                f"vocab_size must be at least {256 + len(tokens)} for byte-level BPE "
                f"(256 bytes + {len(tokens)} special tokens), got {vocab_size}"
            )
        model = BPEModel({}, [], pattern=pattern, add_prefix_space=add_prefix_space)
        pieces = count_words(texts_or_files, model.pieces, tokens, show_progress)
        check_has_text(pieces, texts_or_files, kind)
        words = byte_words(pieces)
        vocab, merges = train_bpe(words, vocab_size, tokens, min_frequency, show_progress)
        model = BPEModel(vocab, merges, pattern=pattern, add_prefix_space=add_prefix_space)
    elif kind == "wordpiece":
        normalizer = Normalizer.bert(lowercase=lowercase)
        probe = WordPieceModel({roles["unk"]: 0}, unk_token=roles["unk"], normalizer=normalizer)
        counts = count_words(texts_or_files, probe.words, tokens, show_progress)
        check_has_text(counts, texts_or_files, kind)
        vocab = train_wordpiece(counts, vocab_size, tokens, min_frequency, criterion=criterion,
                                show_progress=show_progress)
        model = WordPieceModel(vocab, unk_token=roles["unk"], normalizer=normalizer)
    elif kind == "word":
        counts = count_words(texts_or_files, split_words, tokens, show_progress)
        check_has_text(counts, texts_or_files, kind)
        size = vocab_size if vocab_size is not None else len(tokens) + len(counts)
        model = WordModel(train_word(counts, size, tokens, max(min_frequency, 1)), unk_token=roles["unk"])
    else:
        counts = count_words(texts_or_files, lambda s: s, tokens, show_progress)
        check_has_text(counts, texts_or_files, kind)
        size = vocab_size if vocab_size is not None else len(tokens) + len(counts)
        model = CharModel(train_char(counts, size, tokens, max(min_frequency, 1)), unk_token=roles["unk"])
    added = [AddedToken(t, model.vocab[t]) for t in tokens]
    return {"model": model, "added_tokens": added, "roles": roles}


def byte_words(piece_counts: Mapping[str, int]) -> dict[str, int]:
    """Pre-tokenized pieces → the same counts keyed by their bytes in the byte alphabet
    (``" hé"`` → ``"ĠhÃ©"``; one word per piece, as UTF-8 is one-to-one). Counting the pieces
    first converts each distinct piece once, not each occurrence.

    Raises:
        ValueError: a piece that is not valid Unicode (a lone surrogate).
    """
    try:
        return {to_byte_chars(piece): count for piece, count in piece_counts.items()}
    except UnicodeEncodeError as err:
        raise ValueError(f"texts_or_files: text that cannot be encoded as UTF-8 (a lone surrogate?): {err}") from None


def warn_if_short(kind: str, requested: int | None, reached: int, min_frequency: int | None, *,
                  stacklevel: int = 2) -> None:
    """Warn when a vocabulary size asked for was not reached: a small corpus runs out of pairs to
    merge (pieces, characters) before it, and the tokenizer (and the model's embedding table,
    sized from it) comes out smaller than the number in the config. No warning for the default
    size, which nobody asked for."""
    if requested is None or reached >= requested:
        return
    least = min_frequency if min_frequency is not None else DEFAULT_MIN_FREQUENCY[kind]
    seen = f" seen at least min_frequency={least} times" if kind not in ("char", "word") or least > 1 else ""
    warnings.warn(f"vocab_size={requested} was asked for, {reached} reached: the corpus has no more "
                  f"{RAN_OUT_OF[kind]}{seen}; train on more text or ask for a smaller vocab_size",
                  UserWarning, stacklevel=stacklevel + 1)
