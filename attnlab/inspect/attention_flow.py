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
    """The value of a maximum flow from `source` to `sink`, `capacity` (N, N) >= 0 with
    capacity[u, v] on the edge u -> v (Dinic's algorithm, `_dinic`)."""
    residual = capacity.double().tolist()
    n = len(residual)
    neighbours = [[v for v in range(n) if residual[u][v] > 0 or residual[v][u] > 0] for u in range(n)]
    return _dinic(residual, neighbours, source, sink)


def _dinic(residual: list[list[float]], neighbours: list[list[int]], source: int, sink: int) -> float:
    """Dinic's algorithm on `residual` (changed in place): breadth-first levels from the source,
    then a blocking flow along the edges that climb one level, each node sending on what it
    receives to as many next-level neighbours as it takes; repeated until the sink is cut off."""
    n = len(residual)
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
        nxt = [0] * n  # next neighbour to try per node: a blocked edge is not tried again this phase

        def push(u: int, limit: float) -> float:
            if u == sink:
                return limit
            sent = 0.0
            edges, out, up = neighbours[u], residual[u], level[u] + 1
            while nxt[u] < len(edges):
                v = edges[nxt[u]]
                if level[v] == up and out[v] > EPS:
                    got = push(v, min(limit - sent, out[v]))
                    if got > 0:
                        out[v] -= got
                        residual[v][u] += got
                        sent += got
                        if limit - sent <= EPS:
                            return sent  # this edge may carry more next time: keep it
                nxt[u] += 1
            return sent

        while (sent := push(source, float("inf"))) > EPS:
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
    (one CPU core shared with other work: 16 tokens through 6 layers 0.6 s, 32 tokens through 4
    layers 4 s, through 12 layers 20 s; rollout takes milliseconds).

    Raises:
        ValueError: as `attention_rollout`.
    """
    layers = _raw_attention(maps, residual)
    B, T = layers[0].shape[0], layers[0].shape[-1]
    out = torch.zeros(B, T, T, dtype=torch.float64)
    for b in range(B):
        for i, j, value in _pair_flows([a[b] for a in layers]):
            out[b, i, j] = value
    if normalize:
        out = out / out.sum(-1, keepdim=True).clamp_min(EPS)
    return out.float()


def _pair_flows(layers: Sequence[Tensor]):
    """(i, j, max flow from input j to output i) for one example's Â_1..Â_L (each (T, T)).

    Only input node j can send and only output node i can receive, so the other nodes of the
    first and last columns are left out: the graph is the source, the (L - 1) T hidden nodes (node
    1 + (l - 1) T + t: position t after layer l) and the sink, built once and copied per pair.
    """
    L, T = len(layers), layers[0].shape[-1]
    a = [m.tolist() for m in layers]  # a[l][query][key]
    if L == 1:  # one edge, input j -> output i
        for i in range(T):
            for j in range(T):
                yield i, j, a[0][i][j]
        return
    n = (L - 1) * T + 2
    sink = n - 1
    hidden = [[0.0] * n for _ in range(n)]
    links: list[set[int]] = [set() for _ in range(n)]
    for l in range(1, L - 1):  # Â_{l+1}: after layer l -> after layer l + 1
        for q in range(T):
            for k in range(T):
                if a[l][q][k] > 0:
                    u, v = 1 + (l - 1) * T + k, 1 + l * T + q
                    hidden[u][v] = a[l][q][k]
                    links[u].add(v)
                    links[v].add(u)
    first, last = 1, 1 + (L - 2) * T  # the hidden nodes after layer 1 and after layer L - 1
    for i in range(T):
        for j in range(T):
            residual = [row[:] for row in hidden]
            neighbours = [set(s) for s in links]
            for t in range(T):
                if a[0][t][j] > 0:  # input j -> position t after layer 1
                    residual[0][first + t] = a[0][t][j]
                    neighbours[0].add(first + t)
                    neighbours[first + t].add(0)
                if a[L - 1][i][t] > 0:  # position t after layer L - 1 -> output i
                    residual[last + t][sink] = a[L - 1][i][t]
                    neighbours[last + t].add(sink)
                    neighbours[sink].add(last + t)
            yield i, j, _dinic(residual, [sorted(s) for s in neighbours], 0, sink)


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
