"""Sequence scoring: how likely a model finds each of a few texts (the lectures' language-model
example: P("turn off the lights") > P("off turn the lights")).

    scores = score_texts(model, tokenizer, ["turn off the lights", "off turn the lights"])
    scores[0].log_prob, scores[0].tokens, scores[0].perplexity

A decoder-only model scores log P(w_1 .. w_n) = sum_i log P(w_i | w_<i), from a beginning-of-
sequence token when the tokenizer has one; without one the first token has no context and is not
scored (`tokens` counts the scored ones). An encoder-decoder scores log P(target | source), from
its decoder start token. `with_eos` adds the end token's probability (the text ends there).
Texts go through one full forward pass per batch (the same model call as training), right-padded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from attnlab.data.objectives import encoder_source
from attnlab.decoding.runner import is_seq2seq, lm_decoder, sequence_log_probs


@dataclass(frozen=True)
class SequenceScore:
    """One text's score: the summed log-probability (nats) of its `tokens` scored tokens."""

    text: str
    log_prob: float
    tokens: int

    @property
    def mean(self) -> float:
        """Mean log-probability per scored token (nats); nan when nothing was scored."""
        return self.log_prob / self.tokens if self.tokens else math.nan

    @property
    def perplexity(self) -> float:
        """exp(-mean); nan when nothing was scored."""
        return math.exp(-self.mean) if self.tokens else math.nan


def check_causal_lm(model: nn.Module) -> None:
    """Raise unless `model` gives next-token probabilities: a decoder with an LM head or an
    encoder-decoder (Transformer or recurrent). A masked-LM encoder's prediction at a position
    sees the token there, so a "perplexity" from it would look fine and mean nothing.

    Raises:
        ValueError: naming what the model is, and `attnlab fill-mask` for a masked-LM encoder.
    """
    try:
        lm_decoder(model)
    except TypeError:
        config = getattr(model, "config", None)
        arch, head = getattr(config, "arch", None), getattr(config, "head", None)
        what = f"arch={arch!r}, head={head!r}" if config is not None else type(model).__name__
        hint = (": a masked-LM encoder predicts a hidden token from both sides, not the next one (use "
                "`attnlab fill-mask` to see what it predicts for a [MASK])") if head == "mlm" else ""
        raise ValueError(f"score needs a causal language model, a decoder with an LM head (arch='decoder', "
                         f"head='lm') or an encoder-decoder; this model is {what}{hint}") from None


def _role(tokenizer: Any, role: str) -> int | None:
    return getattr(tokenizer, f"{role}_token_id", None)


def _target_rows(model: nn.Module, tokenizer: Any, texts: Sequence[str], with_eos: bool) -> tuple[list[list[int]], int]:
    """Token rows to score and the position the scoring starts at (1: after a start token; 1 too
    without one, the first token standing as the context of the rest)."""
    eos = _role(tokenizer, "eos")
    if with_eos and eos is None:
        raise ValueError("with_eos: the tokenizer has no end-of-sequence token")
    start = _role(tokenizer, "bos")
    if is_seq2seq(model) and start is None:
        start = getattr(model.config, "decoder_start_token_id", None) or getattr(model.config, "pad_token_id", None) or 0
    rows = []
    for text in texts:
        row = tokenizer.encode(text, add_special_tokens=False)
        row = ([start] if start is not None else []) + row + ([eos] if with_eos else [])
        if len(row) < 2:
            raise ValueError(f"{text!r} has {len(row)} token(s) and no start token: nothing to score "
                             "(a decoder needs one token of context)")
        rows.append(row)
    return rows, 1


def _padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (ids (B, T), mask (B, T) bool)."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = torch.tensor(r)
        mask[b, :len(r)] = True
    return ids, mask


@torch.no_grad()
def score_texts(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, sources: Sequence[str] | None = None,
                with_eos: bool = False, batch_size: int = 16) -> list[SequenceScore]:
    """The log-probability of each text under `model` (see the module docstring).

    Args:
        sources: one source text per text, for an encoder-decoder (required there, refused for a
            decoder-only model); encoded with the tokenizer's template.
        with_eos: score the end token after each text too.

    Raises:
        ValueError: a model that is not a causal LM (`check_causal_lm`), no texts, sources
            missing or of another length, a text too short to score (and the model's own error
            for a text longer than its learned positions).
    """
    check_causal_lm(model)
    if not texts:
        raise ValueError("give at least one text to score")
    seq2seq = is_seq2seq(model)
    if seq2seq and (sources is None or len(sources) != len(texts)):
        raise ValueError("an encoder-decoder scores a target given its source: give one source per text")
    if not seq2seq and sources is not None:
        raise ValueError("sources are for encoder-decoders; this model is decoder-only")
    rows, start = _target_rows(model, tokenizer, texts, with_eos)
    pad = _role(tokenizer, "pad") or 0
    model.eval()
    results = []
    for k in range(0, len(rows), batch_size):
        ids, mask = _padded(rows[k:k + batch_size], pad)
        src = src_mask = None
        if seq2seq:
            src, src_mask = _padded([encoder_source(tokenizer, s) for s in sources[k:k + batch_size]], pad)
        logp = sequence_log_probs(model, ids, start, mask=None if seq2seq else mask, src=src, src_mask=src_mask)
        scored = mask[:, start:]
        totals = (logp * scored).sum(-1)
        for b, text in enumerate(texts[k:k + batch_size]):
            results.append(SequenceScore(text, float(totals[b]), int(scored[b].sum())))
    return results


__all__ = ["SequenceScore", "check_causal_lm", "score_texts"]
