"""Functions run on each rank by tests/parallel/test_pipeline.py (module level: spawn pickles them
by name). Every rank builds the full model too and checks its own stage against it."""

from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F

import attnlab
from attnlab.parallel.data import shard_batch
from attnlab.parallel.pipeline import Pipeline
from attnlab.parallel.plan import plan_layout
from attnlab.parallel.tensor import local_part, tensor_parallel
from tests.parallel.workers import VOCAB, tiny_config

# name -> (arch, config overrides, micro-batches, schedule, batch kind: `variant_batch`)
VARIANTS = {
    "decoder_tied_gpipe": ("decoder", {}, 2, "gpipe", "lm"),
    "decoder_3_layers_1f1b": ("decoder", {"num_layers": 3, "tie_embeddings": False, "position": {"scheme": "rotary"}},
                              4, "1f1b", "lm"),
    "t5_bias_every_stage": ("decoder", {"position": {"scheme": "t5_bias"}, "activation": "swiglu"}, 2, "gpipe", "lm"),
    "encoder_mlm_post_norm": ("encoder", {"norm_placement": "post", "embedding_norm": True,
                                          "position": {"scheme": "learned"}}, 2, "gpipe", "mlm"),
    # masks passed to every stage: a prefix LM's bidirectional prefixes, padded rows of a decoder and an encoder
    "prefix_lm_gpipe": ("decoder", {"num_layers": 3, "position": {"scheme": "alibi"}}, 2, "gpipe", "prefix"),
    "prefix_lm_1f1b": ("decoder", {"position": {"scheme": "t5_bias"}}, 4, "1f1b", "prefix"),
    "padded_decoder_1f1b": ("decoder", {"position": {"scheme": "learned"}}, 2, "1f1b", "padded"),
    "padded_encoder_gpipe": ("encoder", {"position": {"scheme": "rotary"}}, 2, "gpipe", "padded_mlm"),
    # encoder-decoders: source and target rows of different lengths; cut between the stacks (stage 1
    # receives the memory), or inside the decoder (stage 1 receives the decoder's hidden states and the memory)
    "seq2seq_tied_gpipe": ("encoder_decoder", {"tie_embeddings": True, "share_embeddings": True}, 2, "gpipe", "seq2seq"),
    "seq2seq_tied_1f1b": ("encoder_decoder", {"tie_embeddings": True, "share_embeddings": True}, 4, "1f1b", "seq2seq"),
    "seq2seq_t5_cut_in_decoder_gpipe": ("encoder_decoder", {"num_layers": 1, "num_decoder_layers": 3,
                                                            "position": {"scheme": "t5_bias"}, "activation": "swiglu"},
                                        2, "gpipe", "seq2seq"),
    "seq2seq_untied_cut_in_decoder_1f1b": ("encoder_decoder", {"num_layers": 1, "num_decoder_layers": 2,
                                                               "norm_placement": "post", "tie_embeddings": False,
                                                               "share_embeddings": False}, 2, "1f1b", "seq2seq"),
}
ROWS, LENGTH = 4, 7


def batch(seed: int, mlm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids and targets; some targets ignored (most of them for an MLM)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=g)
    labels = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=g)
    ignored = torch.rand(ROWS, LENGTH, generator=g) < (0.8 if mlm else 0.2)
    return ids, labels.masked_fill(ignored, -100)


def _lengths_mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()  # (B, width), 1 on real tokens


