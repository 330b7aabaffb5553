"""Reading the vocabulary files people already have.

Formats (besides Hugging Face's ``tokenizer.json``, see ``hf_json.py``):

- GPT-2's original release: ``encoder.json`` (token → id) and ``vocab.bpe`` (merges, one
  ``"a b"`` per line after a ``#version`` line);
- the same as saved by Hugging Face's slow tokenizers: ``vocab.json`` and ``merges.txt``;
- BERT's ``vocab.txt``: one token per line, the line number is the id; a
  ``tokenizer_config.json`` beside it may say ``do_lower_case`` / ``strip_accents``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.io.files import read_json

#: Files ``Tokenizer.load`` recognises in a folder, in the order it looks for them.
FOLDER_LAYOUTS = (
    ("tokenizer.json",),
    ("vocab.json", "merges.txt"),
    ("encoder.json", "vocab.bpe"),
    ("vocab.txt",),
)


def find_layout(folder: Path) -> tuple[str, ...]:
    """The first layout of :data:`FOLDER_LAYOUTS` whose files are all in ``folder``.

    Raises:
        ValueError: if there is none (the message lists what was expected).
    """
    for layout in FOLDER_LAYOUTS:
        if all((folder / name).is_file() for name in layout):
            return layout
    expected = "; ".join(" + ".join(layout) for layout in FOLDER_LAYOUTS)
    raise ValueError(f"path: no tokenizer files in folder {str(folder)!r}; expected one of: {expected}")


def read_merges(path: Path) -> list[tuple[str, str]]:
    """Read ``merges.txt`` / ``vocab.bpe``: ``"a b"`` lines, skipping ``#version`` and blanks."""
    merges = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line or (number == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"path: {str(path)!r} line {number}: expected two tokens 'a b', got {line!r}")
            merges.append((parts[0], parts[1]))
    return merges


def read_bpe_folder(folder: Path, layout: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges from ``vocab.json``+``merges.txt`` or ``encoder.json``+``vocab.bpe``."""
    vocab = read_json(folder / layout[0])
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ValueError(f"path: {str(folder / layout[0])!r} must map tokens to integer ids")
    return vocab, read_merges(folder / layout[1])


def read_vocab_txt(path: Path) -> dict[str, int]:
    """BERT's ``vocab.txt``: the token on line ``i`` (from 0) has id ``i``.

    Trailing whitespace is trimmed, as Hugging Face does; a token repeated on a later line
    takes that line's id.
    """
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            vocab[line.rstrip()] = index
    if not vocab:
        raise ValueError(f"path: {str(path)!r} is empty; a vocab.txt lists one token per line")
    return vocab


def read_bert_config(folder: Path) -> dict[str, Any]:
    """``do_lower_case``/``strip_accents``/``tokenize_chinese_chars`` from a
    ``tokenizer_config.json`` beside ``vocab.txt``, when there is one."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    config = read_json(path)
    keys = ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "unk_token")
    return {k: config[k] for k in keys if isinstance(config, dict) and k in config}


def guess_lowercase(vocab: dict[str, int]) -> bool:
    """An uncased vocabulary has no upper-case letters outside bracketed specials like ``[CLS]``."""
    for token in vocab:
        if token.startswith("[") and token.endswith("]"):
            continue
        if token.lower() != token:  # "A" would change; "ℝ" is upper-case but has no lower case
            return False
    return True
