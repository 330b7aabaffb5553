"""Greedy decoding and sampling: one token per row per step, finished rows padded.

Notation: N rows, P prompt length (or 1: the start token of an encoder-decoder), L = P + t
tokens so far at step t, V vocabulary.

    ids    (N, P + max_new)  preallocated; the prompt, then one new column per step
    valid  (N, P + max_new)  True on real tokens (False on left padding)
    step t: logits (N, V) -> processors -> (warpers, sample | argmax) -> ids[:, L]

The only host synchronisation per step is the EOS check ("is every row finished?"), made
only when an EOS id is given; stop strings add a decode of the unfinished rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from attnlab.decoding import processors as P
from attnlab.decoding.runner import Runner


@dataclass
class DecodeOptions:
    """The resolved per-step settings shared by greedy, sampling and beam search."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    eos: Tensor | None = None  # (K,) EOS ids
    pad_token_id: int = 0
    generator: torch.Generator | None = None
    stop_strings: Sequence[str] | None = None
    tokenizer: Any = None
    return_scores: bool = False
    streamer: Any = None  # callable(tokens (N,) LongTensor) called after each step


def apply_processors(scores: Tensor, ids: Tensor, valid: Tensor | None, t: int, opt: DecodeOptions) -> Tensor:
    """Repetition penalty, n-gram ban and minimum length on scores (N, V) at new-token step t,
    given the tokens so far ids (N, L) (valid: False on padding, or None)."""
    if opt.repetition_penalty != 1.0:
        # padding must not count as "seen": replace it by the row's last token, which is real
        seen = ids if valid is None else torch.where(valid, ids, ids[:, -1:])
        scores = P.repetition_penalty(scores, seen, opt.repetition_penalty)
    if opt.no_repeat_ngram_size:
        scores = P.no_repeat_ngram(scores, ids, opt.no_repeat_ngram_size, valid)
    if opt.eos is not None and t < opt.min_new_tokens:
        scores = P.forbid_tokens(scores, opt.eos)
    return scores


def choose(scores: Tensor, opt: DecodeOptions) -> Tensor:
    """Next token per row (N,): argmax, or a sample after temperature, top-k and top-p."""
    if not opt.do_sample:
        return scores.argmax(-1)
    if opt.temperature != 1.0:
        scores = scores / opt.temperature
    if opt.top_k is not None:
        scores = P.top_k_filter(scores, opt.top_k)
    if opt.top_p is not None:
        scores = P.top_p_filter(scores, opt.top_p)
    return P.sample(scores, opt.generator)


def _hits_stop_string(opt: DecodeOptions, ids: Tensor, start: int, rows: list[int]) -> list[int]:
    """Rows whose new text (ids[row, start:]) contains a stop string."""
    hits = []
    for row in rows:
        text = opt.tokenizer.decode(ids[row, start:].tolist())
        if any(s in text for s in opt.stop_strings):
            hits.append(row)
    return hits


def greedy_or_sample(runner: Runner, ids: Tensor, valid: Tensor, prompt_len: int, max_new_tokens: int,
                     opt: DecodeOptions, *, padded: bool) -> tuple[Tensor, Tensor | None]:
    """Run the loop on the preallocated `ids`/`valid` (N, prompt_len + max_new_tokens).

    Returns:
        (ids (N, prompt_len + steps), summed log-probabilities (N,) of the new tokens under the
        processed distribution, or None unless `opt.return_scores`).
    """
    N = ids.shape[0]
    model_mask = (lambda L: valid[:, :L]) if padded else (lambda L: None)
    unfinished = torch.ones(N, dtype=torch.bool, device=ids.device)
    total = torch.zeros(N, device=ids.device) if opt.return_scores else None
    tracks_finish = opt.eos is not None or bool(opt.stop_strings)
    logits = runner.start(ids[:, :prompt_len], model_mask(prompt_len))
    steps = 0
    for t in range(max_new_tokens):
        L = prompt_len + t
        scores = apply_processors(logits.float(), ids[:, :L], valid[:, :L] if padded else None, t, opt)
        token = choose(scores, opt)  # (N,)
        if tracks_finish:
            token = torch.where(unfinished, token, opt.pad_token_id)
        if total is not None:
            logp = scores.log_softmax(-1).gather(1, token[:, None])[:, 0]
            total += torch.where(unfinished, logp, 0.0)
        ids[:, L] = token
        steps = t + 1
        if opt.streamer is not None:
            opt.streamer(token)
        if tracks_finish:
            if opt.eos is not None:
                unfinished &= ~torch.isin(token, opt.eos)
            if opt.stop_strings:
                rows = unfinished.nonzero()[:, 0].tolist()
                for row in _hits_stop_string(opt, ids[:, :L + 1], prompt_len, rows):
                    unfinished[row] = False
            if not bool(unfinished.any()):  # the one host sync per step
                break
        if t + 1 < max_new_tokens:
            logits = runner.step(ids[:, :L + 1], model_mask(L + 1))
    return ids[:, :prompt_len + steps], total
