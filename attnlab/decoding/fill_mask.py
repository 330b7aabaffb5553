"""Fill in the blanks: what a masked-LM encoder (BERT) predicts at each [MASK] of a text.

    attnlab.fill_mask("runs/bert-mlm", "The [MASK] statement is used to import a module.")
    # [[{"token": "import", "id": 734, "probability": 0.41}, {"token": "from", ...}, ...]]

One forward pass of the whole text (wrapped in the tokenizer's template, [CLS] ... [SEP], by
default); each mask position's hidden state goes through the MLM head, and a softmax over the
vocabulary gives P(token | the rest of the text) there. With several masks in one text each is
predicted on its own, the others staying masked (BERT's pretraining task), not jointly.

The model is an attnlab encoder with an MLM head (`arch='encoder'`, `head='mlm'`): an `attnlab
train` run with `data.objective: masked_lm` (examples/bert_mlm.yaml), a folder `attnlab.save`
wrote, or a Hugging Face BertForMaskedLM folder (converted on load, `attnlab.from_hf`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.models.families import FAMILIES
from attnlab.models.heads import MLMHead
from attnlab.models.transformer import Encoder

_FIXED_TABLES = ("learned", "binary")  # position schemes with one vector per position up to max_len, no further


def fill_mask(model_or_path: nn.Module | str | os.PathLike, text: str, top_k: int = 5, tokenizer: Any = None, *,
              add_special_tokens: bool = True) -> list[list[dict[str, Any]]]:
    """The `top_k` most likely tokens at each mask token of `text`, most likely first.

    Args:
        model_or_path: an attnlab encoder with an MLM head, or a folder holding one (`attnlab.save`,
            an `attnlab train` run, a Hugging Face BERT folder with its vocab.txt or tokenizer.json).
        text: the text, with the tokenizer's mask token (BERT's `[MASK]`) where a token is missing.
        top_k: tokens to return per mask (at most the vocabulary: a larger value returns it all).
        tokenizer: the model's tokenizer (an attnlab Tokenizer, or a file or folder
            `Tokenizer.load` reads); needed with a model object, else the folder's by default.
        add_special_tokens: wrap the text in the tokenizer's template ([CLS] ... [SEP]) as BERT
            was trained; False for a model trained on bare windows (an attnlab masked_lm run
            without data.nsp reads windows cut anywhere in the text, with no [CLS] or [SEP]).

    Returns:
        one list per mask, in text order, of `top_k` dicts {"token": vocabulary entry, "id": int,
        "probability": float}, sorted by probability, highest first.

    Raises:
        TypeError: a model that is not attnlab's, or a model object without a tokenizer.
        ValueError: a model without an MLM head (a decoder, an encoder-decoder, an encoder
            with another head), `top_k` < 1, or a text without the tokenizer's mask token
            (the message names the token the tokenizer uses).
        FileNotFoundError: no such folder, or no tokenizer in it.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    model, tokenizer = _model_and_tokenizer(model_or_path, tokenizer)
    mask_id = _mask_id(tokenizer, model)
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    positions = [i for i, token in enumerate(ids) if token == mask_id]
    if not positions:
        raise ValueError(f"the text has no mask token: write {tokenizer.roles['mask']!r} (the mask token of this "
                         f"tokenizer) where a token is missing, e.g. 'The {tokenizer.roles['mask']} sat on the mat.'")
    position = model.config.position
    if position.scheme in _FIXED_TABLES and len(ids) > position.max_len:
        counted = " (special tokens included)" if add_special_tokens else ""
        raise ValueError(f"the text is {len(ids)} tokens long{counted}, more than the {position.max_len} the model "
                         f"reads ({position.scheme} positions, position.max_len): shorten it around the mask")
    probs = mask_probabilities(model, torch.tensor([ids]), torch.tensor(positions))  # (M, V)
    values, indices = probs.topk(min(top_k, probs.shape[-1]), dim=-1)  # (M, k)
    return [[{"token": _token(tokenizer, i), "id": i, "probability": p}
             for i, p in zip(row_ids.tolist(), row_probs.tolist())] for row_ids, row_probs in zip(indices, values)]


