"""`plan_layout`: what one rank of a tp x pp x dp run holds in memory and sends per step, before
running it (the cost reasoning of Narayanan et al. 2021, https://arxiv.org/abs/2104.04473).

Notation: T tensor-parallel, P pipeline-parallel, D data-parallel sizes (world N = T P D); m
micro-batches of b rows (b m = the rows per data-parallel rank and step); S sequence length,
d d_model, V vocabulary; s bytes per activation value (--bytes: 4 fp32, 2 bf16). Every
tensor-parallel and data-parallel rank of one pipeline stage holds and sends the same, so the
plan has one row per stage (`stage_layers` says which layers each holds; an encoder-decoder's
layers count as one stack, the encoder's first, Tt the target length).

Memory per rank (parameters, gradients and optimizer in fp32, as attnlab trains under autocast):

    weights        4 p            p: this stage's parameters; tensor parallel splits the attention,
    gradients      4 p               feed-forward, vocabulary and per-head tables T ways
    Adam           8 p            (the two moments); FSDP: p -> p / D (each tensor's rows padded)
    activations    per micro-batch (attnlab.training.setup.memory.stage_activations, the cost model the
                   Trainer's memory check reads too: a run holds about AUTOGRAD_FACTOR times these
                   outputs, see there), as `attnlab.inspect.cost` counts a layer's outputs (q, k, v,
                   the attention weights a kernel holds, the feed-forward hidden), times b and s;
                   the per-head and hidden parts split T ways, the (b, S, d) layer outputs not;
                   embeddings b S d on the first stage (an encoder-decoder's decoder: b Tt d where
                   its first layer is), logits b S V / T (b Tt V / T) on the last.
                   Held at once: m micro-batches under GPipe (all forwards come first), P - stage
                   under 1F1B, one with P = 1 (the micro-batches run one after the other).

Bytes per step (payload: the tensor size; "ring": what a rank sends in a ring collective):

    tp   the all-reduces of `attnlab.parallel.cost` for a b-row micro-batch, for this stage's
         layers (an embedding where its stack starts, head + vocabulary-parallel loss on the
         last), times m
    pp   forward: b S d s to the next stage per micro-batch (an encoder-decoder's stages inside
         the decoder send the memory beside the decoder's states: b (S + Tt) d s); backward: the
         gradient of what the stage received, to the previous one; once per step, the gradients
         of the tensors several stages hold (4 bytes each) summed over their holders: the tied
         embedding (first and last stage; an encoder-decoder's shared one also where the decoder
         starts), the T5 bias table (every stage of its stack)
    dp   DDP: one all-reduce of the stage's gradients (4 p) per step; ring 2 (D-1)/D of it.
         FSDP: per micro-batch, an all-gather of the weights forward and again backward, a
         reduce-scatter of the gradients (Zhao et al. 2023): 3 (D-1)/D of the whole stage's
         4 p sent per rank

    bubble (GPipe and 1F1B alike): (P - 1) / (m + P - 1) of each stage's step is idle

Not counted: buffers and workspace (the allocator's, the kernels'), FSDP's whole copy of the layer
it is running, DDP's gradient buckets, and the extra all-reduces of a DDP loop that does not skip
the synchronisation between micro-batches (`Trainer` without pp all-reduces after each of its
grad_accum micro-batches: dp bytes times grad_accum).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.embeddings import Embeddings
from attnlab.models.families import family
from attnlab.parallel.cost import communication_cost, ring_factor, sharded_numel
from attnlab.parallel.stages import check_pipeline_supported, shared_parameters, split_stages, stage_layers
from attnlab.training.setup.memory import ADAM_BYTES, PARAM_BYTES, layer_activations, layer_keys, stage_activations


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_layout(config: ModelConfig, nproc: int, tp: int, pp: int, dp: int | None, micro_batches: int,
                  batch: int, fsdp: bool) -> int:
    """Validate the layout; return dp (what nproc leaves when not given)."""
    for name, value in (("nproc", nproc), ("tp", tp), ("pp", pp), ("micro_batches", micro_batches), ("batch", batch)):
        _positive(name, value)
    if dp is None:
        if nproc % (tp * pp):
            raise ValueError(f"tp={tp} x pp={pp} = {tp * pp} does not divide nproc={nproc}; choose tp and pp whose "
                             f"product divides it")
        dp = nproc // (tp * pp)
    _positive("dp", dp)
    if tp * pp * dp != nproc:
        raise ValueError(f"the layout tp={tp} x pp={pp} x dp={dp} = {tp * pp * dp} processes does not match "
                         f"nproc={nproc}; choose sizes whose product is {nproc}")
    if batch % micro_batches:
        raise ValueError(f"batch={batch} (rows per data-parallel rank) is not divisible by micro_batches="
                         f"{micro_batches}")
    if family(config).traits.recurrent:
        raise ValueError("the plan covers the Transformer archs (decoder, encoder, encoder_decoder), not "
                         f"arch={config.arch!r}")
    if tp > 1:
        from attnlab.parallel.tensor import check_supported

        check_supported(config, tp)
    check_pipeline_supported(config, pp)
    if fsdp and tp > 1:
        raise ValueError(f"fsdp with tp={tp} is not supported: FSDP shards a model that tensor parallel has not "
                         "split; use DDP on the data axis (drop --fsdp) or tp=1")
    if fsdp and pp > 1:
        raise ValueError(f"fsdp with pp={pp} is not supported: the pipeline all-reduces its gradients over the "
                         "data axis (DDP); drop --fsdp or use pp=1")
    return dp


def _fsdp_numel(module: nn.Module, dp: int) -> int:
    """Elements a rank holds when FSDP shards each tensor's first dimension over dp (padded)."""
    unique = {id(p): p for p in module.parameters()}.values()
    return sum(math.ceil(p.shape[0] / dp) * (p.numel() // p.shape[0]) if p.dim() else p.numel() for p in unique)


def plan_layout(config: ModelConfig, *, nproc: int, tp: int = 1, pp: int = 1, dp: int | None = None,
                micro_batches: int = 1, seq_len: int = 512, batch: int = 8, tgt_len: int | None = None,
                bytes_per_value: int = 4, fsdp: bool = False) -> dict[str, Any]:
    """Memory per rank and bytes per step of the layout tp x pp x dp = nproc (see the module notes).

    Args:
        config: the model.
        nproc: N, the number of processes.
        tp: tensor-parallel size.
        pp: pipeline-parallel size.
        dp: data-parallel size; default N / (tp pp).
        micro_batches: m, the pipeline's micro-batches per step.
        seq_len: S (the source length of an encoder-decoder).
        batch: rows per data-parallel rank and step (m micro-batches of batch / m rows).
        tgt_len: the target length of an encoder-decoder (default seq_len).
        bytes_per_value: bytes of an activation value and of a message: 4 fp32, 2 bf16.
        fsdp: the data axis shards weights, gradients and Adam states (FSDP) instead of DDP.

    Returns:
        {"layout": {...}, "config": {...}, "params_total", "bubble_fraction", "stages": [one dict
        per pipeline stage: "layers", "params_per_rank", "weights_bytes", "gradients_bytes",
        "optimizer_bytes", "activation_bytes_per_micro_batch", "activation_bytes_gpipe",
        "activation_bytes_1f1b", "total_bytes", "tp_forward_bytes", "tp_backward_bytes",
        "tp_ring_bytes", "pp_send_forward_bytes", "pp_send_backward_bytes",
        "pp_shared_gradient_bytes", "pp_shared_ring_bytes", "dp_bytes", "dp_ring_bytes"}],
        "max_total_bytes"}.

    Raises:
        ValueError: sizes that are not positive or whose product is not nproc; a batch that the
            micro-batches do not divide; a config tensor or pipeline parallel cannot split (the
            message names the field and the axis); FSDP with tp or pp.
    """
    dp = _check_layout(config, nproc, tp, pp, dp, micro_batches, batch, fsdp)
    for name, value in (("seq_len", seq_len), ("bytes_per_value", bytes_per_value)):
        _positive(name, value)
    if tgt_len is not None:
        _positive("tgt_len", tgt_len)
    from attnlab.models import build_model

    with torch.device("meta"):
        model = build_model(config)
    encdec = family(config).traits.has_source
    S, Tt = seq_len, (tgt_len or seq_len) if encdec else seq_len
    D, V, s = config.d_model, config.vocab_size, bytes_per_value
    m, b = micro_batches, batch // micro_batches
    stages: list[nn.Module] = split_stages(model, pp) if pp > 1 else [model]
    stack = layer_keys(config)  # every layer as (stack, index): the one stack the stages cut
    cuts = stage_layers(len(stack), pp)
    spans = [stack[r.start:r.stop] for r in cuts]
    layer_act = layer_activations(config, S, Tt, tp)
    tp_cost = communication_cost(config, tp=tp, dp=1, seq_len=S, batch=b, tgt_len=tgt_len, bytes_per_value=s)
    shared = shared_parameters(model, stages) if pp > 1 else []
    vocabulary = {id(m.token.weight) for m in model.modules() if isinstance(m, Embeddings)}
    rows = []
    for index, (stage, span) in enumerate(zip(stages, spans)):
        first, last = index == 0, index == pp - 1
        split, replicated = sharded_numel(stage, tp)
        full_params = split // tp + replicated
        params = _fsdp_numel(stage, dp) if fsdp else full_params
        act = b * stage_activations(config, span, layer_act, S, Tt, tp=tp, last=last) * s
        gpipe = act * (m if pp > 1 else 1)
        one_f_one_b = act * min(m, pp - index)
        fwd, bwd = _tp_stage_bytes(tp_cost, span, last, pp)
        # what a stage sends on: (b, S, D) hidden states or memory; within the decoder, its (b, Tt, D) too
        sent = m * b * D * s * (S + (Tt if span[-1][0] == "decoder." else 0))
        received = m * b * D * s * (S + (Tt if span[0][0] == "decoder." and span[0][1] > 0 else 0))
        grads = PARAM_BYTES * full_params
        # the tensors several stages hold are all split by tensor parallel (vocabulary rows, T5 bias heads)
        mine = [(_per_rank(p, tp, vocabulary) * PARAM_BYTES, len(holders)) for _, p, holders in shared
                if index in holders]
        if fsdp:
            dp_payload = m * 3 * grads if dp > 1 else 0  # 2 all-gathers + 1 reduce-scatter per micro-batch
            dp_ring = dp_payload * (dp - 1) / dp
        else:
            dp_payload = grads if dp > 1 else 0
            dp_ring = dp_payload * ring_factor(dp)
        rows.append({
            "stage": index, "layers": [cuts[index].start, cuts[index].stop],
            "params_per_rank": params, "weights_bytes": PARAM_BYTES * params, "gradients_bytes": PARAM_BYTES * params,
            "optimizer_bytes": ADAM_BYTES * params, "activation_bytes_per_micro_batch": act,
            "activation_bytes_gpipe": gpipe, "activation_bytes_1f1b": one_f_one_b,
            "total_bytes": 2 * PARAM_BYTES * params + ADAM_BYTES * params + gpipe,
            "tp_forward_bytes": m * fwd, "tp_backward_bytes": m * bwd,
            "tp_ring_bytes": m * (fwd + bwd) * ring_factor(tp),
            "pp_send_forward_bytes": 0 if last else sent, "pp_send_backward_bytes": 0 if first else received,
            "pp_shared_gradient_bytes": sum(n for n, _ in mine),
            "pp_shared_ring_bytes": sum(n * ring_factor(k) for n, k in mine),
            "dp_bytes": dp_payload, "dp_ring_bytes": dp_ring,
        })
    return {
        "layout": {"nproc": nproc, "tp": tp, "pp": pp, "dp": dp, "fsdp": fsdp, "micro_batches": m,
                   "micro_batch_rows": b, "batch_per_dp_rank": batch, "global_batch": batch * dp, "seq_len": S,
                   "tgt_len": Tt if encdec else None, "bytes_per_value": s},
        "config": {"arch": config.arch, "d_model": D, "vocab_size": V, "num_layers": config.num_layers,
                   "num_heads": config.num_heads, "d_ff": config.d_ff},
        "params_total": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "bubble_fraction": (pp - 1) / (m + pp - 1),
        "shared_across_stages": [name for name, _, _ in shared],
        "stages": rows,
        "max_total_bytes": max(r["total_bytes"] for r in rows),
    }


def _per_rank(p: nn.Parameter, tp: int, vocabulary: set[int]) -> int:
    """Elements of p on one tensor-parallel rank: a (padded) vocabulary's rows, or 1/tp of a per-head table."""
    if id(p) in vocabulary:
        return -(-p.shape[0] // tp) * (p.numel() // p.shape[0])
    return p.numel() // tp


def _tp_stage_bytes(cost: dict[str, Any], span: list[tuple[str, int]], last: bool, pp: int) -> tuple[int, int]:
    """(forward, backward) tensor-parallel payload of one micro-batch on a stage holding the
    layers `span` ((stack, index) pairs; a stack's embedding where it holds its layer 0, the head
    when last)."""
    if pp == 1:
        return cost["tp_forward_bytes"], cost["tp_backward_bytes"]
    fwd = bwd = 0
    for row in cost["rows"]:
        stack = next((s for s in ("encoder.", "decoder.") if row["part"].startswith(s[:-1] + " ")), "")
        if "embedding" in row["part"]:
            share = 1 if (stack, 0) in span else 0
        elif "head" in row["part"]:
            share = 1 if last else 0
        else:  # per layer: this stage's share of the count (the layers of the row's stack; Shaw's tables: all)
            n_layers = sum(1 for s, _ in span if s == stack or row["part"].startswith("Shaw"))
            fwd += row["forward_bytes"] // row["count"] * n_layers
            bwd += row["backward_bytes"] // row["count"] * n_layers
            continue
        fwd += share * row["forward_bytes"]
        bwd += share * row["backward_bytes"]
    return fwd, bwd


def format_plan(plan: dict[str, Any]) -> str:
    """A plain-text report of `plan_layout`'s result: the layout, memory and bytes per stage."""
    lay = plan["layout"]

    def mib(x: float) -> str:
        return f"{x / 2**20:.2f}"

    P, m = lay["pp"], lay["micro_batches"]
    head = (f"layout: tp={lay['tp']} x pp={P} x dp={lay['dp']}{' (FSDP)' if lay['fsdp'] else ''} = "
            f"{lay['nproc']} processes; {m} micro-batch{'es' if m > 1 else ''} of {lay['micro_batch_rows']} rows "
            f"({lay['batch_per_dp_rank']} per data-parallel rank, {lay['global_batch']} per step), seq_len "
            f"{lay['seq_len']}" + (f", tgt_len {lay['tgt_len']}" if lay["tgt_len"] else "")
            + f", {lay['bytes_per_value']} bytes per activation")
    lines = [head, f"parameters: {plan['params_total']:,} in all",
             f"pipeline bubble (GPipe, 1F1B): (P-1)/(m+P-1) = {P - 1}/{m + P - 1} = {plan['bubble_fraction']:.3f}",
             "", "memory per rank, MiB (weights, gradients fp32; Adam 2 fp32 moments; activations held at once)",
             f"{'stage':<6}{'layers':<10}{'params/rank':>14}{'weights':>10}{'grads':>10}{'Adam':>10}"
             f"{'act/mb':>10}{'act GPipe':>11}{'act 1F1B':>10}{'total':>10}"]
    for r in plan["stages"]:
        layers = f"{r['layers'][0]}-{r['layers'][1] - 1}"
        lines.append(f"{r['stage']:<6}{layers:<10}{r['params_per_rank']:>14,}{mib(r['weights_bytes']):>10}"
                     f"{mib(r['gradients_bytes']):>10}{mib(r['optimizer_bytes']):>10}"
                     f"{mib(r['activation_bytes_per_micro_batch']):>10}{mib(r['activation_bytes_gpipe']):>11}"
                     f"{mib(r['activation_bytes_1f1b']):>10}{mib(r['total_bytes']):>10}")
    lines += ["", "bytes per rank and step, MiB (payload; ring = sent by one rank in a ring collective)",
              f"{'stage':<6}{'tp fwd':>9}{'tp bwd':>9}{'tp ring':>9}{'pp fwd':>9}{'pp bwd':>9}{'pp shared':>10}"
              f"{'dp':>9}{'dp ring':>9}"]
    for r in plan["stages"]:
        lines.append(f"{r['stage']:<6}{mib(r['tp_forward_bytes']):>9}{mib(r['tp_backward_bytes']):>9}"
                     f"{mib(r['tp_ring_bytes']):>9}{mib(r['pp_send_forward_bytes']):>9}"
                     f"{mib(r['pp_send_backward_bytes']):>9}{mib(r['pp_shared_gradient_bytes']):>10}"
                     f"{mib(r['dp_bytes']):>9}{mib(r['dp_ring_bytes']):>9}")
    if plan["shared_across_stages"]:
        lines.append("pp shared: gradients summed over the stages that hold "
                     + ", ".join(plan["shared_across_stages"]))
    lines.append(f"largest rank: {mib(plan['max_total_bytes'])} MiB")
    return "\n".join(lines)
