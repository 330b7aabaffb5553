"""Evaluation: perplexity, greedy decoding for translation, BLEU and chrF (through sacrebleu).

    ppl = perplexity(mean_loss)                                   # exp(mean token NLL)
    hyps = translate(model, src_ids, src_mask, bos_id=1, eos_id=2, max_new_tokens=64)
    scores = bleu_chrf(hypotheses, references)                    # {"bleu": .., "chrf": ..}

BLEU: Papineni et al. 2002 (https://aclanthology.org/P02-1040); chrF: Popovic 2015
(https://aclanthology.org/W15-3049); both as sacrebleu computes them (Post 2018), so the
numbers compare with published ones.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn


def perplexity(mean_loss: float) -> float:
    """exp(mean token negative log-likelihood, in nats); inf when it overflows."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return float("inf")


def bleu_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU and chrF of detokenised hypotheses against one reference each.

    Raises:
        ValueError: different lengths.
        ImportError: sacrebleu is not installed (with the pip command to fix it).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses ({len(hypotheses)}) and references ({len(references)}) differ in length")
    try:
        import sacrebleu
    except ImportError:
        raise ImportError("BLEU/chrF need sacrebleu: pip install sacrebleu") from None
    return {"bleu": sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score,
            "chrf": sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score}


@torch.no_grad()
def _greedy_uncached(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None, bos_id: int, eos_id: int,
                     max_new_tokens: int) -> Tensor:
    """Plain greedy decoding without a KV cache: re-runs the decoder on the whole prefix."""
    memory = model.encode(src_ids, src_mask)
    out = torch.full((src_ids.shape[0], 1), bos_id, dtype=torch.long, device=src_ids.device)
    done = torch.zeros(src_ids.shape[0], dtype=torch.bool, device=src_ids.device)
    for _ in range(max_new_tokens):
        logits = model.decode(out, memory, src_mask)[:, -1]  # (B, V)
        nxt = logits.argmax(-1).masked_fill(done, eos_id)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return out


def greedy_decode(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None, *, bos_id: int, eos_id: int,
                  max_new_tokens: int = 64) -> Tensor:
    """Greedy target ids (B, 1 + new) for an encoder-decoder, starting from `bos_id`.

    Uses `attnlab.generate` (KV cache) when the installed attnlab has it, else an uncached
    loop; both give the same tokens.
    """
    try:
        from attnlab.decoding import generate
    except ImportError:
        generate = None
    if generate is not None:
        try:
            return generate(model, src_ids, max_new_tokens, attention_mask=src_mask, eos_token_id=eos_id,
                            decoder_start_token_id=bos_id)
        except TypeError:  # a generate() with another keyword set: fall back
            pass
    return _greedy_uncached(model, src_ids, src_mask, bos_id, eos_id, max_new_tokens)


@torch.no_grad()
def continue_text(model: nn.Module, ids: Sequence[int], max_new_tokens: int, *, context: int,
                  temperature: float = 0.8, top_k: int | None = 40, generator: torch.Generator | None = None) -> list[int]:
    """Sample a continuation from a decoder (temperature and top-k; temperature 0 = greedy),
    keeping at most `context` tokens of history. Uncached: one full forward per token."""
    device = next(model.parameters()).device
    out = list(ids)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([out[-context:]], device=device))[0, -1].float()  # (V,)
        if temperature <= 0:
            out.append(int(logits.argmax()))
            continue
        logits = logits / temperature
        if top_k is not None and top_k < logits.numel():
            kth = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, -1).cpu()
        out.append(int(torch.multinomial(probs, 1, generator=generator)))
    return out
