# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 8. Scaling out: tensor and pipeline parallelism
#
# A model that does not fit one device, or trains too slowly on one, is split over several
# processes. The lectures name three axes (Megatron-LM's PTD-P, Narayanan et al. 2021):
#
# - **data parallel**: each process holds the whole model and its own rows; gradients are averaged;
# - **tensor parallel** (Shoeybi et al. 2019): each layer's matrices are split over processes;
# - **pipeline parallel**: the stack of layers is cut into stages, one per process, and each batch
#   flows through them in micro-batches.
#
# This tutorial runs tensor and pipeline parallelism for real, on two local processes joined by
# `torch.distributed` (gloo, on the CPU), and holds what they do against `attnlab parallel plan`'s
# prediction: the loss (equal to one process's), the parameters each rank holds, and the bytes each
# rank sends. It needs no GPU; two processes on a 2-core machine take about a minute, mostly
# starting Python twice. The layout numbers for bigger runs, measured through the trainer, are
# in the README's "Scaling out" section; the [studies page](../studies/index.md) has the rest.

# %%
# Colab or a fresh Jupyter: install attnlab when it is not importable (a no-op where it is).
# ATTNLAB_PIP names what to install (a git URL or a local checkout); "attnlab" by default.
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("attnlab") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", os.environ.get("ATTNLAB_PIP", "attnlab")])

# %%
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import attnlab
from attnlab.parallel import format_plan, plan_layout, spawn

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## 1. Megatron's split of the MLP, on one process
#
# The feed-forward block is `Z = GeLU(X A) B`. Split `A` by **columns** over two processes: each
# computes `GeLU(X A_i)` on its own, since GeLU acts element by element, with no communication.
# Split `B` by **rows**: each computes `GeLU(X A_i) B_i`, and the full output is the *sum* of
# the two: one all-reduce. Attention splits the same way, by heads. Plain tensors first:

# %%
X = torch.randn(8, 16)
A, B = torch.randn(16, 64), torch.randn(64, 16)
full = F.gelu(X @ A) @ B
A1, A2 = A.chunk(2, dim=1)  # columns: (16, 32) each
B1, B2 = B.chunk(2, dim=0)  # rows: (32, 16) each
partial = [F.gelu(X @ A1) @ B1, F.gelu(X @ A2) @ B2]  # each on its own process
torch.testing.assert_close(partial[0] + partial[1], full)  # the all-reduce: a sum
print("GeLU(X A) B == sum over ranks of GeLU(X A_i) B_i")
# Splitting A by rows instead would need the sum *before* the GeLU: GeLU(a + b) != GeLU(a) + GeLU(b)
rows = A.chunk(2, dim=0)
wrong = F.gelu(X[:, :8] @ rows[0]) + F.gelu(X[:, 8:] @ rows[1])
print(f"A split by rows, summed after GeLU: off by {(wrong - F.gelu(X @ A)).abs().max():.2f}")

# %% [markdown]
# ## 2. Two processes
#
# `attnlab.parallel.spawn(fn, world_size, tp=..., pp=...)` starts local processes joined in one
# process group (a `ParallelContext` on every rank, with its tensor-, pipeline- and data-parallel
# groups) and returns each rank's result; a rank that fails or hangs is killed and named.
# Real runs use torchrun: `attnlab train CONFIG --nproc 2 --parallel.tp 2`.
#
# Processes are started with the `spawn` method, which imports the function by name, so the
# functions each rank runs live in a small module (not in a notebook cell). What they do:
#
# - `tp_worker`: build the model with seed 0 (the same on each rank), split it with
#   `tensor_parallel`, run a training step with the vocabulary-parallel cross-entropy (no rank
#   forms the `(N, V)` logits), and report the loss, the parameters it holds and the bytes it wrote
#   during the step (`/proc/self/io`: gloo's sends, with their headers, are all it writes);
# - `pp_worker`: the same through a two-stage `Pipeline` with 4 micro-batches under 1F1B.

