"""Where a translation model says each target piece comes from, as (target pieces, source pieces)
matrices under teacher forcing on the reference: its cross-attention (every layer and head of a
Transformer, the one attention of a recurrent model), and attributions of each target piece's
log-probability to the source token embeddings (gradient x input, integrated gradients).

Row t is the decoder step that predicts target piece t (its query has read BOS and pieces < t);
`shifted=True` rows are the step whose input is piece t (t + 1), the one that has just read it.
The source columns are the source pieces followed by the EOS the objective appends.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.inspect.attention_maps import attention_maps, attention_modules
from attnlab.inspect.attribution import gradient_x_input, integrated_gradients


def teacher_forcing(tok, source: str, target: str) -> tuple[Tensor, Tensor, Tensor]:
    """(src_ids (1, S): source + EOS, tgt_in (1, T + 1): BOS + target, labels (1, T + 1): target + EOS),
    as the seq2seq objective builds a pair."""
    s, t = tok.encode(source), tok.encode(target)
    return (torch.tensor([s + [tok.eos_token_id]]), torch.tensor([[tok.bos_token_id] + t]),
            torch.tensor([t + [tok.eos_token_id]]))


def attention_scores(model: nn.Module, src_ids: Tensor, tgt_in: Tensor, shifted: bool = False) -> dict[str, Tensor]:
    """{attention module name: (heads, T, S)} for the cross-attentions (a Transformer's
    `decoder.layers.{i}.cross_attn`, a recurrent model's `attention`), T = the target pieces."""
    names = [n for n in attention_modules(model) if n.endswith("cross_attn") or n == "attention"]
    maps = attention_maps(model, src_ids, tgt_in, names=names)
    T = tgt_in.shape[1] - 1
    rows = slice(1, T + 1) if shifted else slice(0, T)
    return {name: w[0][:, rows].float() for name, w in maps.items()}


def attribution_scores(model: nn.Module, src_ids: Tensor, tgt_in: Tensor, labels: Tensor, steps: int = 8
                       ) -> dict[str, Tensor]:
    """{"grad_x_input": (T, S), "integrated_gradients": (T, S)}: |attribution| of each target piece
    t's log-probability to each source position s, summed over the embedding width, taken at the
    encoder's embedding output (a recurrent model's source embedding) by
    `attnlab.inspect.attribution` (integrated gradients: Gauss-Legendre over `steps` points from
    the pad-token baseline). One batch row per target piece, so one pass scores every piece."""
    if steps < 1:
        raise ValueError(f"steps must be a positive number of integration steps, got {steps}")
    T = labels.shape[1] - 1  # the EOS prediction is not a target word
    wanted = labels[0, :T]

    def piece_logprob(output: Tensor) -> Tensor:  # row k * T + t scores piece t at step t
        rows = torch.arange(output.shape[0])
        t = rows % T
        return F.log_softmax(output[rows, t].float(), -1).gather(-1, wanted[t, None])[:, 0]

    src, tgt = src_ids.expand(T, -1), tgt_in.expand(T, -1)
    gxi = gradient_x_input(model, src, tgt, target=piece_logprob, side="source")
    ig = integrated_gradients(model, src, tgt, target=piece_logprob, side="source", steps=steps)
    return {"grad_x_input": gxi.scores.abs(), "integrated_gradients": ig.scores.abs()}
