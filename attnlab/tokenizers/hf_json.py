"""Hugging Face ``tokenizer.json``: reading it into attnlab's parts and writing them back.

What attnlab reads and writes (model; pre-tokenizer; decoder; normalizer):

- bpe: ``BPE``; ``ByteLevel`` with GPT-2's split, or a ``Sequence`` of a regex ``Split`` and
  ``ByteLevel(use_regex=false)``; ``ByteLevel``; any normalizer of ``normalizers.py`` (GPT-2:
  none);
- wordpiece: ``WordPiece``; ``BertPreTokenizer``; ``WordPiece``; ``BertNormalizer``;
- SentencePiece-style bpe (Llama 2, Mistral): ``BPE`` with ``byte_fallback``; none, or
  ``Metaspace`` (prepend always, no split); Replace + ByteFallback + Fuse + Strip; Prepend("▁") +
  Replace(" ", "▁") (see ``sentencepiece_bpe.py``);
- char: ``WordLevel``; ``Split`` on every character; ``Fuse``; none.
- word: ``WordLevel``; ``BertPreTokenizer``; ``WordPiece`` (joins with spaces, cleans up); any
  normalizer of ``normalizers.py`` (attnlab's: none).

Post-processors: ``TemplateProcessing``, ``BertProcessing``, ``RobertaProcessing``,
``ByteLevel`` (offsets only: nothing to do) and a ``Sequence`` of them. Added tokens keep all
their flags. Roles of special tokens are inferred from their spelling when loading; a role
that cannot be inferred is written as ``"attnlab_roles"`` inside the ``model`` block (Hugging
Face ignores unknown keys there), so saving stays lossless.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnlab.tokenizers.base import TokenModel
from attnlab.tokenizers.bpe import BPEModel
from attnlab.tokenizers.bytelevel import GPT2_PATTERN
from attnlab.tokenizers.char import CharModel
from attnlab.tokenizers.normalizers import Normalizer
from attnlab.tokenizers.sentencepiece_bpe import LEGACY_NORMALIZER, SentencePieceBPEModel, from_hf_blocks
from attnlab.tokenizers.special import AddedToken, infer_roles
from attnlab.tokenizers.template import Template
from attnlab.tokenizers.word import WordModel
from attnlab.tokenizers.wordpiece import WordPieceModel

#: The pre-tokenizer regex of attnlab's character tokenizer: every code point on its own.
CHAR_PATTERN = r"[\s\S]"
_BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def default_roles(model: TokenModel, added: list[AddedToken], template: Template | None) -> dict[str, str]:
    """The roles a reader can infer: from special tokens' spelling, ``unk_token`` and the template."""
    roles = infer_roles(t.content for t in added if t.special)
    if model.unk_token is not None:
        roles["unk"] = model.unk_token
    names = [t for t, _ in template.single] if template is not None else []
    if template is not None and template.name == "custom" and len(names) == 3 and names[1] == "$A":
        roles.setdefault("cls", names[0])  # a [CLS] $A [SEP]-shaped template
        roles.setdefault("sep", names[2])
    return roles


# ----------------------------------------------------------------------------- writing


