"""Beam search with length penalty, early stopping and n-best output.

Notation: B items, K beams per item (N = B x K rows), V vocabulary, P prompt length (1 for an
encoder-decoder: the start token), t the new-token step (0-based), L = P + t.

Each step every beam proposes its continuations; the best (n_eos + 1) x K of the K x V
candidates of an item, ranked by the summed log-probability of the new tokens, are examined
in order (Sutskever et al. 2014, https://arxiv.org/abs/1409.3215; Wu et al. 2016 for the
length penalty, https://arxiv.org/abs/1609.08144):

- a candidate ending in EOS (or any candidate at the last step) that ranks among the first K
  becomes a finished hypothesis with score

      score = sum_{i=1..n} log p(y_i | y_<i, x) / n ** length_penalty

  where n is the number of NEW tokens, the EOS included (the prompt, or the decoder start
  token, is not counted); the item keeps its K best hypotheses;
- the first K candidates not ending in EOS are the beams of the next step.

An item stops taking hypotheses once it holds K and
- early_stopping=True: at once;
- early_stopping=False: once its best running beam, normalised by the current length
  (sum log p / t ** length_penalty), no longer beats its worst hypothesis (a heuristic: with
  length_penalty > 0 a longer continuation could still have won).
The search ends when every item has stopped or after max_new_tokens steps. These are the
semantics of Hugging Face's `generate(num_beams=K)`, so the two agree token for token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.decoding.runner import Runner
from attnlab.decoding.search import DecodeOptions, apply_processors

_UNREACHABLE = -1.0e9  # the initial score of beams 1..K-1: step 0 expands beam 0 only


def _add(hyps: list[tuple[float, Tensor]], score: float, tokens: Tensor, K: int) -> None:
    hyps.append((score, tokens))
    hyps.sort(key=lambda h: -h[0])  # stable: the earlier of equal scores first
    del hyps[K:]


def beam_search(runner: Runner, ids: Tensor, valid: Tensor, prompt_len: int, max_new_tokens: int,
                opt: DecodeOptions, *, num_beams: int, length_penalty: float, early_stopping: bool,
                num_return_sequences: int, padded: bool) -> tuple[Tensor, Tensor]:
    """Beam search over the preallocated ids/valid (B, prompt_len + max_new_tokens).

    Returns:
        (sequences (B * num_return_sequences, prompt_len + longest), their scores
        (B * num_return_sequences,) as defined in the module docstring), best first per item.
    """
    B, K, P = ids.shape[0], num_beams, prompt_len
    device = ids.device
    expand = torch.arange(B, device=device).repeat_interleave(K)  # (N,)
    logits = runner.start(ids[:, :P], valid[:, :P] if padded else None).index_select(0, expand)  # (N, V)
    runner.expand(expand)
    ids, valid = ids.index_select(0, expand), valid.index_select(0, expand)
    beam_scores = torch.zeros(B, K, device=device)
    beam_scores[:, 1:] = _UNREACHABLE
    eos = set(opt.eos.tolist()) if opt.eos is not None else set()
    keep = max(2, len(eos) + 1) * K  # enough candidates that K of them do not end
    hyps: list[list[tuple[float, Tensor]]] = [[] for _ in range(B)]
    open_ = [True] * B
    for t in range(max_new_tokens):
        L, n = P + t, t + 1  # tokens so far; new tokens once this step's is appended
        logp = logits.float().log_softmax(-1)
        logp = apply_processors(logp, ids[:, :L], valid[:, :L] if padded else None, t, opt)  # (N, V)
        V = logp.shape[-1]
        total = (logp + beam_scores.view(-1, 1)).view(B, K * V)
        top_scores, top_index = total.topk(min(keep, K * V), dim=1)  # (B, keep), sorted
        scores_l, index_l = top_scores.tolist(), top_index.tolist()  # the host sync of the step
        last = n == max_new_tokens
        rows, tokens, kept_scores = [], [], []
        for b in range(B):
            full_before = len(hyps[b]) >= K
            chosen: list[tuple[int, int, float]] = []
            for rank, (score, flat) in enumerate(zip(scores_l[b], index_l[b])):
                row, token = b * K + flat // V, flat % V
                if token in eos or last:
                    if rank < K and open_[b] and not (early_stopping and full_before) and score != float("-inf"):
                        new = torch.cat([ids[row, P:L], ids.new_tensor([token])])
                        _add(hyps[b], score / n ** length_penalty, new, K)
                elif len(chosen) < K:
                    chosen.append((row, token, score))
            while len(chosen) < K:  # nothing left to extend (only at the last step or -inf rows)
                chosen.append((b * K, opt.pad_token_id, float("-inf")))
            if open_[b] and len(hyps[b]) >= K:
                best_running = chosen[0][2] / n ** length_penalty
                open_[b] = best_running > hyps[b][-1][0]
            for row, token, score in chosen:
                rows.append(row)
                tokens.append(token)
                kept_scores.append(score)
        if last or not any(open_) or (early_stopping and all(len(h) >= K for h in hyps)):
            break
        index = torch.tensor(rows, device=device)
        ids = ids.index_select(0, index)
        ids[:, L] = torch.tensor(tokens, device=device)
        beam_scores = torch.tensor(kept_scores, device=device).view(B, K)
        runner.reorder(index)
        logits = runner.step(ids[:, :L + 1], valid[:, :L + 1] if padded else None)
    return _collect(hyps, ids, P, K, num_return_sequences, opt.pad_token_id)


def _collect(hyps: list[list[tuple[float, Tensor]]], ids: Tensor, P: int, K: int, n: int,
             pad: int) -> tuple[Tensor, Tensor]:
    """The n best hypotheses of each item, right-padded, after the item's prompt."""
    best = [h[:n] for h in hyps]
    if any(len(h) < n for h in best):  # cannot happen with max_new_tokens >= 1; kept as a guard
        raise RuntimeError("beam search finished with fewer hypotheses than num_return_sequences")
    longest = max(len(tokens) for h in best for _, tokens in h)
    out = ids.new_full((len(hyps) * n, P + longest), pad)
    scores = torch.empty(len(hyps) * n, device=ids.device)
    for b, item in enumerate(best):
        for j, (score, tokens) in enumerate(item):
            out[b * n + j, :P] = ids[b * K, :P]
            out[b * n + j, P:P + len(tokens)] = tokens
            scores[b * n + j] = score
    return out, scores
