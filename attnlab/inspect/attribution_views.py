"""Pictures of attributions: signed per-token bars (integrated gradients, gradient x input), the
logit lens as a layers x positions grid, and pages of the attention viewer
(`attnlab.inspect.viewer`) for token attributions, rollout and flow.

The viewer shows non-negative weights up to 1: a token attribution appears there as one query
(the scored prediction) over the input tokens with weight |a_t| / max |a|, its sign kept in the
PNG and in the page's note; rollout and flow are already rows of non-negative shares summing to 1
(rollout after each layer is one "layer" of the page).
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from torch import Tensor

from attnlab.inspect.plots import _figure, save_figure
from attnlab.inspect.viewer import AttentionKind, AttentionMap, AttentionView


def _labels(labels: Sequence[str], n: int, name: str) -> list[str]:
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} entries, expected {n}")
    return list(labels)


def plot_token_scores(scores: Tensor, tokens: Sequence[str], path: str | os.PathLike, *,
                      title: str | None = None) -> str:
    """Per-token attributions (T,) as signed bars (red: raises the score, blue: lowers it).

    Raises:
        ValueError: scores is not 1-D, or the token count differs.
    """
    s = torch.as_tensor(scores).detach().float().cpu()
    if s.dim() != 1:
        raise ValueError(f"scores must be one value per token (T,), got shape {tuple(s.shape)}")
    tokens = _labels(tokens, s.shape[0], "tokens")
    fig = _figure(max(4.0, 0.4 * len(tokens) + 1.5), 3.2)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(range(len(tokens)), s.numpy(), color=["tab:red" if v >= 0 else "tab:blue" for v in s.tolist()])
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(tokens)), tokens, rotation=90)
    ax.set_ylabel("attribution")
    if title:
        ax.set_title(title)
    return save_figure(fig, path)


def plot_logit_lens(probs: Tensor, top: Sequence[Sequence[str]], tokens: Sequence[str], path: str | os.PathLike, *,
                    title: str | None = None) -> str:
    """The logit lens of one example: rows = layers, columns = positions, colour = the probability
    of each layer's top token, written in its cell.

    Args:
        probs: (L, T) the top token's probability per layer and position.
        top: L lists of T token strings (each layer's top token).
        tokens: the T input tokens (the column labels).

    Raises:
        ValueError: shapes that do not agree.
    """
    p = torch.as_tensor(probs).detach().float().cpu()
    if p.dim() != 2:
        raise ValueError(f"probs must be (L, T), got shape {tuple(p.shape)}")
    L, T = p.shape
    tokens = _labels(tokens, T, "tokens")
    if len(top) != L or any(len(row) != T for row in top):
        raise ValueError(f"top must be {L} rows of {T} token strings")
    fig = _figure(max(4.0, 0.7 * T + 1.5), max(2.5, 0.45 * L + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(p.numpy(), cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
    fig.colorbar(im, ax=ax, label="probability of the top token")
    for l in range(L):
        for t in range(T):
            ax.text(t, l, top[l][t][:8], ha="center", va="center", fontsize=6,
                    color="black" if p[l, t] > 0.6 else "white")
    ax.set_xticks(range(T), tokens, rotation=90)
    ax.set_yticks(range(L), [f"layer {l + 1}" for l in range(L)])
    ax.set_xlabel("input position")
    if title:
        ax.set_title(title)
    return save_figure(fig, path)


def scores_view(scores: Tensor, tokens: Sequence[str], target_label: str, *, side: str = "source",
                method: str = "integrated gradients") -> AttentionView:
    """A viewer page of one example's token attributions (T,): one query, the scored prediction,
    over the tokens of `side`, weight |a_t| / max |a|."""
    s = torch.as_tensor(scores).detach().float().cpu()
    tokens = _labels(tokens, s.shape[0], "tokens")
    peak = float(s.abs().max())
    weights = (s.abs() / peak if peak > 0 else s.abs())[None, None]  # (1, 1, T)
    negative = [tokens[i] for i in range(len(tokens)) if s[i] < 0]
    note = (f"{method}: |attribution| / {peak:.3g} (the largest); "
            + (f"negative (lowering the score): {', '.join(negative)}" if negative else "all non-negative"))
    kind = AttentionKind(id="attribution", label=f"{method} of {target_label}", queries="target", keys="source",
                         maps=[AttentionMap(name=method, layer=0, heads=[0], weights=weights, note=note)])
    return AttentionView(source=tokens, target=[target_label], kinds=[kind], model={"side": side})


def rollout_view(rollouts: Sequence[Tensor], tokens: Sequence[str], flow: Tensor | None = None) -> AttentionView:
    """A viewer page of rollout after each layer ((T, T) each; `layer` l = layers 1..l+1) and,
    when given, the flow through all layers (T, T): rows = positions, columns = input tokens."""
    tokens = _labels(tokens, rollouts[0].shape[-1], "tokens")
    kinds = [AttentionKind(id="rollout", label="attention rollout (layers 1..l)", queries="source", keys="source",
                           maps=[AttentionMap(name=f"rollout through layer {l + 1}", layer=l, heads=[0],
                                              weights=r.detach().float().cpu()[None])
                                 for l, r in enumerate(rollouts)])]
    if flow is not None:
        kinds.append(AttentionKind(id="flow", label="attention flow (all layers)", queries="source", keys="source",
                                   maps=[AttentionMap(name="flow", layer=len(rollouts) - 1, heads=[0],
                                                      weights=flow.detach().float().cpu()[None])]))
    return AttentionView(source=tokens, target=None, kinds=kinds)
