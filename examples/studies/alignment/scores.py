"""Where a translation model says each target piece comes from, as (target pieces, source pieces)
matrices under teacher forcing on the reference: its cross-attention (every layer and head of a
Transformer, the one attention of a recurrent model), and attributions of each target piece's
log-probability to the source token embeddings (gradient x input, integrated gradients).

Row t is the decoder step that predicts target piece t (its query has read BOS and pieces < t);
`shifted=True` rows are the step whose input is piece t (t + 1), the one that has just read it.
The source columns are the source pieces followed by the EOS the objective appends.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.inspect.attention_maps import attention_maps, attention_modules


def source_embedding(model: nn.Module) -> nn.Module:
    """The module that embeds source tokens (a Transformer's encoder's token embedding, a
    recurrent model's source embedding, which may be shared with the target's)."""
    encoder = getattr(model, "encoder", None)
    if encoder is not None and hasattr(getattr(encoder, "embed", None), "token"):
        return encoder.embed.token
    if hasattr(model, "src_embed"):
        return model.src_embed
    raise ValueError(f"model: no source token embedding found on {type(model).__name__}")


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


@contextmanager
def _scaled_source(model: nn.Module, src_ids: Tensor, alphas: Tensor) -> Iterator[dict]:
    """While inside: the source embedding's output (for the batch of source rows) is multiplied by
    `alphas` (one per row), and kept (requiring grad) in the yielded dict as "embedding"."""
    module, seen = source_embedding(model), {}

    def hook(mod, args, output):
        if "embedding" in seen or output.shape[:2] != src_ids.shape:
            return None  # the target side of a shared embedding, or a later call
        leaf = output.detach().requires_grad_(True)
        seen["embedding"] = leaf
        return leaf * alphas.view(-1, 1, 1).to(leaf.dtype)

    handle = module.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def _piece_gradients(model: nn.Module, src_ids: Tensor, tgt_in: Tensor, labels: Tensor, alpha: float
                     ) -> tuple[Tensor, Tensor]:
    """(embedding (S, D), gradients (T, S, D)): the gradient of each target piece's log-probability
    with respect to the (unscaled) source token embeddings, the embeddings scaled by `alpha`; one
    batch row per target piece (rows are independent, so one backward gives every row's own)."""
    T = labels.shape[1] - 1  # the EOS prediction is not a target word
    src = src_ids.expand(T, -1)
    with _scaled_source(model, src, torch.full((T,), alpha)) as seen:
        logits = model(src, tgt_in.expand(T, -1))
        logp = F.log_softmax(logits.float(), -1)
        picked = logp[torch.arange(T), torch.arange(T), labels[0, :T]]
        picked.sum().backward()
        embedding = seen["embedding"]
    # the leaf is the unscaled embedding; d(logp)/d(alpha * e) = grad / alpha
    return embedding[0].detach(), embedding.grad / alpha


def attribution_scores(model: nn.Module, src_ids: Tensor, tgt_in: Tensor, labels: Tensor, steps: int = 8
                       ) -> dict[str, Tensor]:
    """{"grad_x_input": (T, S), "integrated_gradients": (T, S)}: |sum_d e_sd * g_tsd| per target piece
    t and source piece s, with g the gradient at the embeddings (gradient x input) or its mean
    along the straight path from a zero token embedding to them, at the midpoints of `steps` equal
    parts (integrated gradients, Sundararajan et al. 2017; positions are not part of the path)."""
    if steps < 1:
        raise ValueError(f"steps must be a positive number of integration steps, got {steps}")
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:  # no parameter gradients: only the embeddings' are read
        p.requires_grad_(False)
    try:
        embedding, grad = _piece_gradients(model, src_ids, tgt_in, labels, 1.0)
        gxi = (grad * embedding).sum(-1).abs()
        total = torch.zeros_like(grad)
        for k in range(steps):
            total += _piece_gradients(model, src_ids, tgt_in, labels, (k + 0.5) / steps)[1]
        ig = (total / steps * embedding).sum(-1).abs()
    finally:
        for p in trainable:
            p.requires_grad_(True)
    return {"grad_x_input": gxi, "integrated_gradients": ig}
