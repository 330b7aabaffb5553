"""Functions run on each rank by the parallel tests (module level: spawn pickles them by name).

Each suite runs several checks in one process group (starting processes costs seconds) and
returns {check name: "ok" or the failure message}; the tests assert on one entry each.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlab
from attnlab.parallel.checkpoint import gather_full_state, save_full_checkpoint
from attnlab.parallel.data import shard_batch, wrap_model
from attnlab.parallel.tensor import local_part, tensor_parallel, vocab_parallel_cross_entropy

VOCAB = 64


def tiny_config(arch: str, **overrides) -> attnlab.ModelConfig:
    """A small model whose head counts, d_ff and vocabulary split over 2 ranks."""
    base = dict(arch=arch, vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                norm_placement="pre", head="lm" if arch != "encoder" else "mlm")
    base.update(overrides)
    return attnlab.ModelConfig.from_dict(base)


def batch(arch: str, seed: int, rows: int = 4) -> dict[str, torch.Tensor]:
    """Random ids (and targets) drawn from a generator seeded by `seed`."""
    g = torch.Generator().manual_seed(seed)
    out = {"ids": torch.randint(0, VOCAB, (rows, 7), generator=g), "labels": torch.randint(0, VOCAB, (rows, 7), generator=g)}
    if arch == "encoder_decoder":
        out["tgt"] = torch.randint(0, VOCAB, (rows, 7), generator=g)
    return out


def forward(model, arch: str, b: dict) -> torch.Tensor:
    return model(b["ids"], b["tgt"]) if arch == "encoder_decoder" else model(b["ids"])


def _run(results: dict, name: str, fn, *args) -> None:
    try:
        fn(*args)
        results[name] = "ok"
    except Exception:  # noqa: BLE001 -- reported to the test, which fails on it
        results[name] = traceback.format_exc()


def _equivalence(ctx, arch: str, overrides: dict) -> None:
    """Forward outputs and every gradient of the sharded model equal the full model's (chunk)."""
    cfg = tiny_config(arch, **overrides)
    torch.manual_seed(0)
    full = attnlab.build_model(cfg)
    torch.manual_seed(0)
    tp = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group)
    b = batch(arch, 1, rows=3)
    out_full, out_tp = forward(full, arch, b), forward(tp, arch, b)
    torch.testing.assert_close(out_tp, out_full, atol=1e-5, rtol=1e-5)
    weights = torch.randn(out_full.shape, generator=torch.Generator().manual_seed(2))
    (out_full * weights).sum().backward()
    (out_tp * weights).sum().backward()
    full_params = dict(full.named_parameters())
    sharded = 0
    for name, p in tp.named_parameters():
        ref = full_params[name].grad
        dim = getattr(p, "tp_dim", None)
        if dim is not None:
            ref = local_part(ref, p, ctx.tp_size, ctx.tp_rank)
            sharded += 1
        torch.testing.assert_close(p.grad, ref, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    if sharded == 0:
        raise AssertionError("no parameter was sharded")


def _lm_loss_full(model, b):
    logits = model(b["ids"])
    return F.cross_entropy(logits.reshape(-1, VOCAB), b["labels"].reshape(-1))


def _tp_training(ctx, out: Path) -> None:
    """10 Adam steps: sharded (vocab-parallel loss) == full; a full checkpoint at step 5."""
    cfg = tiny_config("decoder", position={"scheme": "rotary"})
    torch.manual_seed(0)
    full = attnlab.build_model(cfg)
    torch.manual_seed(0)
    tp = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group, gather_output=False)
    opt_full = torch.optim.Adam(full.parameters(), lr=1e-3)
    opt_tp = torch.optim.Adam(tp.parameters(), lr=1e-3)
    for step in range(10):
        b = batch("decoder", 100 + step)
        b["labels"][0, :3] = -100  # ignored targets go through the vocab-parallel loss too
        opt_full.zero_grad()
        logits = full(b["ids"])
        F.cross_entropy(logits.reshape(-1, VOCAB), b["labels"].reshape(-1), ignore_index=-100).backward()
        opt_full.step()
        opt_tp.zero_grad()
        vocab_parallel_cross_entropy(tp(b["ids"]), b["labels"], ctx.tp_group).backward()
        opt_tp.step()
        if step == 4:
            save_full_checkpoint(tp, out / "tp_step5", optimizer=opt_tp)
    gathered = gather_full_state(tp)
    for name, t in full.state_dict().items():
        if name in gathered:
            torch.testing.assert_close(gathered[name], t, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    if ctx.is_main:
        attnlab.save(full, out / "full_step10")


def _padded_loss(ctx) -> None:
    """A vocabulary of 65 (padded to 66 over 2 ranks), label smoothing, ignored targets: the
    vocabulary-parallel loss and every gradient equal the full model's, the gathered state its state."""
    cfg = tiny_config("decoder", vocab_size=65)
    torch.manual_seed(0)
    full = attnlab.build_model(cfg)
    torch.manual_seed(0)
    tp = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group, gather_output=False)
    b = batch("decoder", 9)
    b["labels"][1, 2:] = -100
    want = F.cross_entropy(full(b["ids"]).reshape(-1, 65), b["labels"].reshape(-1), label_smoothing=0.1)
    got = vocab_parallel_cross_entropy(tp(b["ids"]), b["labels"], ctx.tp_group, label_smoothing=0.1, vocab_size=65)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    want.backward()
    got.backward()
    full_params = dict(full.named_parameters())
    for name, p in tp.named_parameters():
        ref = full_params[name].grad
        if getattr(p, "tp_dim", None) is not None:
            ref = local_part(ref, p, ctx.tp_size, ctx.tp_rank)
        torch.testing.assert_close(p.grad, ref, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    gathered = gather_full_state(tp)
    for name, t in full.state_dict().items():
        if name in gathered:
            torch.testing.assert_close(gathered[name], t, msg=lambda m: f"{name}: {m}")


def tp_suite(ctx, out: str) -> dict[str, str]:
    """Every tensor-parallel check, in one process group of tp = 2."""
    results: dict[str, str] = {}
    variants = {
        "decoder": ("decoder", {}),
        "encoder_decoder": ("encoder_decoder", {"activation": "swiglu"}),
        "encoder_mlm": ("encoder", {"norm_placement": "post", "embedding_norm": True}),
        "alibi_gqa": ("decoder", {"position": {"scheme": "alibi"}, "attention": {"num_kv_heads": 2}}),
        "t5_bias_untied": ("encoder_decoder", {"position": {"scheme": "t5_bias"}, "tie_embeddings": False,
                                               "share_embeddings": False, "src_vocab_size": 64}),
        "relative_general": ("decoder", {"position": {"scheme": "relative"}, "attention": {"score": "general"}}),
        "additive_eager": ("decoder", {"attention": {"score": "additive", "kernel": "eager"}}),
        "padded_vocabulary": ("encoder_decoder", {"vocab_size": 65, "src_vocab_size": 67, "share_embeddings": False,
                                                  "tie_embeddings": False}),
    }
    for name, (arch, overrides) in variants.items():
        _run(results, f"equivalence/{name}", _equivalence, ctx, arch, overrides)
    _run(results, "training", _tp_training, ctx, Path(out))
    _run(results, "padded_loss", _padded_loss, ctx)
    results["measured_bytes"] = _measure_bytes(ctx)
    return results


def _measure_bytes(ctx) -> dict[str, int]:
    """Payload bytes all-reduced in the forward and the backward of one sharded training step
    (counted by wrapping torch.distributed.all_reduce), for the cost note's test."""
    import torch.distributed as dist

    cfg = tiny_config("decoder", position={"scheme": "rotary"})
    torch.manual_seed(0)
    tp = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group, gather_output=False)
    b = batch("decoder", 7)
    counted = {"n": 0}
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        counted["n"] += tensor.numel() * tensor.element_size()
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        loss = vocab_parallel_cross_entropy(tp(b["ids"]), b["labels"], ctx.tp_group)
        forward_bytes = counted["n"]
        loss.backward()
    finally:
        dist.all_reduce = original
    return {"forward": forward_bytes, "backward": counted["n"] - forward_bytes}


