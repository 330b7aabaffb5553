"""What a training step communicates: tensor-parallel activations and data-parallel gradients.

Notation: B rows per data-parallel rank, T source/only length, Tt target length (encoder-decoder),
D d_model, V vocabulary, n tensor-parallel size, d data-parallel size, s bytes per value.

Tensor parallel (Megatron-LM, https://arxiv.org/abs/1909.08053, section 3), per tp rank and step:

    embedding          forward  g: all-reduce B T D                 backward  -
    self-attention     forward  g: all-reduce B T D                 backward  f: all-reduce B T D
    cross-attention    forward  g: all-reduce B Tt D                backward  f: B Tt D (queries) + B T D (memory)
    feed-forward       forward  g: all-reduce B T D                 backward  f: all-reduce B T D
    LM head + loss     forward  3 all-reduces of B T (max, sum of exp, target logit; vocab-parallel
                       cross-entropy)                               backward  f: all-reduce B T D
    shared tables      -                                            backward  all-reduce of the grads
                                                                    of Shaw relative tables

Data parallel: one all-reduce of every gradient this rank holds (its tensor-parallel shard plus
the replicated parameters) per optimisation step. "payload" is the tensor size; a ring all-reduce
sends 2 (k - 1) / k times the payload per rank over k ranks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.embeddings import Embeddings
from attnlab.models.families import family
from attnlab.models.heads import LMHead, MLMHead
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import FeedForward
from attnlab.nn.positions import T5RelativeBias


def ring_factor(k: int) -> float:
    """Bytes a ring all-reduce sends per rank, per byte of payload, over k ranks."""
    return 2 * (k - 1) / k if k > 1 else 0.0


def sharded_numel(model: nn.Module, tp: int = 1) -> tuple[int, int]:
    """(elements split by tensor parallel, elements replicated), counting tied tensors once; a
    vocabulary tp does not divide counts as padded to a multiple of tp rows (attnlab.parallel.tensor)."""
    split: set[int] = set()
    vocabulary: set[int] = set()
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            projections = [lin for lin in (m.qkv_proj, m.q_proj, m.kv_proj) if lin is not None]
            names = [p for lin in projections for p in lin.parameters()] + [m.out_proj.weight, *m.score.parameters()]
        elif isinstance(m, FeedForward):
            names = [*(m.w13 if m.gated else m.w1).parameters(), m.w2.weight]
        elif isinstance(m, Embeddings):
            names = [m.token.weight]
        elif isinstance(m, LMHead):
            names = [m.proj.weight, m.proj.bias]
        elif isinstance(m, MLMHead):
            names = [m.decoder.weight, m.decoder.bias]
        elif isinstance(m, T5RelativeBias):
            names = [m.weight]
        else:
            continue
        split.update(id(p) for p in names if p is not None)
        if isinstance(m, (Embeddings, LMHead, MLMHead)):
            vocabulary.update(id(p) for p in names if p is not None)
    unique = {id(p): p for p in model.parameters()}

    def padded(i: int, p: nn.Parameter) -> int:
        rows = p.shape[0]
        return (rows + (-rows % tp if i in vocabulary else 0)) * (p.numel() // rows)

    n_split = sum(padded(i, p) for i, p in unique.items() if i in split)
    return n_split, sum(p.numel() for i, p in unique.items() if i not in split)


def communication_cost(config: ModelConfig, *, tp: int, dp: int, seq_len: int, batch: int,
                       tgt_len: int | None = None, bytes_per_value: int = 4) -> dict[str, Any]:
    """Bytes communicated per optimisation step (one micro-batch) by one rank.

    Args:
        config: the model.
        tp, dp: tensor- and data-parallel sizes (world = tp * dp).
        seq_len: T (the source length for an encoder-decoder).
        batch: B, rows per data-parallel rank.
        tgt_len: Tt for an encoder-decoder (default seq_len).
        bytes_per_value: 4 for fp32 activations and gradients, 2 for bf16.

    Returns:
        {"rows": [{"part", "count", "forward_bytes", "backward_bytes"}] (payload bytes, all layers
        of that kind together), "tp_forward_bytes", "tp_backward_bytes", "tp_ring_bytes_per_rank",
        "dp_gradient_bytes", "dp_ring_bytes_per_rank", "params_per_rank", ...}.

    Raises:
        ValueError: sizes below 1 (tgt_len too, when given).
    """
    sizes = (("tp", tp), ("dp", dp), ("seq_len", seq_len), ("batch", batch), ("bytes_per_value", bytes_per_value),
             *((("tgt_len", tgt_len),) if tgt_len is not None else ()))  # 0 or -4 would be read as bytes
    for name, value in sizes:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    encdec = family(config).traits.has_source
    if family(config).traits.recurrent:
        raise ValueError(f"the cost note covers the Transformer archs, not arch={config.arch!r}")
    from attnlab.models import build_model
    from attnlab.parallel.tensor import check_supported

    try:
        check_supported(config, tp)
        note = None
    except ValueError as err:
        note = f"attnlab's tensor parallel would refuse this config: {err}"
    with torch.device("meta"):
        model = build_model(config)
    n_split, n_rep = sharded_numel(model, tp)
    params_per_rank = n_split // tp + n_rep
    s, B, D = bytes_per_value, batch, config.d_model
    T = seq_len
    Tt = tgt_len or seq_len
    rows = []

    def row(part: str, count: int, fwd: int, bwd: int) -> None:
        if count:
            rows.append({"part": part, "count": count, "forward_bytes": count * fwd * s if tp > 1 else 0,
                         "backward_bytes": count * bwd * s if tp > 1 else 0})

    shaw = config.position.scheme == "relative"
    table = (2 * config.position.relative_max_distance + 1) * config.resolved_head_dim
    table *= 2 if config.position.relative_values else 1
    if encdec:
        L_enc, L_dec = config.num_layers, config.resolved_decoder_layers
        row("encoder embedding", 1, B * T * D, 0)
        row("encoder self-attention", L_enc, B * T * D, B * T * D)
        row("encoder feed-forward", L_enc, B * T * D, B * T * D)
        row("decoder embedding", 1, B * Tt * D, 0)
        row("decoder self-attention", L_dec, B * Tt * D, B * Tt * D)
        row("decoder cross-attention", L_dec, B * Tt * D, B * Tt * D + B * T * D)
        row("decoder feed-forward", L_dec, B * Tt * D, B * Tt * D)
        head_T, layers = Tt, L_enc + L_dec
    else:
        row("embedding", 1, B * T * D, 0)
        row("self-attention", config.num_layers, B * T * D, B * T * D)
        row("feed-forward", config.num_layers, B * T * D, B * T * D)
        head_T, layers = T, config.num_layers
    if config.head in ("lm", "mlm"):
        row("output head + vocab-parallel loss", 1, 3 * B * head_T, B * head_T * D)
    if shaw:
        row("Shaw relative tables (gradients)", layers, 0, table)
    fwd = sum(r["forward_bytes"] for r in rows)
    bwd = sum(r["backward_bytes"] for r in rows)
    grad_bytes = params_per_rank * s if dp > 1 else 0
    return {"config": {"arch": config.arch, "d_model": D, "vocab_size": config.vocab_size,
                       "num_layers": config.num_layers},
            "tp": tp, "dp": dp, "world_size": tp * dp, "seq_len": T, "tgt_len": Tt if encdec else None,
            "batch_per_dp_rank": B, "bytes_per_value": s, "rows": rows,
            "tp_forward_bytes": fwd, "tp_backward_bytes": bwd,
            "tp_ring_bytes_per_rank": (fwd + bwd) * ring_factor(tp),
            "params_total": n_split + n_rep, "params_per_rank": params_per_rank,
            "dp_gradient_bytes": grad_bytes, "dp_ring_bytes_per_rank": grad_bytes * ring_factor(dp), "note": note}


def format_cost(cost: dict[str, Any]) -> str:
    """A plain-text table of `communication_cost`'s result."""

    def mib(x: float) -> str:
        return f"{x / 2**20:10.3f}"

    lines = [f"tp={cost['tp']} dp={cost['dp']} (world {cost['world_size']}), batch {cost['batch_per_dp_rank']} per dp rank, "
             f"seq_len {cost['seq_len']}" + (f", tgt_len {cost['tgt_len']}" if cost["tgt_len"] else "")
             + f", {cost['bytes_per_value']} bytes/value",
             f"{'part':<36}{'layers':>7}{'fwd MiB':>11}{'bwd MiB':>11}"]
    for r in cost["rows"]:
        lines.append(f"{r['part']:<36}{r['count']:>7}{mib(r['forward_bytes'])} {mib(r['backward_bytes'])}")
    lines += [f"{'tensor-parallel all-reduce payload':<43}{mib(cost['tp_forward_bytes'])} {mib(cost['tp_backward_bytes'])}",
              f"tensor parallel, ring bytes sent per rank per step: {mib(cost['tp_ring_bytes_per_rank']).strip()} MiB",
              f"parameters: {cost['params_total']:,} in all, {cost['params_per_rank']:,} per rank",
              f"data parallel, gradient all-reduce payload per step: {mib(cost['dp_gradient_bytes']).strip()} MiB "
              f"(ring: {mib(cost['dp_ring_bytes_per_rank']).strip()} MiB sent per rank)"]
    if cost.get("note"):
        lines.append("note: " + cost["note"])
    return "\n".join(lines)