# %%
WORKERS = '''
"""Functions each rank runs in tutorial 8 (attnlab.parallel.spawn imports them by name)."""
import torch
import attnlab
from attnlab.parallel import Pipeline, tensor_parallel, vocab_parallel_cross_entropy


def bytes_written():
    """Bytes this process has written so far (Linux: /proc/self/io's wchar)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def tp_worker(ctx, cfg, ids, labels):
    torch.manual_seed(0)
    model = tensor_parallel(attnlab.build_model(cfg), ctx.tp_group, gather_output=False)

    def step():
        model.zero_grad()
        local_logits = model(ids)  # (B, T, V / tp): this rank's slice of the vocabulary
        loss = vocab_parallel_cross_entropy(local_logits, labels, ctx.tp_group, vocab_size=cfg.vocab_size)
        loss.backward()
        return loss.item()

    step()  # the first step sets up the buffers; measure the second
    before = bytes_written()
    loss = step()
    ffn = model.layers[0].ffn
    return {"loss": loss, "sent": bytes_written() - before, "params": sum(p.numel() for p in model.parameters()),
            "w1": tuple(ffn.w1.weight.shape), "w2": tuple(ffn.w2.weight.shape)}


def pp_worker(ctx, cfg, ids, labels, micro_batches, schedule):
    torch.manual_seed(0)
    pipe = Pipeline(attnlab.build_model(cfg), ctx.pp_group, micro_batches=micro_batches, schedule=schedule)
    pipe.step(ids, labels)
    for p in pipe.parameters():
        p.grad = None
    before = bytes_written()
    loss = pipe.step(ids, labels)
    return {"loss": loss, "sent": bytes_written() - before, "params": sum(p.numel() for p in pipe.parameters())}
'''
folder = Path(tempfile.mkdtemp(prefix="attnlab-tutorial-08-"))
(folder / "tutorial_workers.py").write_text(WORKERS)
sys.path.insert(0, str(folder))  # the spawned processes get the parent's sys.path
import tutorial_workers  # noqa: E402

# %% [markdown]
# The model: a 4-layer decoder of width 128 (4 heads, feed-forward 512, vocabulary 512), a batch
# of 8 rows of 64 random tokens; one process gives the reference loss.

# %%
cfg = attnlab.presets.get("tiny-decoder", d_model=128, num_heads=4, d_ff=512, num_layers=4, vocab_size=512,
                          position={"scheme": "learned", "max_len": 64})
gen = torch.Generator().manual_seed(0)
ids = torch.randint(1, cfg.vocab_size, (8, 64), generator=gen)
labels = torch.randint(1, cfg.vocab_size, (8, 64), generator=gen)
torch.manual_seed(0)
single = attnlab.build_model(cfg)
reference = F.cross_entropy(single(ids).flatten(0, 1), labels.flatten()).item()
total_params = sum(p.numel() for p in single.parameters())
print(f"one process: loss {reference:.6f}, {total_params:,} parameters, "
      f"w1 {tuple(single.layers[0].ffn.w1.weight.shape)}, w2 {tuple(single.layers[0].ffn.w2.weight.shape)}")

# %% [markdown]
# ### Tensor parallel, tp = 2

# %%
start = time.perf_counter()
tp = spawn(tutorial_workers.tp_worker, 2, args=(cfg, ids, labels), tp=2, timeout_s=300)
print(f"2 processes, {time.perf_counter() - start:.0f} s (most of it starting them)")
tp_plan = plan_layout(cfg, nproc=2, tp=2, seq_len=64, batch=8)
for rank, r in enumerate(tp):
    stage = tp_plan["stages"][0]
    print(f"rank {rank}: loss {r['loss']:.6f} | w1 {r['w1']}, w2 {r['w2']} | params {r['params']:,} "
          f"(plan {stage['params_per_rank']:,}) | sent {r['sent']:,} bytes (plan {stage['tp_ring_bytes']:,.0f}, "
          f"{r['sent'] / stage['tp_ring_bytes'] - 1:+.2%})")
    assert abs(r["loss"] - reference) < 1e-5
    assert r["params"] == stage["params_per_rank"]