def to_hf(model: TokenModel, added: list[AddedToken], template: Template, roles: Mapping[str, str],
          token_to_id: Mapping[str, int]) -> dict[str, Any]:
    """The ``tokenizer.json`` content for a tokenizer's parts (``Tokenizer.to_dict`` passes its own).

    Raises:
        ValueError: for a BPE model with a custom pattern and ``add_prefix_space`` (Hugging
            Face would add the space to every piece, not once per text).
    """
    post = None if template.name == "none" else template.to_hf(token_to_id)
    if isinstance(model, BPEModel):
        body, pre, decoder = _bpe_to_hf(model), _bytelevel_pre(model), dict(_BYTELEVEL)
        normalizer = model.normalizer.spec if model.normalizer else None
        if post is None:
            post = {**_BYTELEVEL, "trim_offsets": False}
    elif isinstance(model, SentencePieceBPEModel):
        body, pre, decoder = model.to_hf(), model.blocks.get("pre_tokenizer"), model.blocks.get("decoder")
        normalizer = model.blocks.get("normalizer")
    elif isinstance(model, WordPieceModel):
        body = {"type": "WordPiece", "unk_token": model.unk_token, "continuing_subword_prefix": model.prefix,
                "max_input_chars_per_word": model.max_input_chars_per_word, "vocab": model.vocab}
        pre = {"type": "BertPreTokenizer"}
        decoder = {"type": "WordPiece", "prefix": model.prefix, "cleanup": model.cleanup}
        normalizer = model.normalizer.spec if model.normalizer else None
    elif isinstance(model, CharModel):
        body = {"type": "WordLevel", "vocab": model.vocab, "unk_token": model.unk_token}
        pre = {"type": "Split", "pattern": {"Regex": CHAR_PATTERN}, "behavior": "Isolated", "invert": False}
        decoder, normalizer = {"type": "Fuse"}, None
    elif isinstance(model, WordModel):
        body = {"type": "WordLevel", "vocab": model.vocab, "unk_token": model.unk_token}
        pre = {"type": "BertPreTokenizer"}
        decoder = {"type": "WordPiece", "prefix": "##", "cleanup": True}  # join_pieces: spaces, then clean-up
        normalizer = model.normalizer.spec if model.normalizer else None
    else:
        raise TypeError(f"tokenizer.model: cannot write {type(model).__name__} as tokenizer.json")
    if roles != default_roles(model, added, template):
        body = {**body, "attnlab_roles": dict(roles)}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": t.id, "content": t.content, "single_word": t.single_word, "lstrip": t.lstrip,
             "rstrip": t.rstrip, "normalized": t.normalized, "special": t.special}
            for t in sorted(added, key=lambda t: t.id)
        ],
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": post,
        "decoder": decoder,
        "model": body,
    }


def _bpe_to_hf(model: BPEModel) -> dict[str, Any]:
    return {"type": "BPE", "dropout": None, "unk_token": model.unk_token, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": model.ignore_merges, "vocab": model.vocab,
            "merges": [[a, b] for a, b in model.merges]}


def _bytelevel_pre(model: BPEModel) -> dict[str, Any]:
    if model.pattern == GPT2_PATTERN or model.pattern is None:
        return {"type": "ByteLevel", "add_prefix_space": model.add_prefix_space, "trim_offsets": True,
                "use_regex": model.pattern is not None}
    if model.add_prefix_space:
        raise ValueError(
            "add_prefix_space with a custom pattern cannot be written as tokenizer.json "
            "(Hugging Face would prefix every piece); use add_prefix_space=False or GPT-2's pattern"
        )
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": model.pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]}


# ----------------------------------------------------------------------------- reading


def from_hf(data: dict[str, Any]) -> dict[str, Any]:
    """Parse ``tokenizer.json`` content into ``Tokenizer(...)`` keyword arguments.

    Returns:
        ``{"model": ..., "added_tokens": [...], "roles": {...}, "template": Template}``.

    Raises:
        ValueError: for a model, pre-tokenizer, normalizer or post-processor attnlab does not
            implement (the message names the block and the type).
    """
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ValueError("path: not a tokenizer.json (no 'model' block)")
    spec = data["model"]
    kind = spec.get("type") or _guess_model_type(spec)
    pre = data.get("pre_tokenizer")
    if kind == "BPE" and _sentencepiece_style(spec, data.get("normalizer"), pre):  # Llama 2, Mistral: own blocks
        model: TokenModel = from_hf_blocks(spec, data.get("normalizer"), pre, data.get("decoder"))
        kind = "SentencePieceBPE"
    normalizer = Normalizer(data["normalizer"]) if data.get("normalizer") and kind != "SentencePieceBPE" else None
    if kind == "SentencePieceBPE":
        pass
    elif kind == "BPE":
        model = _bpe_from_hf(spec, pre, normalizer)
    elif kind == "WordPiece":
        if not pre or pre.get("type") != "BertPreTokenizer":
            raise ValueError(f"pre_tokenizer: WordPiece is read with BertPreTokenizer only, got {pre!r}")
        decoder = data.get("decoder") or {}
        model = WordPieceModel(spec["vocab"], unk_token=spec.get("unk_token", "[UNK]"),
                               prefix=spec.get("continuing_subword_prefix", "##"),
                               max_input_chars_per_word=spec.get("max_input_chars_per_word", 100),
                               normalizer=normalizer, cleanup=decoder.get("cleanup", True))
    elif kind == "WordLevel":
        model = _wordlevel_from_hf(spec, pre, normalizer)
    else:
        raise ValueError(f"model: unsupported type {kind!r}; attnlab reads BPE, WordPiece and WordLevel (char, word)")

    added = [
        AddedToken(t["content"], int(t["id"]), special=bool(t.get("special", True)), lstrip=bool(t.get("lstrip")),
                   rstrip=bool(t.get("rstrip")), single_word=bool(t.get("single_word")),
                   normalized=bool(t.get("normalized")))
        for t in data.get("added_tokens") or []
    ]
    roles = infer_roles(t.content for t in added if t.special)
    if model.unk_token is not None:
        roles["unk"] = model.unk_token
    template = _template_from_hf(data.get("post_processor"), roles)
    roles = spec.get("attnlab_roles") or default_roles(model, added, template)
    return {"model": model, "added_tokens": added, "roles": roles, "template": template}