def dp_suite(ctx, out: str, rows: int) -> dict[str, str]:
    """DDP over 2 ranks x `rows` == one process x 2 `rows` for 10 Adam steps; checkpoint at step 5."""
    results: dict[str, str] = {}

    def train() -> None:
        cfg = tiny_config("decoder")
        torch.manual_seed(0)
        model = attnlab.build_model(cfg)
        ddp = wrap_model(model, ctx)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(10):
            b = shard_batch(batch("decoder", 200 + step, rows=2 * rows), ctx)
            opt.zero_grad()
            _lm_loss_full(ddp, b).backward()
            opt.step()
            if step == 4:
                save_full_checkpoint(model, Path(out) / "dp_step5", optimizer=opt)
            ctx.barrier()
        if ctx.is_main:
            attnlab.save(model, Path(out) / "dp_step10")

    def train_fsdp() -> None:
        torch.manual_seed(0)
        model = wrap_model(attnlab.build_model(tiny_config("decoder")), ctx, fsdp=True)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(10):
            b = shard_batch(batch("decoder", 200 + step, rows=2 * rows), ctx)
            opt.zero_grad()
            _lm_loss_full(model, b).backward()
            opt.step()
        save_full_checkpoint(model, Path(out) / "fsdp_step10")

    _run(results, "training", train)
    _run(results, "fsdp", train_fsdp)
    return results