def variant_batch(kind: str, seed: int, source: int = 6, target: int = 5) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(first stage's ids, targets, keyword inputs) of a batch of `kind`: lm, mlm, prefix (prefix
    lengths; targets inside the prefixes too, so that a stage that lost the prefix mask changes
    the loss), padded (rows of 7, 5, 3, 6 real tokens, left-padded: positions count real tokens
    only), padded_mlm (the same right-padded; pad id 0 and no loss on padding), seq2seq (sources
    of `source` - 0..3 tokens, targets of `target` - 0..3, right-padded)."""
    if kind in ("lm", "mlm"):
        return (*batch(seed, mlm=kind == "mlm"), {})
    ids, labels = batch(seed, mlm=kind == "padded_mlm")
    g = torch.Generator().manual_seed(seed + 1000)
    if kind == "prefix":
        return ids, labels, {"prefix_lengths": torch.randint(2, LENGTH, (ROWS,), generator=g)}
    if kind in ("padded", "padded_mlm"):
        mask = _lengths_mask([7, 5, 3, 6], LENGTH)
        mask = mask.flip(1) if kind == "padded" else mask
        return ids * mask, labels.masked_fill(mask == 0, -100), {"attention_mask": mask}
    if kind == "seq2seq":
        src_mask = _lengths_mask([source, source - 2, source - 3, source - 1], source)
        tgt_mask = _lengths_mask([target - 2, target, target - 3, target - 1], target)
        src = torch.randint(1, VOCAB, (ROWS, source), generator=g) * src_mask
        tgt = torch.randint(1, VOCAB, (ROWS, target), generator=g) * tgt_mask
        labels = torch.randint(0, VOCAB, (ROWS, target), generator=g).masked_fill(tgt_mask == 0, -100)
        return src, labels, {"src_mask": src_mask, "tgt_ids": tgt, "tgt_mask": tgt_mask}
    raise ValueError(f"unknown batch kind {kind!r}")


def full_loss(model, ids, labels, **inputs) -> torch.Tensor:
    """The one-process loss of a batch: the model's own forward, mean cross-entropy over the targets."""
    if model.config.arch == "encoder_decoder":
        logits = model(ids, inputs["tgt_ids"], inputs.get("src_mask"), inputs.get("tgt_mask"))
    else:
        logits = model(ids, inputs.get("attention_mask"), **{k: v for k, v in inputs.items() if k != "attention_mask"})
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


def _run(results: dict, name: str, fn, *args) -> None:
    try:
        fn(*args)
        results[name] = "ok"
    except Exception:  # noqa: BLE001 -- reported to the test, which fails on it
        results[name] = traceback.format_exc()


def _models(arch: str, overrides: dict, micro_batches: int, schedule: str, group=None):
    cfg = tiny_config(arch, **overrides)
    torch.manual_seed(0)
    full = attnlab.build_model(cfg)
    torch.manual_seed(0)
    pipe = Pipeline(attnlab.build_model(cfg), group, micro_batches=micro_batches, schedule=schedule)
    return full, pipe