@torch.no_grad()
def mask_probabilities(model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """P(token) over the vocabulary at `positions` of one row: (1, T) ids, (M,) positions -> (M, V),
    float32. Only the mask positions go through the MLM head (the other T - M rows of (T, V)
    logits are never needed). Runs in eval mode (no dropout); the model's mode is restored."""
    check_mlm(model)
    was_training = model.training
    model.eval()
    try:
        hidden = model.features(input_ids)  # (1, T, D)
        logits = model.head(hidden[0, positions])  # (M, V)
    finally:
        model.train(was_training)
    return logits.float().softmax(-1)


def check_mlm(model: nn.Module) -> None:
    """Raise unless `model` is an attnlab encoder with an MLM head, saying what it is instead."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "arch"):
        raise TypeError(f"fill-mask needs an attnlab model (attnlab.load, attnlab.from_hf for a transformers "
                        f"model), got {type(model).__name__}")
    own = FAMILIES.get(config.arch) if isinstance(config.arch, str) else None
    if own is None or "mlm" not in own.traits.heads:
        kind = own.description if own is not None else f"arch={config.arch!r}"
        raise ValueError(f"fill-mask needs a masked-LM encoder (arch='encoder', head='mlm'), got {kind} "
                         f"(arch={config.arch!r}, head={config.head!r}): it predicts the next token, not a masked one "
                         "(see attnlab generate and attnlab score)")
    if not isinstance(model, Encoder) or not isinstance(model.head, MLMHead):
        raise ValueError(f"fill-mask needs a masked-LM encoder (arch='encoder', head='mlm'); this encoder has "
                         f"head={config.head!r}, no MLM head (train one with data.objective masked_lm, or convert "
                         "a Hugging Face BertForMaskedLM)")


def load_masked_lm(path: str | os.PathLike, tokenizer: Any = None) -> tuple[nn.Module, Any]:
    """(model, tokenizer) of a masked-LM folder: an `attnlab train` run, an `attnlab.save`
    folder, or a Hugging Face BERT folder (its tokenizer.json, else its vocab.txt).

    Args:
        path: the folder, or a Hugging Face Hub model `hf:NAME[@REVISION]`.
        tokenizer: a Tokenizer, or a file or folder `Tokenizer.load` reads, used instead of the
            folder's.

    Raises:
        FileNotFoundError: no such folder, or no tokenizer in it (and none given).
        TypeError, ValueError: as `check_mlm` for a model without an MLM head; as `attnlab.load`.
    """
    from attnlab.interop.hub import resolve_model_path
    from attnlab.interop.serialization import load
    from attnlab.tokenizers import Tokenizer

    model, found = load(path, with_tokenizer=True)
    check_mlm(model)  # before looking for a tokenizer: the model's kind is the first thing to hear about
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = Tokenizer.load(tokenizer)
    if tokenizer is None:
        tokenizer = found if found is not None else _vocab_txt(resolve_model_path(path))
    return model, tokenizer


def _model_and_tokenizer(model_or_path: Any, tokenizer: Any) -> tuple[nn.Module, Any]:
    """The model (loaded when a path) and its tokenizer (given, loaded from a path, or the folder's)."""
    if isinstance(model_or_path, (str, os.PathLike)):
        return load_masked_lm(model_or_path, tokenizer)
    if not isinstance(model_or_path, nn.Module):
        raise TypeError(f"model_or_path must be a model or a folder, got {type(model_or_path).__name__}")
    check_mlm(model_or_path)
    if tokenizer is None:
        raise TypeError("fill_mask(model, ...) needs the model's tokenizer: pass tokenizer=, or give the folder "
                        "the model was saved in")
    if isinstance(tokenizer, (str, os.PathLike)):
        from attnlab.tokenizers import Tokenizer

        tokenizer = Tokenizer.load(tokenizer)
    return model_or_path, tokenizer


def _vocab_txt(folder: Path) -> Any:
    """The tokenizer of a Hugging Face BERT folder without tokenizer.json: its vocab.txt."""
    from attnlab.tokenizers import Tokenizer

    if not (folder / "vocab.txt").is_file():
        raise FileNotFoundError(f"{folder} has no tokenizer (tokenizer.json or vocab.txt): save the model with "
                                "attnlab.save(model, path, tokenizer=tok), or pass a tokenizer")
    return Tokenizer.load(folder / "vocab.txt")


def _mask_id(tokenizer: Any, model: nn.Module) -> int:
    """The id of the tokenizer's mask token, checked against the model's vocabulary."""
    roles = getattr(tokenizer, "roles", None)
    if not isinstance(roles, dict) or not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer must be an attnlab Tokenizer (or a file or folder it loads from), got "
                        f"{type(tokenizer).__name__}")
    if "mask" not in roles:
        specials = ", ".join(roles.values()) or "none"
        raise ValueError(f"the tokenizer has no mask token (its special tokens: {specials}): fill-mask needs the "
                         "tokenizer the masked LM was trained with ([MASK] for BERT)")
    mask_id = tokenizer.token_to_id(roles["mask"])
    if mask_id >= model.vocab_size:
        raise ValueError(f"the tokenizer's mask token {roles['mask']!r} has id {mask_id}, outside the model's "
                         f"vocabulary of {model.vocab_size}: is this the model's tokenizer?")
    return mask_id


def _token(tokenizer: Any, token_id: int) -> str:
    """The vocabulary entry of `token_id` (`##ing` for a WordPiece continuation), or `<id N>` for
    ids the model has and the tokenizer not (Hugging Face pads embedding tables)."""
    token = tokenizer.id_to_token(token_id)
    return token if token is not None else f"<id {token_id}>"