def _sentencepiece_style(spec: dict[str, Any], normalizer: Any, pre: Any) -> bool:
    """A BPE over characters with "▁" for spaces, or with byte fallback (sentencepiece_bpe.py)."""
    metaspace = isinstance(pre, dict) and pre.get("type") == "Metaspace"
    return bool(spec.get("byte_fallback")) or normalizer == LEGACY_NORMALIZER or metaspace


def _wordlevel_from_hf(spec: dict[str, Any], pre: dict[str, Any] | None, normalizer: Normalizer | None) -> TokenModel:
    """A WordLevel model: attnlab's word tokenizer (BertPreTokenizer) or its character tokenizer
    (Split on every character, no normalizer)."""
    kind = pre.get("type") if pre else None
    if kind == "BertPreTokenizer":
        return WordModel(spec["vocab"], unk_token=spec.get("unk_token"), normalizer=normalizer)
    if kind == "Split" and pre.get("pattern") == {"Regex": CHAR_PATTERN} and not normalizer:
        return CharModel(spec["vocab"], unk_token=spec.get("unk_token"))
    raise ValueError("model: WordLevel is read as attnlab's word tokenizer (pre_tokenizer BertPreTokenizer) or its "
                     f"character tokenizer (Split on {CHAR_PATTERN!r}, no normalizer); got pre_tokenizer {pre!r}")


def _guess_model_type(spec: dict[str, Any]) -> str | None:
    if "merges" in spec:
        return "BPE"
    if "continuing_subword_prefix" in spec:
        return "WordPiece"
    return "WordLevel" if "vocab" in spec else None


def _bpe_from_hf(spec: dict[str, Any], pre: dict[str, Any] | None, normalizer: Normalizer | None) -> BPEModel:
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"):
        if spec.get(key):
            raise ValueError(f"model: BPE option {key}={spec[key]!r} is not supported (attnlab's BPE is byte-level)")
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in spec.get("merges", [])]
    pattern, add_prefix_space = _pattern_from_hf(pre)
    return BPEModel(spec["vocab"], merges, pattern=pattern, add_prefix_space=add_prefix_space,
                    normalizer=normalizer, ignore_merges=bool(spec.get("ignore_merges")),
                    unk_token=spec.get("unk_token"))


def _pattern_from_hf(pre: dict[str, Any] | None) -> tuple[str | None, bool]:
    """``(pattern, add_prefix_space)`` of a byte-level pre-tokenizer block."""
    kind = pre.get("type") if pre else None
    if kind == "ByteLevel":
        return (GPT2_PATTERN if pre.get("use_regex", True) else None), bool(pre.get("add_prefix_space"))
    if kind == "Sequence":
        parts = pre.get("pretokenizers", [])
        if len(parts) == 2 and parts[0].get("type") == "Split" and parts[1].get("type") == "ByteLevel":
            split, byte_level = parts
            pattern = split.get("pattern", {})
            ok = (split.get("behavior") == "Isolated" and not split.get("invert")
                  and not byte_level.get("use_regex", True) and not byte_level.get("add_prefix_space"))
            if ok and "Regex" in pattern:
                return pattern["Regex"], False
    raise ValueError(
        "pre_tokenizer: BPE is read with ByteLevel, or Sequence[Split(regex, isolated), "
        f"ByteLevel(use_regex=false, add_prefix_space=false)]; got {pre!r}"
    )


def _template_from_hf(post: dict[str, Any] | None, roles: dict[str, str]) -> Template:
    if not post or post.get("type") == "ByteLevel":
        return Template.preset("none", roles)
    if post.get("type") == "Sequence":
        found = [p for p in post.get("processors", []) if p.get("type") != "ByteLevel"]
        if len(found) > 1:
            raise ValueError(f"post_processor: a Sequence with more than one template is not supported: {post!r}")
        return _template_from_hf(found[0] if found else None, roles)
    return Template.from_hf(post, roles)
