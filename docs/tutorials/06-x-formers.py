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
# # 6. X-formers: attention for long inputs
#
# Dense self-attention compares every query with every key: `O(T^2 d)` time and a `T x T` matrix
# per head. This tutorial follows the lectures' efficient variants with attnlab's own kernels:
#
# 1. where a layer's FLOPs go, and the length where attention overtakes the feed-forward;
# 2. the sparse patterns (sliding window, Longformer, BigBird, local blocks) as masks, checked
#    against PyTorch's dense attention under the same mask;
# 3. the compressing kernels (Linformer, memory-compressed attention);
# 4. time and memory against the length `T`, measured;
# 5. divide and conquer: segment recurrence (Transformer-XL memory);
# 6. a mixture of experts: more parameters for the same compute per token.
#
# Every kernel is a config string, `attention.kernel`, with its options in
# `attention.kernel_options`; nothing else in a model changes. The budget here is a few seconds per
# measurement on a shared CPU, so the curves are noisy; the full sweep, with peak memory measured
# on the process, is the `attention_cost` study on the [studies page](../studies/index.md).

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
import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import attnlab
from attnlab.inspect.cost import cost_table, crossover_seq_len, format_table
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.kernels import KERNELS, KernelSetup, build_kernel

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: steadier timings on a shared machine
print("kernels:", ", ".join(KERNELS))

# %% [markdown]
# ## 1. Where the cost goes
#
# `cost_table` counts one sequence through a model, module by module. For one encoder layer of
# width 256 (4 heads, feed-forward 1,024) at `T = 1024`, the score computation (`q k^T` and the
# weighted sum of values) already costs as much as the feed-forward. `crossover_seq_len` gives the
# length where the `T^2` term equals everything per token: `2 d_model + d_ff` for plain multi-head
# attention.

# %%
layer_cfg = attnlab.presets.get("tiny-encoder", d_model=256, num_heads=4, d_ff=1024, num_layers=1,
                                vocab_size=1000, position={"scheme": "none"})
print(format_table(cost_table(layer_cfg, 1024)))
print(f"\ncrossover: T* = {crossover_seq_len(layer_cfg):.0f} tokens")

lengths = [256, 512, 1024, 2048, 4096, 8192]
scores = [next(r.flops for r in cost_table(layer_cfg, t) if r.name.endswith("scores")) for t in lengths]
ffn = [next(r.flops for r in cost_table(layer_cfg, t) if r.name.endswith("ffn")) for t in lengths]
plt.figure(figsize=(5, 3.2))
plt.loglog(lengths, scores, "o-", label="attention scores (T^2)")
plt.loglog(lengths, ffn, "s-", label="feed-forward (T)")
plt.axvline(crossover_seq_len(layer_cfg), color="grey", ls=":", label="crossover")
plt.xlabel("sequence length T"); plt.ylabel("forward FLOPs"); plt.legend(); plt.tight_layout(); plt.show()

# %% [markdown]
# ## 2. Sparse patterns
#
# The sparse kernels let each query see a subset of the keys. Each kernel can draw its pattern as
# a bool mask (`dense_mask`, True = may attend):
#
# - **sliding window**: key `j` for query `i` iff `|i - j| <= w`;
# - **Longformer** (Beltagy et al. 2020): the window plus global tokens that see, and are seen
#   by, every position;
# - **BigBird** (Zaheer et al. 2020): blocks: a window of blocks, the first blocks global, and a
#   few random blocks per query block;
# - **local blocks**: the sequence cut into independent blocks (the "L" layers of DMCA).

# %%
T = 128
setup = KernelSetup(num_heads=4, head_dim=16)
patterns = {
    "sliding_window": {"window": 8},
    "longformer": {"window": 8, "global_positions": [0, 64]},
    "bigbird": {"block_size": 8, "window_blocks": 1, "global_blocks": 1, "random_blocks": 2},
    "local_block": {"block_size": 16},
}
fig, axes = plt.subplots(1, 4, figsize=(13, 3.4))
for ax, (name, options) in zip(axes, patterns.items()):
    mask = build_kernel(name, options, setup).dense_mask(T, causal=False).reshape(T, T)
    ax.imshow(mask, cmap="Greys", interpolation="nearest")
    ax.set_title(f"{name}\n{mask.float().mean():.0%} of the pairs")
    ax.set_xlabel("key"); ax.set_ylabel("query")
