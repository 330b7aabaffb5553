"""`generate`: greedy decoding, sampling and beam search for attnlab decoders and
encoder-decoders, with a KV cache (or, with use_cache=False, the full forward at every step).

Notation: B prompts, P padded prompt length, n new tokens, V vocabulary.

    out = generate(model, prompt_ids, 20)                                   # greedy, (B, P + n)
    out = generate(model, prompt_ids, 20, attention_mask=mask, do_sample=True, top_p=0.9,
                   generator=torch.Generator().manual_seed(0))              # nucleus sampling
    out, scores = generate(model, src_ids, 30, num_beams=4, num_return_sequences=2,
                           eos_token_id=2, decoder_start_token_id=2, return_scores=True)
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch import Tensor, nn

from attnlab.decoding.beam import beam_search
from attnlab.decoding.runner import is_seq2seq, lm_decoder, make_runner
from attnlab.nn.linear import fixed_layouts
from attnlab.decoding.search import DecodeOptions, greedy_or_sample

TABLE_SCHEMES = ("learned", "binary")  # position schemes with a fixed number of positions


class GenerateOutput(NamedTuple):
    """`generate(..., return_scores=True)`: sequences and one score per sequence."""

    sequences: Tensor  # (B * num_return_sequences, T)
    scores: Tensor  # (B * num_return_sequences,)


def _finite(name: str, value: Any, rule: str) -> float:
    """A finite real number (NaN or inf would decode silently: nan beam scores sort anyhow, an
    infinite temperature samples uniformly)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number{rule}, got {value!r}")
    return value


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_prompt(input_ids: Any, attention_mask: Any) -> Tensor | None:
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32):
        got = f"shape {tuple(input_ids.shape)}, dtype {input_ids.dtype}" if isinstance(input_ids, Tensor) \
            else type(input_ids).__name__
        raise TypeError(f"input_ids must be an integer tensor of shape (B, T), got {got}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give at least one token per prompt")
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
        got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {got}")
    real = attention_mask.bool()
    if not bool(real.any(1).all()):
        raise ValueError("attention_mask has a row with no real token (an empty prompt)")
    return real


def _check_context(model: nn.Module, name: str, length: int, max_new: int, target: bool) -> None:
    """Learned and binary positions have position.max_len slots: refuse what does not fit."""
    pos = getattr(getattr(model, "config", None), "position", None)
    if pos is None or pos.scheme not in TABLE_SCHEMES:
        return
    if length > pos.max_len:
        raise ValueError(f"{name} has {length} tokens, longer than the model's context "
                         f"(position.max_len={pos.max_len} for {pos.scheme} positions); shorten it")
    if target and length + max_new > pos.max_len:
        raise ValueError(f"{name} ({length} tokens) + max_new_tokens={max_new} exceeds the model's context "
                         f"(position.max_len={pos.max_len}); lower max_new_tokens to at most {pos.max_len - length}")


def _eos_tensor(eos_token_id: int | Sequence[int] | None, vocab: int, device: torch.device) -> Tensor | None:
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab for i in ids):
        raise ValueError(f"eos_token_id must be an id (or a list of ids) in [0, {vocab}), got {eos_token_id!r}")
    return torch.tensor(ids, device=device)


