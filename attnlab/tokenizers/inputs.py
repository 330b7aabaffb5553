"""Truncation and padding of encoded sequences into model inputs.

Truncation keeps the start of each sequence and makes room for the template's special
tokens, so ``max_length`` counts everything the model sees:

- ``longest_first``: the shorter sequence keeps up to half the room (rounded down) and the
  longer one the rest; when both are as long, the first counts as the shorter. This is the
  rule of Hugging Face's fast tokenizers (``BertTokenizerFast``);
- ``only_first`` / ``only_second``: take them from that sequence only; if that is not enough,
  raise ``ValueError``.

Padding fills with the pad id up to the longest row (``"longest"``) or to ``max_length``
(``"max_length"``), then up to a multiple of ``pad_to_multiple_of``, on the right or the left.
The attention mask is 1 on real tokens and 0 on padding; padded token type ids are 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnlab.tokenizers.template import Template

TRUNCATION = ("longest_first", "only_first", "only_second")
PADDING = ("longest", "max_length")
SIDES = ("right", "left")


def _strategy(name: str, value: bool | str | None, when_true: str, allowed: tuple[str, ...]) -> str | None:
    if value is False or value is None:
        return None
    if value is True:
        return when_true
    if value in allowed:
        return value
    raise ValueError(f"{name} must be True, False or one of {', '.join(allowed)}; got {value!r}")


def truncation_strategy(truncation: bool | str) -> str | None:
    """Normalise the ``truncation`` argument: ``True`` → ``"longest_first"``, ``False`` → ``None``."""
    return _strategy("truncation", truncation, "longest_first", TRUNCATION)


def padding_strategy(padding: bool | str) -> str | None:
    """Normalise the ``padding`` argument: ``True`` → ``"longest"``, ``False`` → ``None``."""
    return _strategy("padding", padding, "longest", PADDING)


def truncate_pair(
    a: list[int], b: list[int] | None, budget: int, strategy: str
) -> tuple[list[int], list[int] | None]:
    """Shorten ``a`` and ``b`` so that together they hold at most ``budget`` tokens.

    Example:
        >>> truncate_pair([1] * 10, [2] * 10, 5, "longest_first")
        ([1, 1], [2, 2, 2])
    """
    total = len(a) + (len(b) if b is not None else 0)
    excess = total - budget
    if excess <= 0:
        return a, b
    if strategy == "longest_first":
        if b is None:
            return a[:budget], b
        if len(a) > len(b):
            keep_b = min(len(b), budget // 2)
            return a[: budget - keep_b], b[:keep_b]
        keep_a = min(len(a), budget // 2)
        return a[:keep_a], b[: budget - keep_a]
    if strategy == "only_second" and b is None:
        raise ValueError("truncation='only_second' needs a pair of sequences (text_pair)")
    target_is_a = strategy == "only_first"
    target = a if target_is_a else b
    if len(target) < excess:
        which = "first" if target_is_a else "second"
        raise ValueError(
            f"truncation={strategy!r}: the {which} sequence has {len(target)} tokens but {excess} must go "
            f"to fit max_length; use truncation='longest_first' or a larger max_length"
        )
    shortened = target[: len(target) - excess]
    return (shortened, b) if target_is_a else (a, shortened)


def padded_length(lengths: list[int], padding: str | None, max_length: int | None,
                  pad_to_multiple_of: int | None) -> int:
    """The row length after padding (the longest row's length when not padding)."""
    longest = max(lengths, default=0)
    if padding is None:
        return longest
    if padding == "max_length":
        if max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        length = max(max_length, longest)
    else:
        length = longest
    if pad_to_multiple_of:
        length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    return length


def pad_rows(rows: list[dict[str, list[int]]], length: int, pad_id: int, side: str) -> list[dict[str, Any]]:
    """Pad each row's ``input_ids``/``attention_mask``/``token_type_ids`` to ``length``."""
    fill = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0}
    out = []
    for row in rows:
        n = length - len(row["input_ids"])
        if n <= 0:
            out.append(row)
            continue
        if side == "right":
            out.append({k: v + [fill[k]] * n for k, v in row.items()})
        else:
            out.append({k: [fill[k]] * n + v for k, v in row.items()})
    return out


def encode_inputs(
    encode: Callable[[str], list[int]],
    template: Template,
    token_to_id: Mapping[str, int],
    pad_token_id: int | None,
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
    """``tokenizer(text, text_pair, ...)``: encode, truncate, apply the template, pad.

    ``encode``, ``template``, ``token_to_id`` and ``pad_token_id`` are the tokenizer's parts
    (``Tokenizer.__call__`` passes its own); see ``Tokenizer.__call__`` for the rest.
    """
    batched = not isinstance(text, str)
    texts = list(text) if batched else [text]
    pairs: list[str] | None = None
    if text_pair is not None:
        pairs = list(text_pair) if batched else [text_pair]
        if batched == isinstance(text_pair, str) or len(pairs) != len(texts):
            raise ValueError("text_pair must match text: a string for a string, a list as long as the list")
    strategy = truncation_strategy(truncation)
    pad = padding_strategy(padding)
    for name, value in (("max_length", max_length), ("pad_to_multiple_of", pad_to_multiple_of)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if padding_side not in SIDES:
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if return_tensors not in (None, "pt"):
        raise ValueError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
    if strategy and max_length is None:
        raise ValueError("truncation needs max_length")

    rows = []
    for i, first in enumerate(texts):
        a = encode(first)
        b = encode(pairs[i]) if pairs is not None else None
        if strategy:
            added = template.num_added(b is not None) if add_special_tokens else 0
            if max_length < added:
                raise ValueError(f"max_length={max_length} leaves no room: the template adds {added} tokens")
            a, b = truncate_pair(a, b, max_length - added, strategy)
        if add_special_tokens:
            ids, types = template.apply(a, b, token_to_id)
        else:
            ids, types = a + (b or []), [0] * len(a) + [1] * len(b or [])
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": types})

    length = padded_length([len(r["input_ids"]) for r in rows], pad, max_length, pad_to_multiple_of)
    if pad is not None:
        if pad_token_id is None:
            raise ValueError("padding needs a pad token; add one, e.g. tok.add_special_tokens({'pad': '<pad>'})")
        rows = pad_rows(rows, length, pad_token_id, padding_side)
    out = {key: [r[key] for r in rows] for key in ("input_ids", "attention_mask", "token_type_ids")}
    if return_tensors == "pt":
        if len({len(r) for r in out["input_ids"]}) > 1:
            raise ValueError("return_tensors='pt' needs rows of one length; pass padding=True")
        import torch

        return {k: torch.tensor(v, dtype=torch.long).reshape(len(rows), -1) for k, v in out.items()}
    return out if batched else {k: v[0] for k, v in out.items()}