# %% [markdown]
# Each rank holds half of `w1`'s rows (the columns of `A`, in PyTorch's `(out, in)` layout) and
# half of `w2`'s columns (the rows of `B`), half of the embedding (by vocabulary) and of the
# attention projections (by heads); the positions, the norms and the row-parallel layers' biases
# stay whole on every rank, hence a little more than half the parameters. The loss
# equals one process's. The bytes: per layer, one all-reduce of the `(B, T, D)` activations after
# attention and one after the MLP in the forward pass, and their mirror images in the backward
# pass; with two ranks a ring all-reduce sends the whole payload once. What gloo wrote is the
# plan's count plus its message headers.
#
# ### Pipeline parallel, pp = 2

# %%
start = time.perf_counter()
pp = spawn(tutorial_workers.pp_worker, 2, args=(cfg, ids, labels, 4, "1f1b"), pp=2, timeout_s=300)
print(f"2 processes, {time.perf_counter() - start:.0f} s")
pp_plan = plan_layout(cfg, nproc=2, pp=2, micro_batches=4, seq_len=64, batch=8)
for rank, r in enumerate(pp):
    stage = pp_plan["stages"][rank]
    planned = stage["pp_send_forward_bytes"] + stage["pp_send_backward_bytes"] + stage["pp_shared_ring_bytes"]
    print(f"stage {rank} (layers {stage['layers'][0]}-{stage['layers'][1] - 1}): loss {r['loss']:.6f} | "
          f"trains {r['params']:,} params (plan {stage['params_per_rank']:,}) | sent {r['sent']:,} bytes "
          f"(plan {planned:,.0f}, {r['sent'] / planned - 1:+.2%})")
    assert abs(r["loss"] - reference) < 1e-5
    assert r["params"] == stage["params_per_rank"]

# %% [markdown]
# Stage 0 sends each micro-batch's activations forward, `(B/m, T, D)` four times; stage 1 sends
# their gradients back. Both also sum the gradient of the token embedding, which the first stage
# uses as input and the last as the tied output layer (`pp shared`). The pipeline moves far fewer
# bytes than tensor parallelism (here 0.5 MB against 4.7 MB per step), which is why
# `attnlab train` numbers ranks with tp fastest: tp stays inside a machine, the pipeline crosses
# machines.
#
# ## 3. Planning a layout before running it
#
# `plan_layout` (the command `attnlab parallel plan`) predicts per stage what one rank holds
# (weights, gradients, Adam's two moments, the activations held at once) and sends. Here is the
# two-stage plan measured above, in full:

# %%
print(format_plan(pp_plan))

# %% [markdown]
# The pipeline **bubble** is the time stages wait: `(P - 1) / (m + P - 1)` of a step with `P`
# stages and `m` micro-batches. More micro-batches shrink it. Under GPipe each stage holds all `m`
# micro-batches' activations until the backward passes begin; under 1F1B, at most `P` (the first
# stage) — the same bubble for less memory. The plan for GPT-2 small (124M parameters) on 4
# stages, 1,024 tokens, 32 rows per step:

# %%
gpt2 = attnlab.presets.get("gpt2-small")
ms = [1, 2, 4, 8, 16, 32]
plans = [plan_layout(gpt2, nproc=4, pp=4, micro_batches=m, seq_len=1024, batch=32) for m in ms]
fig, (ax_b, ax_a) = plt.subplots(1, 2, figsize=(10, 3.4))
ax_b.plot(ms, [p["bubble_fraction"] for p in plans], "o-")
ax_b.set_xscale("log", base=2); ax_b.set_xlabel("micro-batches m"); ax_b.set_title("bubble fraction (P = 4)")
for key, label in [("activation_bytes_gpipe", "GPipe"), ("activation_bytes_1f1b", "1F1B")]:
    ax_a.plot(ms, [p["stages"][0][key] / 2 ** 30 for p in plans], "o-", label=label)