plt.tight_layout(); plt.show()

# %% [markdown]
# A sparse kernel is exact attention restricted to its pattern. Checked against PyTorch: the
# kernel's output equals `torch.nn.functional.scaled_dot_product_attention` given the kernel's
# own pattern as its mask, in the forward pass and in the gradients. (The kernels never build the
# `T x T` mask; they work on tiles of the band.)

# %%
B, H, Dh = 2, 4, 16
q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
for name, options in patterns.items():
    kernel = build_kernel(name, options, KernelSetup(num_heads=H, head_dim=Dh))
    out, _ = kernel(q, k, v, scale=Dh ** -0.5)
    mask = kernel.dense_mask(T, causal=False, batch=B)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    print(f"{name:15s} equals PyTorch's SDPA under its mask (outputs and gradients)")

# %% [markdown]
# ## 3. Compressing instead of skipping
#
# Two kernels keep every query-key interaction but shorten the key axis:
#
# - **Linformer** (Wang et al. 2020) projects keys and values along the sequence axis to a fixed
#   length `k`: `softmax(Q (E K)^T / sqrt(d)) (F V)`, with learned `E, F` of shape `k x max_len`.
#   It is an approximation (a different function, learned), and for encoders only: `E K` mixes
#   future positions into every key.
# - **Memory-compressed attention** (Liu et al. 2018) compresses keys and values with a strided
#   convolution (kernel = stride = `c`), so each query attends over `T / c` compressed positions;
#   the DMCA model alternates it with local-block layers (`alternate: true`).
#
# Neither has a mask to compare with; what they return is the same shape as dense attention's,
# and it is *not* dense attention.

# %%
T = 256
x = torch.randn(1, T, 64)
dense = MultiHeadAttention(64, 4, kernel="sdpa")
compressing = {"linformer": {"k": 32, "max_len": T}, "memory_compressed": {"compression": 4, "alternate": False}}
for name, options in compressing.items():
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 4, kernel=build_kernel(name, options, KernelSetup(num_heads=4, head_dim=16)))
    dense.load_state_dict({k: v for k, v in layer.state_dict().items() if k in dense.state_dict()})
    extra = sum(p.numel() for p in layer.parameters()) - sum(p.numel() for p in dense.parameters())
    with torch.no_grad():
        gap = (layer(x)[0] - dense(x)[0]).abs().max().item()
    print(f"{name:18s} {extra:6,} extra parameters; output differs from dense attention by up to {gap:.3f}")

# %% [markdown]
# ## 4. Time and memory against the length
#
# One attention layer (width 256, 4 heads) per kernel, at lengths 256 to 2048, one thread:
#
# - **time**: a forward pass, the fastest of three (the least disturbed by other work);
# - **memory**: the bytes autograd saves for the backward pass (each storage counted once),
#   read through `torch.autograd.graph.saved_tensors_hooks`. That is the activation memory a
#   training step holds per layer; it is not the whole peak (the study measures the process).
#
# `eager` is the reference kernel that materialises the `T x T` weights; `sdpa` is PyTorch's fused
# kernel (what `auto` picks): still `T^2` time, but it never keeps the weights.

# %%
D, H = 256, 4
sweep = {
    "eager": {}, "sdpa": {},
    "sliding_window": {"window": 128},
    "longformer": {"window": 128, "global_positions": [0]},
    "bigbird": {"block_size": 64, "window_blocks": 1, "global_blocks": 1, "random_blocks": 1},
    "linformer": {"k": 128, "max_len": 2048},
    "memory_compressed": {"compression": 4, "alternate": False},
}
lengths = [256, 512, 1024, 2048]