@torch.no_grad()
def generate(model: nn.Module, input_ids: Tensor, max_new_tokens: int, *, attention_mask: Tensor | None = None,
             do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, repetition_penalty: float = 1.0, num_beams: int = 1,
             length_penalty: float = 1.0, early_stopping: bool = False, num_return_sequences: int = 1,
             no_repeat_ngram_size: int = 0, min_new_tokens: int = 0,
             eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
             decoder_start_token_id: int | None = None, stop_strings: str | Sequence[str] | None = None,
             tokenizer: Any = None, generator: torch.Generator | None = None, use_cache: bool = True,
             return_scores: bool = False, streamer: Callable[[Tensor], None] | None = None) -> Tensor | GenerateOutput:
    """Continue prompts (decoder) or translate sources (encoder-decoder).

    Args:
        model: an attnlab Decoder with an LM head, an EncoderDecoder or an RNNEncoderDecoder
            (put it in eval mode).
        input_ids: (B, T) prompt ids (decoder) or source ids (encoder-decoder). Prompts of
            different lengths are LEFT-padded, with `attention_mask` marking the real tokens.
        max_new_tokens: at most this many new tokens (>= 0).
        attention_mask: (B, T), 1 on real tokens; None = all real.
        do_sample: sample instead of taking the argmax; `temperature` (> 0), `top_k` (>= 1)
            and `top_p` (in (0, 1]) reshape the distribution first; `generator` seeds it.
        repetition_penalty: Keskar et al. 2019: scores of tokens already in the sequence
            (prompt included, padding excluded) are divided by it when positive, multiplied
            when negative (> 0; 1 = off).
        num_beams: beam search when > 1 (see `attnlab.decoding.beam` for the exact rules).
        length_penalty: beam score = sum of log-probs / n ** length_penalty, n = new tokens
            including EOS.
        early_stopping: beam search stops an item as soon as it holds num_beams hypotheses.
        num_return_sequences: beams: the n best per item (<= num_beams); sampling: n samples
            per prompt; rows of one prompt are adjacent in the output.
        no_repeat_ngram_size: forbid repeating any n-gram of this size (0 = off).
        min_new_tokens: EOS is forbidden before this many new tokens.
        eos_token_id: an id or a list of ids; a row that emits one stops and is padded.
        pad_token_id: fills finished rows; default the model config's, else the first EOS id.
        decoder_start_token_id: first target token of an encoder-decoder; default the model
            config's `decoder_start_token_id`, else its `pad_token_id`.
        stop_strings: stop a row once its new text contains one of them (needs `tokenizer`,
            greedy or sampling only).
        use_cache: False re-runs the full sequence every step (the reference path).
        return_scores: also return per-sequence scores: summed log-probabilities of the new
            tokens under the processed distribution (before temperature/top-k/top-p); beam
            search: the length-penalised score above.
        streamer: called with the new tokens (N,) after every step (greedy and sampling).

    Returns:
        LongTensor (B * num_return_sequences, T + n') — decoder: the prompt then the new tokens;
        encoder-decoder: the start token then the new tokens. n' <= max_new_tokens: the loop
        stops when every row has finished. With return_scores, a GenerateOutput.

    Raises:
        TypeError: a model without an LM head; input_ids not an integer (B, T) tensor.
        ValueError: an empty prompt; a prompt (or prompt + max_new_tokens) longer than the
            context of learned/binary positions; any setting outside the range given above.
    """
    decoder = lm_decoder(model)
    mask = _check_prompt(input_ids, attention_mask)
    max_new_tokens = _int("max_new_tokens", max_new_tokens, 0)
    num_beams = _int("num_beams", num_beams, 1)
    num_return_sequences = _int("num_return_sequences", num_return_sequences, 1)
    no_repeat_ngram_size = _int("no_repeat_ngram_size", no_repeat_ngram_size, 0)
    min_new_tokens = _int("min_new_tokens", min_new_tokens, 0)
    if do_sample:
        if not _finite("temperature", temperature, " > 0 when sampling") > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature!r}")
        if top_k is not None:
            top_k = _int("top_k", top_k, 1)
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                                  or not 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if num_beams > 1:
            raise ValueError("do_sample=True with num_beams > 1 (beam sampling) is not supported")
    if not _finite("repetition_penalty", repetition_penalty, " > 0") > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty!r}")
    _finite("length_penalty", length_penalty, "")
    if num_beams > 1 and num_return_sequences > num_beams:
        raise ValueError(f"num_return_sequences={num_return_sequences} must be <= num_beams={num_beams}")
    if num_beams == 1 and not do_sample and num_return_sequences > 1:
        raise ValueError("num_return_sequences > 1 needs do_sample=True or num_beams >= num_return_sequences")
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer argument (to turn ids into text)")
        if num_beams > 1:
            raise ValueError("stop_strings is supported for greedy decoding and sampling, not beam search")
    if streamer is not None and num_beams > 1:
        raise ValueError("streamer is supported for greedy decoding and sampling, not beam search")

    device, vocab = input_ids.device, decoder.vocab_size
    config = getattr(model, "config", None)
    eos = _eos_tensor(eos_token_id, vocab, device)
    if pad_token_id is None:
        pad_token_id = getattr(config, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = int(eos[0]) if eos is not None else 0
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or not 0 <= pad_token_id < vocab:
        raise ValueError(f"pad_token_id must be an id in [0, {vocab}) (finished rows are fed it), got {pad_token_id!r}")
    B, T = input_ids.shape
    input_ids = input_ids.long()
    seq2seq = is_seq2seq(model)
    if seq2seq:
        if decoder_start_token_id is None:
            decoder_start_token_id = getattr(config, "decoder_start_token_id", None)
            decoder_start_token_id = getattr(config, "pad_token_id", None) if decoder_start_token_id is None \
                else decoder_start_token_id
        if decoder_start_token_id is None or not 0 <= decoder_start_token_id < vocab:
            raise ValueError(f"decoder_start_token_id must be an id in [0, {vocab}), got {decoder_start_token_id!r}")
        src_len = int(mask.sum(1).max()) if mask is not None else T
        _check_context(model, "the source (input_ids)", src_len, 0, target=False)
        _check_context(model, "the decoder start token", 1, max_new_tokens, target=True)
        prompt = torch.full((B, 1), decoder_start_token_id, dtype=torch.long, device=device)
        prompt_mask = None
    else:
        prompt_len = int(mask.sum(1).max()) if mask is not None else T
        _check_context(model, "the prompt (input_ids)", prompt_len, max_new_tokens, target=True)
        prompt, prompt_mask = input_ids, mask

    opt = DecodeOptions(do_sample=do_sample, temperature=float(temperature), top_k=top_k, top_p=top_p,
                        repetition_penalty=float(repetition_penalty), no_repeat_ngram_size=no_repeat_ngram_size,
                        min_new_tokens=min_new_tokens, eos=eos, pad_token_id=pad_token_id, generator=generator,
                        stop_strings=stop_strings or None, tokenizer=tokenizer, return_scores=return_scores,
                        streamer=streamer)
    padded = prompt_mask is not None and not bool(prompt_mask.all())
    src, src_mask = (input_ids, mask) if seq2seq else (None, None)
    if seq2seq and mask is not None and bool(mask.all()):
        src_mask = None  # no padding: skip building the cross-attention mask every step
    n_rows = num_return_sequences if num_beams == 1 else 1  # sampling: repeat each prompt n times
    if n_rows > 1:
        prompt = prompt.repeat_interleave(n_rows, 0)
        prompt_mask = prompt_mask.repeat_interleave(n_rows, 0) if prompt_mask is not None else None
    P = prompt.shape[1]
    ids = prompt.new_full((prompt.shape[0], P + max_new_tokens), pad_token_id)  # preallocated output
    ids[:, :P] = prompt
    valid = torch.ones_like(ids, dtype=torch.bool)
    if prompt_mask is not None:
        valid[:, :P] = prompt_mask
    if max_new_tokens == 0:
        out = ids[:, :P]
        return GenerateOutput(out, torch.zeros(out.shape[0], device=device)) if return_scores else out
    runner = make_runner(model, use_cache=use_cache, max_len=P + max_new_tokens, src=src, src_mask=src_mask)
    if n_rows > 1 and seq2seq:  # the source was encoded once per item: repeat its memory
        runner.expand(torch.arange(B, device=device).repeat_interleave(n_rows))
    with fixed_layouts(model):  # the weights stay as they are until the loop ends: check their layouts once
        if num_beams > 1:
            out, scores = beam_search(runner, ids, valid, P, max_new_tokens, opt, num_beams=num_beams,
                                      length_penalty=float(length_penalty), early_stopping=bool(early_stopping),
                                      num_return_sequences=num_return_sequences, padded=padded)
        else:
            out, scores = greedy_or_sample(runner, ids, valid, P, max_new_tokens, opt, padded=padded)
    return GenerateOutput(out, scores) if return_scores else out