ax_a.set_xscale("log", base=2); ax_a.set_xlabel("micro-batches m"); ax_a.set_title("stage 0 activations held (GiB)")
ax_a.legend(); plt.tight_layout(); plt.show()

# %% [markdown]
# And the model's own state per rank (fp32 weights, their gradients and Adam's two moments: 16
# bytes a parameter) of GPT-2 small, as it is split over more processes. Tensor parallelism
# divides nearly every matrix; a pipeline divides the layers, but the tied token embedding
# (38.6M of the 124M parameters) sits on both the first stage (input) and the last (output).

# %%
def state_gib(**layout):
    n = layout.get("tp", 1) * layout.get("pp", 1)
    stages = plan_layout(gpt2, nproc=n, seq_len=1024, batch=8, micro_batches=8 if layout.get("pp", 1) > 1 else 1,
                         **layout)["stages"]
    return max(s["weights_bytes"] + s["gradients_bytes"] + s["optimizer_bytes"] for s in stages) / 2 ** 30


splits = [1, 2, 4, 6]
tp_mem = [state_gib(tp=n) if n in (1, 2, 4) else float("nan") for n in splits]  # 12 heads: tp must divide them
pp_mem = [state_gib(pp=n) for n in splits]
plt.figure(figsize=(5, 3.2))
plt.plot(splits, tp_mem, "o-", label="tensor parallel"); plt.plot(splits, pp_mem, "s-", label="pipeline")
plt.plot(splits, [tp_mem[0] / n for n in splits], ":", color="grey", label="1 / processes")
plt.xticks(splits); plt.xlabel("processes"); plt.ylabel("GiB on the largest rank"); plt.legend()
plt.title("weights + gradients + Adam, GPT-2 small"); plt.tight_layout(); plt.show()
for n, a, b in zip(splits, tp_mem, pp_mem):
    print(f"{n} process(es): tensor parallel {a:.2f} GiB, pipeline {b:.2f} GiB on the largest rank")

# %% [markdown]
# The same from the command line (every number above has a `--json` form):

# %%
cli = [sys.executable, "-m", "attnlab.cli.main", "parallel"]
print(subprocess.run(cli + ["cost", "gpt2-small", "--tp", "2", "--dp", "2", "--seq-len", "1024", "--batch", "8"],
                     capture_output=True, text=True, check=True).stdout)

# %% [markdown]
# What this small run shows: that the splits compute the same loss, and that the plan's
# parameter counts and byte counts are what the processes hold and send. What it does not show:
# speed. Two processes on two shared CPU cores gain nothing (the README's layout table measures
# every layout through the trainer, and explains why wall-clock speed-ups on a busy machine
# flatter them); the reason to split is memory and many devices.
#
# ## Exercises
#
# 1. **GPipe against 1F1B.** Run `pp_worker` with `schedule="gpipe"`: the loss and the bytes are
#    the same; print `plan_layout(...)["stages"][0]` for both and compare the activations held.
#    (`attnlab/parallel/pipeline.py`)
# 2. **A tied embedding.** Build the model with `tie_embeddings=False` and rerun the pipeline:
#    which term of the plan's bytes disappears, and does the measurement follow?
# 3. **Heads that do not divide.** Try `tp=2` with `num_heads=3, d_model=96`: `plan_layout` refuses
#    it before any process starts; read the message (`attnlab/parallel/layout.py`).
# 4. **Data parallel.** Write a `dp_worker` that wraps the model with
#    `attnlab.parallel.wrap_model(model, ctx)` (DDP) and trains on `shard_batch(ids, ctx)`; spawn it
#    with `tp=1, pp=1`, and compare its bytes with the plan's `dp_ring_bytes`.
# 5. **Train for real.** `attnlab train examples/shakespeare_char.json --nproc 2 --parallel.tp 2
#    --train.max_steps 30`, then the same with `--parallel.pp 2 --parallel.micro_batches 4`: the
#    logged losses agree with one process's to about 1e-6.
