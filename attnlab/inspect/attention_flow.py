"""Attention rollout and attention flow (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928):
how much of each input token reaches each output position through a stack of self-attention
layers, the residual connections counted.

Notation: L layers, B batch, H heads, T tokens; A_l (B, T, T) the head-averaged attention of
layer l (rows: queries, columns: keys; layer 1 reads the embeddings).

Each layer mixes its input through attention and passes it on through the residual, so the
layer's "raw attention" is taken as

    Â_l = rownorm(0.5 * A_l + 0.5 * I)

Rollout composes them:      R = Â_L Â_{L-1} ... Â_1       (B, T, T); R[i, j]: output i from input j
Flow treats the layers as a graph: node (l, t) is position t after layer l (l = 0: the input),
an edge (l-1, j) -> (l, i) has capacity Â_l[i, j], and F[i, j] is the maximum flow from input
node (0, j) to output node (L, i); each row is then normalised to sum to 1 (as the paper's code
does). Rollout multiplies along paths and adds them; flow takes the bottleneck of each path and
cannot exceed a token's share at any single layer.

    maps = self_attention_maps(model, ids)        # L x (B, H, T, T), first layer first
    R = attention_rollout(maps)                     # (B, T, T)
    F = attention_flow(maps)                        # (B, T, T)
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import torch
from torch import Tensor, nn

EPS = 1e-12  # capacities below this count as saturated


def _raw_attention(maps: Sequence[Tensor], residual: float) -> list[Tensor]:
    """The per-layer Â_l (B, T, T), float64, from maps (B, H, T, T) or (B, T, T)."""
    if isinstance(maps, Tensor) or len(maps) == 0:
        raise ValueError("maps must be a non-empty list of per-layer attention maps, first layer first")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be in [0, 1] (the identity's share), got {residual!r}")
    out = []
    for l, m in enumerate(maps):
        m = torch.as_tensor(m).detach().double().cpu()  # small (T, T) matrices; flow runs on the CPU anyway
        if m.dim() == 4:
            m = m.mean(1)
        if m.dim() != 3 or m.shape[-1] != m.shape[-2]:
            raise ValueError(f"maps[{l}] must be (B, H, T, T) or (B, T, T) self-attention, got {tuple(m.shape)}")
        if l and m.shape != out[0].shape:
            raise ValueError(f"maps[{l}] has shape {tuple(m.shape)}, maps[0] {tuple(out[0].shape)}")
        a = (1 - residual) * m + residual * torch.eye(m.shape[-1], dtype=m.dtype)
        out.append(a / a.sum(-1, keepdim=True).clamp_min(EPS))
    return out


def attention_rollout(maps: Sequence[Tensor], residual: float = 0.5) -> Tensor:
    """R = Â_L ... Â_1: (B, T, T) on the CPU, rows (output positions) summing to 1.

    Args:
        maps: per layer (B, H, T, T) (averaged over heads here) or (B, T, T), first layer first.
        residual: the identity's share in Â (0.5 in the paper; 0: plain products of attention).

    Raises:
        ValueError: no maps, non-square or mismatched shapes, residual outside [0, 1].
    """
    layers = _raw_attention(maps, residual)
    r = layers[0]
    for a in layers[1:]:
        r = a @ r
    return r.float()


def max_flow(capacity: Tensor, source: int, sink: int) -> float:
    """The value of a maximum flow from `source` to `sink` (Dinic's algorithm: breadth-first
    levels, then blocking flows by depth-first search), `capacity` (N, N) >= 0 with
    capacity[u, v] on the edge u -> v."""
    n = capacity.shape[0]
    residual = capacity.double().tolist()
    neighbours = [[v for v in range(n) if residual[u][v] > 0 or residual[v][u] > 0] for u in range(n)]
    total = 0.0
    while True:
        level = [-1] * n
        level[source] = 0
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for v in neighbours[u]:
                if level[v] < 0 and residual[u][v] > EPS:
                    level[v] = level[u] + 1
                    queue.append(v)
        if level[sink] < 0:
            return total
        nxt = [0] * n  # next neighbour to try per node (dead ends are not revisited in a phase)

        def push(u: int, limit: float) -> float:
            if u == sink:
                return limit
            while nxt[u] < len(neighbours[u]):
                v = neighbours[u][nxt[u]]
                if level[v] == level[u] + 1 and residual[u][v] > EPS:
                    sent = push(v, min(limit, residual[u][v]))
                    if sent > 0:
                        residual[u][v] -= sent
                        residual[v][u] += sent
                        return sent
                nxt[u] += 1
            return 0.0

        while (sent := push(source, float("inf"))) > 0:
            total += sent


def flow_graph(layers: Sequence[Tensor]) -> Tensor:
    """The capacity matrix ((L+1) T, (L+1) T) of one example's layered graph: node l * T + t is
    position t after layer l; edge (l-1, j) -> (l, i) has capacity Â_l[i, j]."""
    L, T = len(layers), layers[0].shape[-1]
    cap = torch.zeros((L + 1) * T, (L + 1) * T, dtype=torch.float64)
    for l, a in enumerate(layers, start=1):
        cap[(l - 1) * T:l * T, l * T:(l + 1) * T] = a.T  # row = the key below, column = the query above
    return cap


def attention_flow(maps: Sequence[Tensor], residual: float = 0.5, normalize: bool = True) -> Tensor:
    """F[b, i, j]: the maximum flow from input token j to output position i: (B, T, T).

    Args:
        maps, residual: as `attention_rollout`.
        normalize: divide each row by its sum (the paper's presentation); False keeps the raw
            flow values, each at most 1.

    Cost: B T^2 max-flow problems on (L + 1) T nodes, in Python: meant for sentences, not pages
    (one CPU core shared with other work: 16 tokens through 6 layers 1.2 s, 32 tokens through 4
    layers 13 s, through 12 layers 100 s; rollout takes milliseconds).

    Raises:
        ValueError: as `attention_rollout`.
    """
    layers = _raw_attention(maps, residual)
    B, T = layers[0].shape[0], layers[0].shape[-1]
    L = len(layers)
    out = torch.zeros(B, T, T, dtype=torch.float64)
    for b in range(B):
        cap = flow_graph([a[b] for a in layers])
        for i in range(T):
            for j in range(T):
                out[b, i, j] = max_flow(cap, j, L * T + i)
    if normalize:
        out = out / out.sum(-1, keepdim=True).clamp_min(EPS)
    return out.float()


def self_attention_maps(model: nn.Module, *inputs: Tensor, stack: str | None = None, **kwargs) -> list[Tensor]:
    """The self-attention weights (B, H, T, T) of each layer of one Transformer stack, first layer
    first, from one forward pass `model(*inputs, **kwargs)` without gradients, in eval mode.

    Args:
        stack: for an encoder-decoder, `encoder` (the source's rollout; default) or `decoder`
            (the target's self-attention: cross-attention is not followed); None elsewhere.

    Raises:
        ValueError: a model with no Transformer stack (the recurrent encoder-decoder) or an
            unknown stack.
    """
    from attnlab.inspect.attention_maps import attention_maps
    from attnlab.inspect.attribution import _eval
    from attnlab.models.families import family

    own = family(model.config)
    stacks = {prefix.rstrip(".") or "model": (prefix, n) for prefix, n in own.stacks(model.config)}
    if not stacks:
        raise ValueError(f"{own.description} has no stack of self-attention layers to roll out")
    if stack is None:
        prefix, n = next(iter(stacks.values()))
    elif stack in stacks and len(stacks) > 1:
        prefix, n = stacks[stack]
    else:
        raise ValueError(f"stack={stack!r}: " + (f"choose from {', '.join(stacks)}" if len(stacks) > 1
                                                  else "this model has one stack: leave stack out"))
    names = [f"{prefix}layers.{i}.self_attn" for i in range(n)]
    with _eval(model):
        maps = attention_maps(model, *inputs, names=names, **kwargs)
    return [maps[name] for name in names]
