"""Generation with Transformer-XL's segment memory (Dai et al. 2019, https://arxiv.org/abs/1901.02860).

A decoder built with `memory_len` M > 0 reads a stream in segments of T tokens; each segment
attends over itself and the memory, the previous segments' layer inputs at the last M positions
(`attnlab.nn.kv_cache.SegmentMemory`, `Decoder.segment`). Generating with it keeps that layout:

    prompt:  | segment 1 | segment 2 | cur... |         whole segments go into the memory
    decode:                          | cur + new ... |   the KV cache holds [memory; current segment]
                                     `- at T + 1 tokens the current segment joins the memory and a
                                        new one starts with the last token

so the model sees exactly what it was trained on (a segment of at most T queries over the memory
of the segments before it), however long the text grows. Each new token takes the decoding fast
path (`TransformerStack.step`); a segment is recomputed once when it joins the memory.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.kv_cache import KVCache, SegmentMemory


def resolve_mem_len(model: nn.Module, mem_len: int | None) -> int:
    """`mem_len`, else the model's config `memory_len`.

    Raises:
        ValueError: neither gives a positive length.
    """
    if mem_len is None:
        mem_len = getattr(getattr(model, "config", None), "memory_len", 0)
    if not isinstance(mem_len, int) or isinstance(mem_len, bool) or mem_len <= 0:
        raise ValueError(f"segment memory needs a positive mem_len (or a model built with memory_len > 0), "
                         f"got {mem_len!r}")
    return mem_len


def _next_token(logits: Tensor, do_sample: bool, temperature: float, top_k: int | None,
                generator: torch.Generator | None) -> Tensor:
    """(B, V) logits -> (B,) the argmax, or a draw from softmax(logits / temperature) over the top_k."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


@torch.no_grad()
def generate_with_memory(model: nn.Module, input_ids: Tensor, max_new_tokens: int, *, seg_len: int,
                         mem_len: int | None = None, do_sample: bool = False, temperature: float = 1.0,
                         top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Continue `input_ids` (B, P) by `max_new_tokens`, reading and writing in segments of `seg_len`
    over a segment memory of `mem_len` positions (see the module docstring).

    Segment boundaries fall at multiples of seg_len from the start of the prompt, as when the
    stream was read for evaluation: the logits of token n come from the segment holding token n
    (at most seg_len tokens) over the memory of the whole segments before it.

    Args:
        model: a Decoder (its positions relative: rotary, ALiBi, T5 bias, Shaw's, or none).
        seg_len: T, tokens per segment (the training segment length).
        mem_len: M; default the model's `memory_len`.
        do_sample, temperature, top_k, generator: sampling (default greedy).

    Returns:
        (B, P + max_new_tokens) the prompt and the new tokens.

    Raises:
        ValueError: an empty prompt, seg_len < 1, no memory length, or a model without relative positions.
    """
    mem_len = resolve_mem_len(model, mem_len)
    if not isinstance(seg_len, int) or seg_len < 1:
        raise ValueError(f"seg_len must be a positive integer, got {seg_len!r}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty (B, P) prompt, got shape {tuple(input_ids.shape)}")
    was_training = model.training
    model.eval()
    try:
        whole = (input_ids.shape[1] - 1) // seg_len  # whole segments before the one the next token joins
        mems = None
        for s in range(whole):
            _, mems = model.segment(input_ids[:, s * seg_len:(s + 1) * seg_len], mems, mem_len=mem_len)
        current, new = input_ids[:, whole * seg_len:], []  # current: 1 to seg_len tokens
        while len(new) < max_new_tokens:
            mems, current = _decode_segment(model, current, mems, mem_len, seg_len, max_new_tokens, new,
                                            (do_sample, temperature, top_k, generator))
    finally:
        model.train(was_training)
    return torch.cat([input_ids, *[t[:, None] for t in new]], dim=1)


def _decode_segment(model: nn.Module, current: Tensor, mems: list[Tensor] | None, mem_len: int, seg_len: int,
                    max_new_tokens: int, new: list[Tensor], sampling: tuple) -> tuple[list[Tensor] | None, Tensor]:
    """Decode into the current segment through a KV cache over [memory; segment] until it holds
    seg_len tokens and one more arrives (then it joins the memory) or the budget is spent;
    appends each new token (B,) to `new`. Returns the memory and the next current segment."""
    memory = SegmentMemory(mem_len, mems)  # the prompt call reads it (and advances this copy, unused)
    cache = KVCache(max_len=memory.length + seg_len)
    logits = model(current, mems=memory, cache=cache)[:, -1]  # (B, V)
    while True:
        token = _next_token(logits, *sampling)
        new.append(token)
        current = torch.cat([current, token[:, None]], dim=1)
        if len(new) == max_new_tokens:
            return mems, current
        if current.shape[1] > seg_len:  # the segment is whole: it joins the memory, the new token opens the next
            _, mems = model.segment(current[:, :seg_len], mems, mem_len=mem_len)
            return mems, current[:, seg_len:]
        logits = model.head.step(model.step(token, cache))