def reference_dp(out: str, rows: int) -> dict[str, torch.Tensor]:
    """One process, batches of 2 `rows`, 10 Adam steps: what dp_suite must match."""
    cfg = tiny_config("decoder")
    torch.manual_seed(0)
    model = attnlab.build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(10):
        b = batch("decoder", 200 + step, rows=2 * rows)
        opt.zero_grad()
        _lm_loss_full(model, b).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def die_mid_run(ctx, victim: int, delay_s: float) -> str:
    """All-reduce in a loop; rank `victim` exits abruptly after `delay_s` (a crash)."""
    start = time.monotonic()
    while True:
        if ctx.rank == victim and time.monotonic() - start > delay_s:
            os._exit(3)
        ctx.all_reduce_mean({"x": 1.0}, group="world")
        time.sleep(0.01)


def trainer_dp(ctx, config: dict) -> dict[str, str]:
    """`Trainer` under a 2-rank torchrun-like environment; rank 0 saves the final model."""
    from attnlab.training import TrainConfig, Trainer

    results: dict[str, str] = {}

    def run() -> None:
        trainer = Trainer(TrainConfig.from_dict(config), log=lambda text: None, show_progress=False)
        if trainer.parallel.dp_size != 2:
            raise AssertionError(f"the trainer did not detect the 2-rank environment: {trainer.parallel}")
        summary = trainer.fit()
        if ctx.is_main:
            attnlab.save(trainer.model, Path(config["train"]["out_dir"]) / "final_model")
            results["summary"] = repr(summary)

    _run(results, "trainer", run)
    return results


def trainer_dp_signal(ctx, config: dict, victim: int, at_step: int) -> dict[str, object]:
    """`Trainer` on 2 ranks; rank `victim` alone gets SIGTERM during step `at_step` (a scheduler's
    signal reaches the ranks at different moments): what each rank's fit raised."""
    import os
    import signal

    from attnlab.training import TrainConfig, Trainer
    from attnlab.training.run.signals import TrainingInterrupted

    trainer = Trainer(TrainConfig.from_dict(config), log=lambda text: None, show_progress=False)

    def hook(record: dict) -> None:
        if ctx.rank == victim and record["step"] == at_step:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        trainer.fit(on_step=hook)
    except TrainingInterrupted as err:
        return {"step": err.step, "saved": err.saved, "checkpoint": str(err.checkpoint)}
    return {"step": trainer.step, "saved": None, "checkpoint": None}


def hang_mid_run(ctx, victim: int, hang_s: float) -> str:
    """Rank `victim` stops taking part (sleeps `hang_s`) while the others wait in a collective."""
    ctx.all_reduce_mean({"x": 1.0}, group="world")
    if ctx.rank == victim:
        time.sleep(hang_s)
        return "woke up"
    ctx.all_reduce_mean({"x": 1.0}, group="world")
    return "not reached"


def mesh_suite(ctx, rows: int) -> dict[str, str]:
    """tp = 2 x dp = 2: a tensor-parallel model under DDP over the data axis == one process."""
    results: dict[str, str] = {}

    def train() -> None:
        cfg = tiny_config("decoder", position={"scheme": "relative"})
        torch.manual_seed(0)
        full = attnlab.build_model(cfg)
        torch.manual_seed(0)
        tp = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group)
        ddp = wrap_model(tp, ctx)
        opt_full = torch.optim.Adam(full.parameters(), lr=1e-3)
        opt_tp = torch.optim.Adam(tp.parameters(), lr=1e-3)
        for step in range(5):
            b = batch("decoder", 300 + step, rows=2 * rows)
            opt_full.zero_grad()
            _lm_loss_full(full, b).backward()
            opt_full.step()
            opt_tp.zero_grad()
            _lm_loss_full(ddp, shard_batch(b, ctx)).backward()
            opt_tp.step()
        gathered = gather_full_state(tp)
        for name, t in full.state_dict().items():
            if name in gathered:
                torch.testing.assert_close(gathered[name], t, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")

    _run(results, "mesh", train)
    return results
