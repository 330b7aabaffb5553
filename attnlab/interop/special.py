"""The special tokens of an exported Hugging Face folder: config.json's `*_token_id` fields and
tokenizer_config.json.

transformers checks every `*_token_id` of a config against its `vocab_size` when it loads one
and warns for an id outside it. A field the export leaves out takes the family's default,
which names a token of that family's own vocabulary (GPT-2's bos = eos = 50256) that an
attnlab vocabulary of 26 characters does not have. So the export writes every field, by one
rule:

    with a tokenizer     the id of the token that plays the field's role there (bos, eos);
                         None when the tokenizer has no such token
    without one          the family's default when it lies inside the vocabulary (a model
                         converted from that family keeps its ids), else None

`pad_token_id` is the model's own (its config's `pad_token_id`), and a decoder start follows
the family (T5, Marian: pad, written by their modules; BART: eos, a field here). A tokenizer
id outside the model's vocabulary is an error: the tokenizer is not this model's.

Without tokenizer_config.json, transformers wraps tokenizer.json in the family's tokenizer
class (GPT-2's adds `<|endoftext|>` when the vocabulary lacks it, one id past the model's), so
the export names the generic class and the tokenizer's own special tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the tokenizer roles transformers knows by name, as tokenizer_config.json spells them
_HF_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def special_token_ids(hf_config: Mapping[str, Any], fields: Mapping[str, tuple[str, int | None]],
                      tokenizer: Any = None) -> dict[str, int | None]:
    """The `*_token_id` fields of an exported config.json, by the rule in the module docstring.

    Args:
        hf_config: the config.json dict (its `vocab_size`, and Marian's `decoder_vocab_size`).
        fields: {field: (tokenizer role, the family's default)}, a family module's `SPECIAL_TOKENS`.
        tokenizer: the tokenizer exported beside the weights, or None.

    Returns:
        {field: id or None} for every field of `fields`.

    Raises:
        ValueError: a tokenizer id outside the vocabulary (the field, token and sizes named).

    Example:
        >>> special_token_ids({"vocab_size": 26}, {"eos_token_id": ("eos", 50256)})
        {'eos_token_id': None}
    """
    vocab = min(v for k, v in hf_config.items() if k in ("vocab_size", "decoder_vocab_size") and v is not None)
    ids: dict[str, int | None] = {}
    for field, (role, default) in fields.items():
        if tokenizer is None:
            ids[field] = default if default is not None and 0 <= default < vocab else None
            continue
        token_id = getattr(tokenizer, f"{role}_token_id", None)  # attnlab's Tokenizer.bos_token_id, ...
        if token_id is not None and not 0 <= token_id < vocab:
            token = (getattr(tokenizer, "roles", None) or {}).get(role)
            raise ValueError(f"{field}: the tokenizer's {role} token {token!r} has id {token_id}, "
                             f"outside the model's vocabulary of {vocab}; the tokenizer does not belong to this model")
        ids[field] = token_id
    return ids


def tokenizer_config(tokenizer: Any, max_length: int | None) -> dict[str, Any]:
    """tokenizer_config.json for tokenizer.json: the generic fast class (encodes exactly as
    tokenizer.json says), the tokenizer's special tokens by role, and the longest input."""
    roles = getattr(tokenizer, "roles", None) or {}
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "clean_up_tokenization_spaces": False}  # decode as attnlab does
    config.update({f"{role}_token": roles[role] for role in _HF_ROLES if role in roles})
    if max_length is not None:
        config["model_max_length"] = max_length
    return config
