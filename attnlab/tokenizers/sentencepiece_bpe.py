"""SentencePiece-style BPE with byte fallback: the ``tokenizer.json`` of Llama 2, Mistral (v0.1)
and TinyLlama, as Hugging Face `tokenizers` runs it.

Text -> spaces become "▁" and one "▁" goes in front (the ``Prepend``/``Replace`` normalizers, or
a ``Metaspace`` pre-tokenizer that prepends to every piece and does not split) -> the whole
piece as characters -> a character missing from the vocabulary becomes its UTF-8 bytes as
``<0x..>`` tokens (byte fallback), or ``unk`` (consecutive ones fused into one with ``fuse_unk``)
-> merges applied lowest rank first -> ids.

    encode("Hi  é") with "é" unknown:  "▁Hi▁▁é" -> [▁Hi, ▁▁, <0xC3>, <0xA9>]

Decoding reverses it: "▁" -> " ", runs of ``<0x..>`` tokens are joined and read as UTF-8 (each
byte of an invalid run is U+FFFD), and the one leading space is removed.

Kudo and Richardson 2018, "SentencePiece"; the merges are Sennrich et al. 2016's.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from attnlab.tokenizers.base import TokenModel
from attnlab.tokenizers.bpe import merge_ids

SPACE = "\u2581"  # ▁
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")

#: the blocks of a legacy Llama 2 tokenizer.json around its model, as Hugging Face writes them
LEGACY_NORMALIZER = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE},
                                                         {"type": "Replace", "pattern": {"String": " "},
                                                          "content": SPACE}]}
DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


class SentencePieceBPEModel(TokenModel):
    """BPE over characters, with "▁" for spaces and byte fallback (module docstring).

    Args:
        vocab: token -> id (holds ``<0x00>`` .. ``<0xFF>`` for byte fallback).
        merges: pairs in rank order; ``a + b`` of each must be in ``vocab``.
        unk_token: stands for a character that cannot be spelled; None drops it.
        byte_fallback: spell a missing character by its UTF-8 bytes (when all are in vocab).
        fuse_unk: consecutive unknown characters become one ``unk``.
        blocks: the normalizer / pre_tokenizer / decoder blocks it was read with, written back as they were.

    Raises:
        ValueError: a merge whose parts or result are not in ``vocab``; unk_token not in vocab.
    """

    kind: ClassVar[str] = "sentencepiece_bpe"

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], *, unk_token: str | None = "<unk>",
                 byte_fallback: bool = True, fuse_unk: bool = True, blocks: dict[str, Any] | None = None) -> None:
        self.vocab = dict(vocab)
        self.merges = [tuple(pair) for pair in merges]
        for rank, (first, second) in enumerate(self.merges):
            for part in (first, second, first + second):
                if part not in self.vocab:
                    raise ValueError(f"merges: merge #{rank} {first!r} + {second!r} needs {part!r}, "
                                     "which is not in vocab")
        self.unk_token, self.byte_fallback, self.fuse_unk = unk_token, byte_fallback, fuse_unk
        self._check_unk()
        self.blocks = dict(blocks or {"normalizer": LEGACY_NORMALIZER, "pre_tokenizer": None, "decoder": DECODER})
        self._width = max(self.vocab.values(), default=-1) + 1
        self._table = {self.vocab[a] * self._width + self.vocab[b]: (rank, self.vocab[a + b])
                       for rank, (a, b) in enumerate(self.merges)}
        self._bytes = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]

    def encode_text(self, text: str) -> list[int]:
        if not text:
            return []
        text = text.replace(" ", SPACE)
        if self.blocks.get("pre_tokenizer") is None or not text.startswith(SPACE):  # Metaspace: not twice
            text = SPACE + text
        unk = self.vocab.get(self.unk_token) if self.unk_token is not None else None
        symbols: list[int] = []
        last_unk = False
        for char in text:
            got = self.vocab.get(char)
            if got is None and self.byte_fallback:
                spelled = [self._bytes[b] for b in char.encode("utf-8", errors="surrogatepass")]
                if None not in spelled:
                    symbols.extend(spelled)
                    last_unk = False
                    continue
            if got is None:
                if unk is not None and not (self.fuse_unk and last_unk):
                    symbols.append(unk)
                last_unk = True
                continue
            symbols.append(got)
            last_unk = False
        return merge_ids(symbols, self._table, self._width)

    def decode_tokens(self, tokens: list[str]) -> str:
        parts: list[str] = []
        pending = bytearray()
        count = 0
        for token in tokens:
            match = _BYTE_TOKEN.fullmatch(token)
            if match:
                pending.append(int(match.group(1), 16))
                count += 1
                continue
            if count:
                parts.append(_utf8(pending, count))
                pending, count = bytearray(), 0
            parts.append(token.replace(SPACE, " "))
        if count:
            parts.append(_utf8(pending, count))
        text = "".join(parts)
        return text[1:] if text.startswith(" ") else text

    def to_hf(self) -> dict[str, Any]:
        """The ``model`` block of tokenizer.json."""
        return {"type": "BPE", "dropout": None, "unk_token": self.unk_token, "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": self.fuse_unk, "byte_fallback": self.byte_fallback,
                "ignore_merges": False, "vocab": self.vocab, "merges": [list(m) for m in self.merges]}


def _utf8(data: bytearray, count: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * count


def from_hf_blocks(spec: dict[str, Any], normalizer: Any, pre: Any, decoder: Any) -> SentencePieceBPEModel:
    """The model of a tokenizer.json whose BPE has ``byte_fallback`` or "▁" blocks, if its blocks are the ones
    this model computes (the legacy Prepend + Replace normalizer, or Metaspace with
    prepend_scheme ``always`` and no split; the decoder above).

    Raises:
        ValueError: another block, naming it.
    """
    metaspace = (isinstance(pre, dict) and pre.get("type") == "Metaspace" and pre.get("replacement", SPACE) == SPACE
                 and pre.get("prepend_scheme", "always") == "always" and not pre.get("split", True) and not normalizer)
    if not (normalizer == LEGACY_NORMALIZER and not pre) and not metaspace:
        raise ValueError("normalizer/pre_tokenizer: a SentencePiece-style BPE (byte_fallback, '▁' for spaces) is "
                         "read with the Prepend('▁') + "
                         "Replace(' ', '▁') normalizer and no pre-tokenizer, or Metaspace(prepend_scheme='always', "
                         f"split=false); got normalizer {normalizer!r}, pre_tokenizer {pre!r}")
    if decoder != DECODER:
        raise ValueError(f"decoder: a SentencePiece-style BPE is read with {DECODER!r}; got {decoder!r}")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "ignore_merges"):
        if spec.get(key):
            raise ValueError(f"model: BPE option {key}={spec[key]!r} is not supported in a SentencePiece-style BPE")
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in spec.get("merges", [])]
    return SentencePieceBPEModel(spec["vocab"], merges, unk_token=spec.get("unk_token"),
                                 byte_fallback=bool(spec.get("byte_fallback")), fuse_unk=bool(spec.get("fuse_unk")),
                                 blocks={"normalizer": normalizer, "pre_tokenizer": pre, "decoder": decoder})