def saved_bytes(fn):
    """Bytes of the distinct storages autograd saves for backward while fn() runs."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


timing, memory = {}, {}
start = time.perf_counter()
for name, options in sweep.items():
    torch.manual_seed(0)
    layer = MultiHeadAttention(D, H, kernel=build_kernel(name, options, KernelSetup(num_heads=H, head_dim=D // H)))
    timing[name], memory[name] = [], []
    for t in lengths:
        x = torch.randn(1, t, D, requires_grad=True)
        memory[name].append(saved_bytes(lambda: layer(x)[0]) / 2 ** 20)
        with torch.no_grad():
            runs = []
            for _ in range(3):
                s = time.perf_counter(); layer(x); runs.append(time.perf_counter() - s)
        timing[name].append(min(runs) * 1e3)
print(f"sweep took {time.perf_counter() - start:.1f} s")
print(f"{'kernel':18s}" + "".join(f"{'T=' + str(t):>18s}" for t in lengths))
for name in sweep:
    print(f"{name:18s}" + "".join(f"{ms:9.1f} ms {mb:5.1f} MiB" for ms, mb in zip(timing[name], memory[name])))

# %%
fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
for name in sweep:
    style = "o--" if name in ("eager", "sdpa") else "o-"
    ax_t.loglog(lengths, timing[name], style, label=name)
    ax_m.loglog(lengths, memory[name], style, label=name)
ax_t.set_title("forward time (ms)"); ax_m.set_title("saved for backward (MiB)")
for ax in (ax_t, ax_m):
    ax.minorticks_off(); ax.set_xlabel("sequence length T"); ax.set_xticks(lengths, [str(t) for t in lengths])
ax_m.legend(fontsize=8); plt.tight_layout(); plt.show()
print("growth over the last doubling, 1024 -> 2048:")
for name in sweep:
    print(f"  {name:18s} time x{timing[name][-1] / timing[name][-2]:.2f}   "
          f"memory x{memory[name][-1] / memory[name][-2]:.2f}")
fastest = min(sweep, key=lambda n: timing[n][-1])
print(f"fastest at T={lengths[-1]}: {fastest} ({timing[fastest][-1]:.0f} ms; sdpa {timing['sdpa'][-1]:.0f} ms)")

# %% [markdown]
# What to read from it: over the last doubling `eager`'s saved memory grows about 3.4x, on its
# way to 4x (the `T x T` weights take over from the projections' `T x d` tensors); the windowed
# and block kernels' about 2x (linear in `T`); Linformer's less (its `k` projected keys do not
# grow); memory-compressed attention's in between (it still scores `T x T / c` pairs). The fused
# `sdpa` kernel saves only `O(T)` too, but its *time* is quadratic: near 4x per doubling, where
# the sparse kernels take about 2x. At a few hundred tokens the sparse kernels gain little or
# nothing (their tiles cost bookkeeping); by 2,048 they usually pass `sdpa` (timings on a shared
# machine vary from run to run; the slopes are what holds). The study runs to 8,192 tokens, and
# the README's long-input table to 64k, where the sliding window is 100x faster than dense SDPA.

# %% [markdown]
# ## 5. Divide and conquer: segment recurrence
#
# Another way through a long text: cut it into segments and carry a memory. With `memory_len: M`
# a decoder keeps, per layer, the layer inputs of the last `M` positions (no gradient flows into
# them), and the next segment attends over `[memory; segment]` (Transformer-XL, Dai et al. 2019).
# Positions must be relative (rotary here), since each segment would otherwise restart at 0.
#
# A property to check: with `M` equal to the segment length, two segments read one after the
# other give exactly the logits of one forward pass over both; a third segment no longer sees
# the first, so it differs from the full pass — that is the fixed cost of the memory, `M + T`
# keys per query, whatever the length of the text.

# %%
torch.manual_seed(0)
xl_cfg = attnlab.presets.get("tiny-decoder", position={"scheme": "rotary"}, memory_len=16)
xl = attnlab.build_model(xl_cfg).eval()
ids = torch.randint(1, xl_cfg.vocab_size, (2, 48))
with torch.no_grad():
    full = xl(ids)
    mems, pieces = None, []
    for seg in ids.split(16, dim=1):
        logits, mems = xl.segment(seg, mems)
        pieces.append(logits)
torch.testing.assert_close(torch.cat(pieces[:2], 1), full[:, :32])
print("segments 1-2 == full forward; memory per layer:", tuple(mems[0].shape))
gap = (pieces[2] - full[:, 32:]).abs().max()
print(f"segment 3 vs full forward: max difference {gap:.3f} (it cannot see segment 1)")

# %% [markdown]
# `attnlab train CONFIG --model.memory_len 64` trains through the same recurrence; on Shakespeare
# characters the memory lowers the validation loss from 2.021 to 1.930 (the README's
# "Segment-level recurrence").
#
# ## 6. Mixture of experts: parameters without compute
#
# The last variant of the lecture's table trades the other way: a mixture-of-experts layer
# (Shazeer et al. 2017) replaces the feed-forward by `E` experts behind a router that sends each
# token to its `top_k` best. Parameters grow with `E`; the compute per token grows with `top_k`
# only. `cost_table` counts both:

# %%
rows = []
for experts, top_k in [(0, 1), (4, 1), (8, 1), (8, 2), (16, 2)]:
    cfg = attnlab.presets.get("tiny-decoder", d_model=128, num_heads=4, d_ff=512, num_layers=2, vocab_size=1000,
                              moe={"num_experts": experts, "top_k": top_k})
    ffn_rows = [r for r in cost_table(cfg, 256) if r.name.endswith("ffn")]
    rows.append((experts, top_k, sum(r.params for r in ffn_rows), sum(r.flops for r in ffn_rows)))
base_params, base_flops = rows[0][2], rows[0][3]
print("experts  top_k  feed-forward params  (x dense)   FLOPs at T=256  (x dense)")
for experts, top_k, params, flops in rows:
    print(f"{experts:7d}  {top_k:5d}  {params:19,}  {params / base_params:8.1f}x  "
          f"{flops:15,}  {flops / base_flops:8.2f}x")

moe = attnlab.build_model(attnlab.presets.get("tiny-decoder", moe={"num_experts": 4, "top_k": 2})).eval()
with torch.no_grad():
    print("a MoE decoder runs like any other:", tuple(moe(torch.randint(1, 97, (2, 16))).shape))

# %% [markdown]
# The small budget shows the mechanics and the scaling laws of each kernel's cost; it does not
# show what each variant costs in quality. For that, the summarisation study (on the
# [studies page](../studies/index.md)) trains DMCA and DMCA + MoE decoders against dense ones on
# `debian-summaries`.
#
# ## Exercises
#
# 1. **A causal window.** Draw `build_kernel("sliding_window", {"window": 8}).dense_mask(T, causal=True)`
#    and rerun the SDPA check with `is_causal`-style masks: where do the decoder's and the
#    encoder's patterns differ? (`attnlab/nn/kernels/sliding_window.py`)
# 2. **Extend the sweep** to `T = 8192` for the linear kernels only (leave out `eager`), and find
#    the length where `sliding_window`'s forward time drops below `sdpa`'s on your machine.
# 3. **Linformer's k.** Set `linformer`'s `k` to 32, 128 and 512 and plot the saved memory: at
#    which `k` is it no cheaper than `sdpa`? (`attnlab/nn/kernels/linformer.py`)
# 4. **Memory length.** In section 5, set `memory_len=32` with segments of 16: which segments
#    now match the full forward pass exactly, and why? (`Decoder.segment` in
#    `attnlab/models/transformer.py`)
# 5. **Write a kernel.** The scaled dot-product attention lab (`attnlab lab start`, see the
#    [labs page](../labs.md)) has you write the dense computation that the sparse kernels
#    restrict; then add a "dilated window" kernel as one file plus one line in `KERNELS`
#    (`attnlab/nn/kernels/__init__.py`), and check it against SDPA under its `dense_mask` as in
#    section 2.
