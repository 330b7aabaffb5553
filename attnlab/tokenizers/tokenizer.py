"""``Tokenizer``: one front for byte-level BPE, WordPiece, character and word tokenizers.

Encoding a text:

    text ──► split out added/special tokens (never split) ──► model.encode_text(each piece)
         ──► ids  (with ``add_special_tokens=True``, wrapped by the template: [CLS] ... [SEP])

Model inputs for a batch (``tokenizer(texts, pairs, ...)``): encode, truncate to
``max_length``, apply the template, pad, and return ``input_ids``, ``attention_mask`` and
``token_type_ids`` as lists (or tensors with ``return_tensors="pt"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.io.files import atomic_write_json
from attnlab.tokenizers import inputs
from attnlab.tokenizers.base import TokenModel
from attnlab.tokenizers.bytelevel import GPT2_PATTERN
from attnlab.tokenizers.corpus import TextsOrFiles
from attnlab.tokenizers.hf_json import from_hf, to_hf
from attnlab.tokenizers.loading import load_parts
from attnlab.tokenizers.special import AddedToken, SpecialSplitter, check_roles, infer_roles, sentinel_index
from attnlab.tokenizers.template import Template
from attnlab.tokenizers.training import DEFAULT_SPECIAL_TOKENS, train_tokenizer, warn_if_short


class Tokenizer:
    """A tokenizer: a model (BPE, WordPiece, characters or words), special tokens and a template.

    Build one with :meth:`train` or :meth:`load`; the constructor is for assembling parts.

    Args:
        model: a :class:`~attnlab.tokenizers.base.TokenModel`.
        added_tokens: tokens matched in raw text and never split (special tokens); a string
            takes its id from the model's vocabulary, or the next free id.
        roles: ``{role: token}`` (roles: pad, unk, bos, eos, cls, sep, mask, start, delim,
            extract); inferred from spelling when ``None``.
        template: ``"none"``, ``"bert"``, ``"gpt"``, ``"bos_eos"`` or a ``Template``; by default
            ``"bert"`` when ``cls`` and ``sep`` are set, else ``"none"``.

    Raises:
        ValueError: an added token whose id clashes with the vocabulary; a role whose token is
            not in the vocabulary; a template needing roles that are not set.
    """

    def __init__(
        self,
        model: TokenModel,
        *,
        added_tokens: Iterable[AddedToken | str] = (),
        roles: Mapping[str, str] | None = None,
        template: str | Template | None = None,
    ) -> None:
        if not isinstance(model, TokenModel):
            raise TypeError("model must be a TokenModel (BPEModel, WordPieceModel, CharModel, WordModel), got "
                            f"{type(model).__name__}")
        self.model = model
        self._added: dict[str, AddedToken] = {}
        self._token_to_id: dict[str, int] = dict(model.vocab)
        self._id_to_token: dict[int, str] = {i: t for t, i in model.vocab.items()}
        self._size = max(self._id_to_token, default=-1) + 1
        for token in added_tokens:
            self._add(token)
        self._splitter = SpecialSplitter(self._added.values())
        if roles is None:
            roles = infer_roles(t.content for t in self._added.values() if t.special)
            if model.unk_token is not None:
                roles["unk"] = model.unk_token
        self.roles: dict[str, str] = {}
        self.set_roles(roles)
        if template is None:
            template = "bert" if "cls" in self.roles and "sep" in self.roles else "none"
        self.set_template(template)

    # ------------------------------------------------------------------ building

    @classmethod
    def train(
        cls,
        texts_or_files: TextsOrFiles,
        kind: str = "bpe",
        vocab_size: int | None = None,
        special_tokens: Sequence[str] | Mapping[str, str] | None = None,
        min_frequency: int | None = None,
        show_progress: bool = False,
        *,
        lowercase: bool = True,
        pattern: str | None = GPT2_PATTERN,
        add_prefix_space: bool = False,
        criterion: str = "frequency",
        template: str | Template | None = None,
    ) -> "Tokenizer":
        """Learn a tokenizer from a corpus.

        Args:
            texts_or_files: a path to a text file; an iterable of texts; or an iterable of
                ``pathlib.Path`` files (read line by line). Strings in a list are text.
            kind: ``"bpe"`` (byte-level), ``"wordpiece"``, ``"char"`` or ``"word"`` (whitespace and
                punctuation words, see ``word.py``).
            vocab_size: target size, specials included (bpe/wordpiece: 8000 by default; char,
                word: every character or word seen by default).
            special_tokens: a list (roles inferred from spelling) or ``{role: token}``; by
                default ``<|endoftext|>`` (bpe), ``[PAD] [UNK] [CLS] [SEP] [MASK]``
                (wordpiece), ``<pad> <unk>`` (char, word). Special tokens in the corpus are skipped.
            min_frequency: least count of a pair to merge (2 by default) or of a character or
                word to keep (char, word: 1 by default).
            show_progress: a progress line on stderr.
            lowercase: wordpiece only: uncased (lower-case and strip accents) or cased.
            pattern: bpe only: the split regex (GPT-2's by default; ``None``: no split).
            add_prefix_space: bpe only: treat the text as if it started with a space.
            criterion: wordpiece only: ``"frequency"`` (as Hugging Face) or ``"likelihood"``
                (WordPiece's score); see ``wordpiece_trainer.py``.
            template: see the class docstring.

        Returns:
            the trained tokenizer.

        Raises:
            ValueError: unknown ``kind``; ``vocab_size`` too small (bpe needs 256 + specials);
                bad ``special_tokens``/``min_frequency``; a path that is not a file.

        Warns:
            UserWarning: a ``vocab_size`` given and not reached (the corpus ran out of merges),
                naming both sizes.

        Example:
            >>> tok = Tokenizer.train(["low lower lowest"] * 10, kind="bpe", vocab_size=270)
            >>> tok.decode(tok.encode("lowest low"))
            'lowest low'
        """
        if isinstance(template, str) and kind in DEFAULT_SPECIAL_TOKENS:  # a template that cannot be built fails now,
            specials = DEFAULT_SPECIAL_TOKENS[kind] if special_tokens is None else special_tokens  # not after training
            Template.preset(template, dict(specials) if isinstance(specials, Mapping) else infer_roles(specials))
        parts = train_tokenizer(texts_or_files, kind, vocab_size, special_tokens, min_frequency, show_progress,
                                lowercase=lowercase, pattern=pattern, add_prefix_space=add_prefix_space,
                                criterion=criterion)
        tokenizer = cls(**parts, template=template)
        warn_if_short(kind, vocab_size, tokenizer.vocab_size, min_frequency)  # points at the caller of train
        return tokenizer

    @classmethod
    def load(cls, path: str | os.PathLike, *, lowercase: bool | None = None) -> "Tokenizer":
        """Read a tokenizer from files people already have.

        Args:
            path: a ``tokenizer.json`` (Hugging Face or attnlab) or a folder holding one; a
                folder with ``vocab.json`` + ``merges.txt`` or GPT-2's ``encoder.json`` +
                ``vocab.bpe``; BERT's ``vocab.txt`` (file or folder).
            lowercase: ``vocab.txt`` only: uncased or not (default: from a
                ``tokenizer_config.json`` beside it, else guessed from the vocabulary).

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ValueError: if nothing recognisable is there, or the content is not supported.
        """
        return cls(**load_parts(path, lowercase=lowercase))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Tokenizer":
        """Build from parsed ``tokenizer.json`` content."""
        return cls(**from_hf(data))

    def to_dict(self) -> dict[str, Any]:
        """The ``tokenizer.json`` content (Hugging Face format)."""
        return to_hf(self.model, self.added_tokens, self.template, self.roles, self.token_to_id)

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` atomically; returns the file written.

        A path ending in ``.json`` is the file itself; any other path is a folder (created if
        needed) that gets a ``tokenizer.json``. Hugging Face's ``tokenizers`` reads the file,
        and ``Tokenizer.load`` gives back a tokenizer that encodes identically.
        """
        path = Path(path)
        target = path if path.suffix == ".json" else path / "tokenizer.json"
        if target.is_dir():
            raise ValueError(f"path: {str(target)!r} is a folder; give a folder or a .json file name")
        atomic_write_json(target, self.to_dict(), indent=2)
        return target

    # ------------------------------------------------------------------ special tokens

    def _add(self, token: AddedToken | str) -> AddedToken:
        if isinstance(token, str):
            if not token:
                raise ValueError("tokens: a special token cannot be empty")
            token_id = self._token_to_id.get(token, self.vocab_size)
            token = AddedToken(token, token_id)
        known = self._token_to_id.get(token.content)
        if known is not None and known != token.id:
            raise ValueError(f"added_tokens: {token.content!r} has id {token.id} but the vocabulary gives it {known}")
        holder = self._id_to_token.get(token.id)
        if holder is not None and holder != token.content:
            raise ValueError(f"added_tokens: id {token.id} of {token.content!r} already belongs to {holder!r}")
        self._added[token.content] = token
        self._token_to_id[token.content] = token.id
        self._id_to_token[token.id] = token.content
        self._size = max(self._size, token.id + 1)
        return token

    def add_special_tokens(self, tokens: Iterable[str] | Mapping[str, str]) -> list[int]:
        """Add special tokens (new ids after the vocabulary; existing tokens keep theirs).

        Args:
            tokens: a list (roles inferred from spelling for roles not yet set) or
                ``{role: token}`` (sets those roles).

        Returns:
            the ids of the tokens, in order.

        The template stays as it is: after adding ``[CLS]``/``[SEP]`` to a tokenizer without
        them, call ``set_template("bert")`` to have ``add_special_tokens=True`` use them.

        Example:
            >>> ids = tok.add_special_tokens([f"<extra_id_{i}>" for i in range(3)])  # doctest: +SKIP
        """
        if isinstance(tokens, str):
            raise TypeError(f"tokens must be a list of strings or a {{role: token}} dict; got the string {tokens!r}")
        roles = dict(tokens) if isinstance(tokens, Mapping) else None
        if roles is not None:
            check_roles(roles)
        contents = list(roles.values()) if roles is not None else list(tokens)
        ids = []
        for content in contents:
            if not isinstance(content, str):
                raise TypeError(f"tokens: special tokens must be strings, got {type(content).__name__}")
            existing = self._added.get(content)
            if existing is not None and existing.special:
                ids.append(existing.id)
            else:  # new, or in the vocabulary but not yet special: (re)register as special
                ids.append(self._add(content).id)
        self._splitter = SpecialSplitter(self._added.values())
        new_roles = roles if roles is not None else {r: t for r, t in infer_roles(contents).items() if r not in self.roles}
        self.set_roles({**self.roles, **new_roles})
        return ids

    def set_roles(self, roles: Mapping[str, str]) -> None:
        """Set which token plays which role (pad, unk, bos, eos, cls, sep, mask, start, ...)."""
        roles = dict(roles)
        check_roles(roles)
        for role, token in roles.items():
            if token not in self._token_to_id:
                raise ValueError(f"roles: the {role} token {token!r} is not in the vocabulary; add it first")
        self.roles = roles

    def set_template(self, template: str | Template) -> None:
        """Choose how ``add_special_tokens=True`` wraps sequences (see ``template.py``)."""
        if isinstance(template, str):
            template = Template.preset(template, self.roles)
        elif not isinstance(template, Template):
            raise TypeError(f"template must be a preset name or a Template, got {type(template).__name__}")
        for token in template.special_tokens:
            if token not in self._token_to_id:
                raise ValueError(f"template: special token {token!r} is not in the vocabulary")
        self.template = template

    @property
    def added_tokens(self) -> list[AddedToken]:
        """Tokens matched before the model runs (special tokens), in id order."""
        return sorted(self._added.values(), key=lambda t: t.id)

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of special tokens (left out by ``decode(..., skip_special_tokens=True)``)."""
        return sorted(t.id for t in self._added.values() if t.special)

    @property
    def sentinel_token_ids(self) -> list[int]:
        """Ids of T5 sentinels ``<extra_id_0>``, ``<extra_id_1>``, ... in sentinel order."""
        found = [(sentinel_index(t.content), t.id) for t in self._added.values()]
        return [i for n, i in sorted((n, i) for n, i in found if n is not None)]

    def _role_id(self, role: str) -> int | None:
        token = self.roles.get(role)
        return None if token is None else self._token_to_id[token]

    pad_token_id = property(lambda self: self._role_id("pad"), doc="Id of the padding token, or None.")
    unk_token_id = property(lambda self: self._role_id("unk"), doc="Id of the unknown token, or None.")
    bos_token_id = property(lambda self: self._role_id("bos"), doc="Id of the beginning-of-sequence token, or None.")
    eos_token_id = property(lambda self: self._role_id("eos"), doc="Id of the end-of-sequence token, or None.")
    cls_token_id = property(lambda self: self._role_id("cls"), doc="Id of [CLS], or None.")
    sep_token_id = property(lambda self: self._role_id("sep"), doc="Id of [SEP], or None.")
    mask_token_id = property(lambda self: self._role_id("mask"), doc="Id of [MASK], or None.")
    start_token_id = property(lambda self: self._role_id("start"), doc="Id of GPT's [START], or None.")
    delim_token_id = property(lambda self: self._role_id("delim"), doc="Id of GPT's [DELIM], or None.")
    extract_token_id = property(lambda self: self._role_id("extract"), doc="Id of GPT's [EXTRACT], or None.")

    # ------------------------------------------------------------------ vocabulary

    @property
    def kind(self) -> str:
        """``"bpe"``, ``"wordpiece"``, ``"char"`` or ``"word"``."""
        return self.model.kind

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (the embedding table's size)."""
        return self._size

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        """Token → id, added tokens included."""
        return dict(self._token_to_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``, or ``None`` if it is not in the vocabulary."""
        return self._token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token with id ``token_id``, or ``None``."""
        return self._id_to_token.get(token_id)

    def __repr__(self) -> str:
        specials = ", ".join(f"{r}={t!r}" for r, t in self.roles.items())
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, template={self.template.name!r}, {specials})"

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str, *, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``.

        Args:
            text: any string; special tokens written in it are kept whole.
            add_special_tokens: wrap with the template (e.g. ``[CLS] ... [SEP]``).
            split_special_tokens: treat special tokens in ``text`` as plain text.

        Raises:
            TypeError: if ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if split_special_tokens:
            ids = self.model.encode_text(text)
        else:
            ids = []
            for segment, is_added in self._splitter.split(text):
                if is_added:
                    ids.append(self._token_to_id[segment])
                else:
                    ids.extend(self.model.encode_text(segment))
        if add_special_tokens:
            ids, _ = self.template.apply(ids, None, self.token_to_id)
        return ids

    def encode_batch(self, texts: Iterable[str], *, add_special_tokens: bool = False,
                     split_special_tokens: bool = False) -> list[list[int]]:
        """:meth:`encode` for each text."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings; for one string use encode()")
        return [self.encode(t, add_special_tokens=add_special_tokens, split_special_tokens=split_special_tokens)
                for t in texts]

    def tokenize(self, text: str, **kwargs: bool) -> list[str]:
        """Token strings of ``text`` (same arguments as :meth:`encode`)."""
        return [self._id_to_token[i] for i in self.encode(text, **kwargs)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (a list, or a 1-D tensor/array).

        Byte-level BPE gives back exactly the text that was encoded; WordPiece gives the
        normalized words joined by spaces (HF's WordPiece decoder).

        Raises:
            ValueError: for an id outside the vocabulary.
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        skip = set(self.all_special_ids) if skip_special_tokens else ()
        tokens = []
        for token_id in ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise TypeError(f"ids must be integers, got {type(token_id).__name__}")
            if token_id in skip:
                continue
            token = self._id_to_token.get(token_id)
            if token is None:
                raise ValueError(f"ids: {token_id} is not in the vocabulary (size {self.vocab_size})")
            tokens.append(token)
        return self.model.decode_tokens(tokens)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        """:meth:`decode` for each row."""
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    # ------------------------------------------------------------------ model inputs (inputs.py)

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        truncation: bool | str = False,
        max_length: int | None = None,
        padding: bool | str = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str = "right",
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """Model inputs: ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids``.

        Args:
            text: one text, or a batch (list) of texts.
            text_pair: second sequences (same shape as ``text``): ``[CLS] a [SEP] b [SEP]``.
            add_special_tokens: apply the template.
            truncation: ``True``/``"longest_first"``, ``"only_first"``, ``"only_second"``;
                needs ``max_length`` (which counts the template's tokens).
            max_length: the length to truncate to, and to pad to with ``padding="max_length"``.
            padding: ``True``/``"longest"`` (the batch's longest row) or ``"max_length"``.
            pad_to_multiple_of: round the padded length up to a multiple of this.
            padding_side: ``"right"`` or ``"left"``.
            return_tensors: ``None`` for lists, ``"pt"`` for ``torch.long`` tensors ``(B, T)``.

        Returns:
            a dict of lists (one row per text; a single text gives flat lists) or tensors.

        Raises:
            ValueError: bad option values; padding without a pad token; truncation without
                ``max_length``; tensors from rows of different lengths without padding.

        Example:
            >>> batch = tok(["a b", "c"], padding=True, pad_to_multiple_of=8)  # doctest: +SKIP
        """
        return inputs.encode_inputs(
            self.encode, self.template, self.token_to_id, self.pad_token_id, text, text_pair, add_special_tokens=add_special_tokens, truncation=truncation,
            max_length=max_length, padding=padding, pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side, return_tensors=return_tensors,
        )

    build_inputs = __call__