def _equivalence(ctx, arch: str, overrides: dict, micro_batches: int, schedule: str, kind: str) -> None:
    """The step's loss and every gradient of this rank's stage equal the one-process run's."""
    full, pipe = _models(arch, overrides, micro_batches, schedule, ctx.pp_group)
    ids, labels, inputs = variant_batch(kind, 1)
    loss = pipe.step(ids, labels, **inputs)
    reference = full_loss(full, ids, labels, **inputs)
    reference.backward()
    torch.testing.assert_close(torch.tensor(loss, dtype=torch.float64), reference.detach().double(), atol=1e-5, rtol=0)
    full_params = dict(full.named_parameters(remove_duplicate=False))  # a tied tensor under both names
    checked = 0
    for name, p in pipe.stage.named_parameters():
        torch.testing.assert_close(p.grad, full_params[name].grad, atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")
        checked += 1
    if checked == 0:
        raise AssertionError("this stage holds no parameters")


def _training(ctx, steps: int) -> None:
    """`steps` Adam steps: this stage's parameters and the gathered state equal the one-process model's."""
    full, pipe = _models("decoder", {"num_layers": 3}, 2, "gpipe", ctx.pp_group)
    opt_full = torch.optim.Adam(full.parameters(), lr=1e-3)
    opt_pipe = torch.optim.Adam(pipe.parameters(), lr=1e-3)
    for step in range(steps):
        ids, labels = batch(10 + step)
        opt_full.zero_grad()
        full_loss(full, ids, labels).backward()
        opt_full.step()
        opt_pipe.zero_grad()
        pipe.step(ids, labels)
        opt_pipe.step()
    gathered = pipe.full_state_dict()
    reference = full.state_dict()
    if set(gathered) != set(reference):
        raise AssertionError(f"gathered names differ: {sorted(set(gathered) ^ set(reference))}")
    for name, t in reference.items():
        torch.testing.assert_close(gathered[name], t, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def _training_seq2seq(ctx, steps: int) -> None:
    """`steps` Adam steps of an encoder-decoder on padded batches whose widths change from step to
    step (narrower than the first: padded to it; wider: the stages agree on new shapes), 1F1B:
    every step's loss equals the one-process model's (within 1e-5), and so does the gathered state,
    within 1e-4: Adam divides each gradient by its RMS, and the gradient of the keys' bias, zero
    but for rounding (a softmax does not see it), moves by a rounding-level difference as much as any."""
    full, pipe = _models("encoder_decoder", {"position": {"scheme": "t5_bias"}}, 2, "1f1b", ctx.pp_group)
    opt_full = torch.optim.Adam(full.parameters(), lr=1e-3)
    opt_pipe = torch.optim.Adam(pipe.parameters(), lr=1e-3)
    widths = [(6, 5), (4, 3), (7, 6), (5, 6)]
    losses = []  # (pipeline, one process): compared after the loop, so that every rank takes every step
    for step in range(steps):
        source, target = widths[step % len(widths)]
        ids, labels, inputs = variant_batch("seq2seq", 10 + step, source, target)
        opt_full.zero_grad()
        reference = full_loss(full, ids, labels, **inputs)
        reference.backward()
        opt_full.step()
        opt_pipe.zero_grad()
        losses.append((pipe.step(ids, labels, **inputs), float(reference.detach())))
        opt_pipe.step()
    gathered = pipe.full_state_dict()
    torch.testing.assert_close(torch.tensor(losses, dtype=torch.float64)[:, 0], torch.tensor(losses)[:, 1].double(),
                               atol=1e-5, rtol=0, msg=lambda m: f"losses (pipeline, one process) {losses}: {m}")
    reference = full.state_dict()
    if set(gathered) != set(reference):
        raise AssertionError(f"gathered names differ: {sorted(set(gathered) ^ set(reference))}")
    for name, t in gathered.items():
        torch.testing.assert_close(t, reference[name], atol=1e-4, rtol=0, msg=lambda m: f"{name}: {m}")


def _forward_only(ctx) -> None:
    """Evaluation through the stages (no schedule): the last stage's logits equal the model's, for a
    padded encoder-decoder batch and a prefix LM's (compared after both ran: every rank takes both)."""
    compared = []
    for arch, overrides, kind in (("encoder_decoder", {"num_layers": 1, "num_decoder_layers": 3}, "seq2seq"),
                                  ("decoder", {}, "prefix")):
        full, pipe = _models(arch, overrides, 1, "gpipe", ctx.pp_group)
        ids, _, inputs = variant_batch(kind, 5)
        out = pipe.forward_only(ids, **inputs)
        if pipe.stage.is_last:
            if arch == "encoder_decoder":
                want = full(ids, inputs["tgt_ids"], inputs["src_mask"], inputs["tgt_mask"])
            else:
                want = full(ids, **inputs)
            compared.append((arch, out, want))
        elif out is not None:
            raise AssertionError("a stage before the last returned an output")
    for arch, out, want in compared:
        torch.testing.assert_close(out, want, atol=1e-5, rtol=0, msg=lambda m: f"{arch}: {m}")


def _measured(ctx) -> dict:
    """Bytes this stage sends to its neighbours in one GPipe step (counted on the ops torch's
    schedule posts), its parameter count, and the plan's prediction for them."""
    micro_batches = 2
    full, pipe = _models("decoder", {}, micro_batches, "gpipe", ctx.pp_group)
    stage = pipe._schedule._stage
    sent = {"forward": 0, "backward": 0}

    def counting(method, key):
        def wrapper(*args, **kwargs):
            ops = method(*args, **kwargs)
            sent[key] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
            return ops
        return wrapper

    ids, labels = batch(3)
    pipe.step(ids, labels)  # the first step also agrees on shapes: not counted
    stage.get_fwd_send_ops = counting(stage.get_fwd_send_ops, "forward")
    stage.get_bwd_send_ops = counting(stage.get_bwd_send_ops, "backward")
    pipe.step(ids, labels)
    plan = plan_layout(full.config, nproc=2, pp=2, micro_batches=micro_batches, seq_len=LENGTH, batch=ROWS)
    row = plan["stages"][ctx.rank]
    return {"sent": sent, "params": sum(p.numel() for p in pipe.parameters()),
            "outputs_kept": len(stage.output_chunks),  # the last stage's micro-batch outputs left after the step
            "can_drop_outputs": bool(pipe._step_options),
            "plan": {"forward": row["pp_send_forward_bytes"], "backward": row["pp_send_backward_bytes"],
                     "params": row["params_per_rank"]}}


def pp_suite(ctx, steps: int) -> dict:
    """Every pipeline check, in one process group of pp = 2."""
    results: dict = {}
    for name, spec in VARIANTS.items():
        _run(results, f"equivalence/{name}", _equivalence, ctx, *spec)
    _run(results, "training", _training, ctx, steps)
    _run(results, "training/seq2seq", _training_seq2seq, ctx, 4)
    _run(results, "forward_only", _forward_only, ctx)
    try:
        results["measured"] = _measured(ctx)
    except Exception:  # noqa: BLE001
        results["measured"] = traceback.format_exc()
    results.update(one_stage_axes(ctx, steps))
    return results


def _compare_local(model_params: dict, full_params: dict, tp: int, tp_rank: int, what: str) -> None:
    """Each of this rank's tensors (`what`: "grad" or "data") equals its part of the full model's."""
    for name, p in model_params.items():
        ref = getattr(full_params[name], what)
        if getattr(p, "tp_dim", None) is not None:
            ref = local_part(ref, p, tp, tp_rank)
        torch.testing.assert_close(getattr(p, what), ref, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def _on_axes(tp_group, pp_group, dp_group, shard, steps: int, tp: int, tp_rank: int) -> None:
    """A tensor-parallel model (over tp_group) in a Pipeline (over pp_group, dp_group), fed its
    rows by `shard`: one step's loss and gradients, then `steps` Adam steps, equal one process
    over the whole batch."""
    cfg = tiny_config("decoder", position={"scheme": "rotary"})
    torch.manual_seed(0)
    full = attnlab.build_model(cfg)
    torch.manual_seed(0)
    model = tensor_parallel(attnlab.build_model(cfg), tp_group, gather_output=False)
    pipe = Pipeline(model, pp_group, micro_batches=2, dp_group=dp_group)
    opt_full = torch.optim.Adam(full.parameters(), lr=1e-3)
    opt_pipe = torch.optim.Adam(pipe.parameters(), lr=1e-3)
    full_params = dict(full.named_parameters(remove_duplicate=False))
    for step in range(steps):
        ids, labels = (torch.cat(pair) for pair in zip(batch(20 + step), batch(40 + step)))  # 2 x ROWS rows
        opt_full.zero_grad()
        reference = full_loss(full, ids, labels)
        reference.backward()
        opt_pipe.zero_grad()
        loss = pipe.step(*shard((ids, labels)))
        if step == 0:
            torch.testing.assert_close(torch.tensor(loss, dtype=torch.float64), reference.detach().double(),
                                       atol=1e-5, rtol=0)
            _compare_local(dict(pipe.stage.named_parameters()), full_params, tp, tp_rank, "grad")
        opt_full.step()
        opt_pipe.step()
    _compare_local(dict(pipe.stage.named_parameters()), full_params, tp, tp_rank, "data")


def one_stage_axes(ctx, steps: int) -> dict:
    """On 2 ranks, a one-stage Pipeline over tp = 2 (the vocabulary-parallel loss) and over
    dp = 2 (targets counted over both, gradients summed): the paths a mesh adds to pp."""
    import torch.distributed as dist

    results: dict = {}
    alone = [dist.new_group([r]) for r in range(ctx.world_size)][ctx.rank]  # every rank creates every group
    world = dist.group.WORLD
    _run(results, "tp2", _on_axes, world, alone, None, lambda b: b, steps, 2, ctx.rank)
    half = lambda b: tuple(t.chunk(2)[ctx.rank] for t in b)  # noqa: E731 -- this rank's rows
    _run(results, "dp2", _on_axes, alone, alone, world, half, steps, 1, 0)
    return results


def mesh_suite(ctx, steps: int) -> dict:
    """pp = 2 with tp = 2 or dp = 2 (4 processes)."""
    results: dict = {}
    _run(results, "mesh", _on_axes, ctx.tp_group, ctx.pp_group, ctx.dp_group, lambda b: shard_batch(b, ctx), steps,
         ctx.tp_size, ctx.tp_rank)
    results["coordinates"] = (ctx.tp_rank, ctx.pp_rank, ctx.dp_rank)
    return results


def die_mid_pipeline(ctx) -> str:
    """One step together, then rank 1 exits abruptly (a crash) while rank 0 starts the next."""
    import os

    pipe = Pipeline(attnlab.build_model(tiny_config("decoder")), ctx.pp_group, micro_batches=2)
    ids, labels = batch(1)
    pipe.step(ids, labels)
    if ctx.rank == 1:
        os._exit(3)
    pipe.step(ids, labels)
    return "not reached"
