"""``Tokenizer.load``: find out what a path holds and read it.

Accepted: a ``tokenizer.json`` file or a folder holding one; a folder with ``vocab.json`` +
``merges.txt`` (Hugging Face slow GPT-2/RoBERTa files) or ``encoder.json`` + ``vocab.bpe``
(GPT-2's release), or either ``.json`` vocabulary file with its merges beside it; BERT's
``vocab.txt``, as a file or in a folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from attnlab.io.files import read_json
from attnlab.tokenizers import files
from attnlab.tokenizers.bpe import BPEModel
from attnlab.tokenizers.hf_json import from_hf
from attnlab.tokenizers.normalizers import Normalizer
from attnlab.tokenizers.special import ROLE_SPELLINGS, AddedToken, infer_roles
from attnlab.tokenizers.wordpiece import WordPieceModel

_KNOWN_SPECIALS = {spelling for spellings in ROLE_SPELLINGS.values() for spelling in spellings}
_PIPE_SPECIAL = re.compile(r"<\|[^|<>\s]+\|>")  # <|endoftext|>-style
_MERGES_FOR = {"vocab.json": "merges.txt", "encoder.json": "vocab.bpe"}


def load_parts(path: str | os.PathLike, *, lowercase: bool | None = None) -> dict[str, Any]:
    """Read ``path`` into ``Tokenizer(...)`` keyword arguments.

    Args:
        path: a file or folder (see the module docstring).
        lowercase: for a ``vocab.txt``: whether the vocabulary is uncased; by default read from
            a ``tokenizer_config.json`` beside it, else guessed (no upper-case letters → uncased).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: a folder without recognised files, an unknown file type, or bad content.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path: {str(path)!r} does not exist")
    if path.is_dir():
        layout = files.find_layout(path)
        if layout == ("tokenizer.json",):
            return from_hf(read_json(path / "tokenizer.json"))
        if layout == ("vocab.txt",):
            return _wordpiece_parts(path / "vocab.txt", lowercase)
        return _bpe_parts(path, layout)
    if path.name in _MERGES_FOR:
        merges = path.parent / _MERGES_FOR[path.name]
        if not merges.is_file():
            raise ValueError(f"path: {path.name} needs {merges.name} beside it in {str(path.parent)!r}")
        return _bpe_parts(path.parent, (path.name, merges.name))
    if path.suffix == ".json":
        return from_hf(read_json(path))
    if path.suffix == ".txt":
        return _wordpiece_parts(path, lowercase)
    raise ValueError(
        f"path: cannot tell what {str(path)!r} holds; pass a tokenizer.json, a vocab.txt, "
        "or a folder with tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe, or vocab.txt"
    )


def _bpe_parts(folder: Path, layout: tuple[str, ...]) -> dict[str, Any]:
    vocab, merges = files.read_bpe_folder(folder, layout)
    specials = [t for t in vocab if t in _KNOWN_SPECIALS or _PIPE_SPECIAL.fullmatch(t)]
    added = [AddedToken(t, vocab[t]) for t in specials]
    return {"model": BPEModel(vocab, merges), "added_tokens": added, "roles": infer_roles(specials)}


def _wordpiece_parts(path: Path, lowercase: bool | None) -> dict[str, Any]:
    vocab = files.read_vocab_txt(path)
    config = files.read_bert_config(path.parent)
    if lowercase is None:
        lowercase = config.get("do_lower_case", files.guess_lowercase(vocab))
    unk = config.get("unk_token", "[UNK]")
    if not isinstance(unk, str) or unk not in vocab:
        raise ValueError(f"path: {str(path)!r} has no unknown token {unk!r}; WordPiece needs one")
    normalizer = Normalizer({"type": "BertNormalizer", "clean_text": True,
                             "handle_chinese_chars": config.get("tokenize_chinese_chars", True),
                             "strip_accents": config.get("strip_accents"), "lowercase": bool(lowercase)})
    specials = [t for t in vocab if t in _KNOWN_SPECIALS]
    added = [AddedToken(t, vocab[t]) for t in specials]
    roles = infer_roles(specials)
    model = WordPieceModel(vocab, unk_token=unk, normalizer=normalizer)
    return {"model": model, "added_tokens": added, "roles": roles}
