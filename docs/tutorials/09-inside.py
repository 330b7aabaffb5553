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
# # 9. Inside a model: hook points, patching and attribution
#
# The lectures say attention "provides some interpretability": look at where a head attends and
# you see what it uses. This tutorial goes one level deeper, as interpretability research does:
# it reads any activation of a model by name, changes it and watches the output, and asks which
# inputs and which heads an answer comes from.
#
# The model is one where we know the answer in advance. Sequences hold a random segment twice,
# `[BOS, A B C D ..., A B C D ...]`: the second copy can be predicted only by finding the earlier
# occurrence of the current token and copying the token after it. A two-layer attention-only
# Transformer learns this with an **induction head** (Olsson et al. 2022): a head in layer 1 that
# attends from `A` (second copy) to the token after the first `A`, helped by a **previous-token
# head** in layer 0. We train one for a minute and find the circuit with the tools:
#
# 1. hook points: every activation by name, read with `run_with_cache`;
# 2. training the model, and the induction head in the attention patterns;
# 3. ablation: knock each head out and measure the loss;
# 4. activation patching: which head carries the difference between a repeated and a random copy;
# 5. attribution: integrated gradients to the input tokens, and the logit lens.

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
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from attnlab import ModelConfig, build_model
from attnlab.inspect.ablation import ablate
from attnlab.inspect.attribution import integrated_gradients
from attnlab.inspect.hooks import run_with_cache
from attnlab.inspect.logit_lens import logit_lens
from attnlab.inspect.patching import activation_patching

torch.manual_seed(0)
torch.set_num_threads(1)  # small matrices: one thread wastes nothing, and the machine may be shared

# %% [markdown]
# ## 1. Hook points
#
# Every attnlab model, of every family and under every attention kernel, has named **hook
# points**: the residual stream before, between and after each layer's sublayers, each attention's
# per-head queries, keys, values, pattern and output, the feed-forward's hidden layer. A point is
# an identity module; hooks on it read what passes or replace it. With no hook on it, it costs
# nothing. `d_ff=0` makes every layer attention only.

# %%
VOCAB, BOS = 64, 0
config = ModelConfig(arch="decoder", vocab_size=VOCAB, d_model=64, num_layers=2, num_heads=4, d_ff=0,
                     dropout=0.0, norm_placement="pre", tie_embeddings=False, pad_token_id=None,
                     position={"scheme": "learned", "max_len": 41})
model = build_model(config)
points = model.hook_points()
print(len(points), "hook points; layer 1's:")
for name in points:
    if name.startswith("layers.1."):
        print("   ", name)

# %% [markdown]
# `run_with_cache` runs the model once and keeps every activation by name (all but the per-head
# results, which are large: name them to have them). Patterns come out as (batch, head, query,
# key) even though the default kernel is PyTorch's fused one, which never holds them: when asked,
# the layer computes them exactly on the side and leaves the output as it was.

# %%
ids = torch.randint(1, VOCAB, (2, 10))
logits, cache = run_with_cache(model, ids)
for name in ["hook_embed", "layers.0.self_attn.hook_q", "layers.0.self_attn.hook_pattern",
             "layers.0.self_attn.hook_z", "layers.1.hook_resid_post"]:
    print(f"{name:34s} {tuple(cache[name].shape)}")
with torch.no_grad():
    assert torch.equal(model(ids), logits)  # reading changed nothing

# %% [markdown]
# ## 2. Training, and the induction head in the patterns
#
# Each row is `[BOS, filler, r_1 .. r_n, r_1 .. r_n, filler]`: a fresh random segment of n
# distinct tokens (n from 6 to 16) shown twice, after 0 to 8 random tokens, so that neither a
# fixed offset nor an absolute position finds the copy: only the content does. The first copy
# cannot be predicted (chance is ln 63 = 4.14 nats); the second can, from the context. AdamW at
# 1e-3 after 50 warm-up steps, batches of 32 fresh rows, 900 steps (under a minute).

# %%
T = 41


def batch(size, generator, corrupt=False):
    """Rows with a repeated segment; `second` marks the logits that predict r_2 .. r_n of the second
    copy, `source` the key holding each one's answer (the token after the earlier occurrence).
    corrupt=True draws the second copy afresh: nothing to copy."""
    rows = torch.randint(1, VOCAB, (size, T), generator=generator)
    second = torch.zeros(size, T, dtype=torch.bool)
    source = torch.zeros(size, T, dtype=torch.long)
    for b in range(size):
        n = int(torch.randint(6, 17, (1,), generator=generator))
        start = 1 + int(torch.randint(0, 9, (1,), generator=generator))  # r_1's position in the first copy
        segment = torch.randperm(VOCAB - 1, generator=generator)[:n] + 1
        rows[b, 0], rows[b, start:start + n] = BOS, segment
        if not corrupt:
            rows[b, start + n:start + 2 * n] = segment
        t = torch.arange(start + n, start + 2 * n - 1)  # r_1 .. r_(n-1) of the second copy
        second[b, t], source[b, t] = True, t - n + 1
    return rows, second, source


def repeat_loss(model, rows, second, source=None):
    losses = F.cross_entropy(model(rows).transpose(1, 2)[..., :-1], rows[:, 1:], reduction="none")
    return losses[second[:, :-1]].mean()


gen = torch.Generator().manual_seed(0)
held_out = batch(128, torch.Generator().manual_seed(1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
curve, start = [], time.time()
for step in range(1, 901):
    for group in optimizer.param_groups:
        group["lr"] = 1e-3 * min(1.0, step / 50)
    rows, _, _ = batch(32, gen)
    loss = F.cross_entropy(model(rows)[:, :-1].transpose(1, 2), rows[:, 1:])
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if step % 25 == 0:
        with torch.no_grad():
            curve.append((step, repeat_loss(model.eval(), *held_out).item()))
        model.train()
model.eval()
print(f"900 steps in {time.time() - start:.0f} s; loss on the repeated copy {curve[0][1]:.2f} -> {curve[-1][1]:.2f}")
plt.figure(figsize=(5, 2.5))
plt.plot(*zip(*curve))
plt.xlabel("step"); plt.ylabel("loss on the repeat (nats)"); plt.title("the drop: the circuit forms")
plt.tight_layout(); plt.show()

# %% [markdown]
# The loss on the repeat falls little for a while, then drops within a few hundred steps: the
# phase change Olsson et al. saw. Which head does the copying? An induction head at position
# `A` (second copy) attends to the token after the first `A`, that is one position after the
# earlier occurrence of the current token. Its **induction score** is the mean pattern weight on
# exactly that key, read from the cache.

# %%
rows, second, source = held_out
_, cache = run_with_cache(model, rows, names="layers.*.self_attn.hook_pattern")


def induction_score(pattern):
    """Mean weight from each query in the second copy to the key right after its first occurrence."""
    b, t = second.nonzero(as_tuple=True)
    return pattern[b, :, t, source[b, t]].mean(0)  # (H,)


def previous_token_score(pattern):
    return pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, -1))  # weight on the key right before


for layer in range(2):
    pattern = cache[f"layers.{layer}.self_attn.hook_pattern"]
    print(f"layer {layer}: induction", [round(s, 2) for s in induction_score(pattern).tolist()],
          "| previous token", [round(s, 2) for s in previous_token_score(pattern).tolist()])
layer1 = cache["layers.1.self_attn.hook_pattern"]
best = int(induction_score(layer1).argmax())
plt.figure(figsize=(4, 4))
plt.imshow(layer1[0, best], cmap="Blues")
plt.title(f"layer 1 head {best} on one row"); plt.xlabel("key"); plt.ylabel("query")
plt.tight_layout(); plt.show()

# %% [markdown]
# In the second copy, the layer-1 head attends along a diagonal n - 1 positions behind the query:
# the token after the earlier occurrence. Layer 0 has heads that attend to the position before (the previous-token
# heads the induction head reads from).
#
# ## 3. Ablation: knock each head out
#
# A pattern is a hint, not a proof that the head matters. `ablate` replaces one head's output
# (`hook_z`, before the output projection) by zero, by its mean over a reference batch, or by
# another row's, and measures a metric; here the loss on the repeat.

# %%
def copy_logprob(rows, second):
    """The metric: the mean log-probability of the right next token over the second copy (minus its loss)."""
    def metric(logits):
        logp = logits[:, :-1].log_softmax(-1).gather(-1, rows[:, 1:, None])[..., 0]
        return logp[second[:, :-1]].mean()
    return metric


result = ablate(model, rows, copy_logprob(rows, second), "layers.*.self_attn.hook_z", by="head", method="mean",
                reference=batch(64, torch.Generator().manual_seed(2))[0])
print("loss on the repeat with nothing ablated:", round(-result.baseline, 3))
for name, row in zip(result.rows, result.values):
    print(f"{name:28s} each head mean-ablated:", [round(-v, 2) for v in row.tolist()])

# %% [markdown]
# ## 4. Activation patching: where the difference is carried
#
# Two inputs that differ in one thing: the *clean* rows repeat their segment, the *corrupted*
# ones have a fresh second copy (same first copy). Run the corrupted rows and copy one head's
# output from the clean run into it: if that alone brings back the prediction, the head carries
# it. The metric is the one above, the mean log-probability of the clean rows' next tokens over
# the second copy; `normalised()` maps the corrupted run to 0 and the clean one to 1.

# %%
clean_rows, second, source = batch(32, torch.Generator().manual_seed(3))
corrupted_rows, _, _ = batch(32, torch.Generator().manual_seed(3), corrupt=True)  # the same draws, but the copy
heads = activation_patching(model, clean_rows, corrupted_rows, copy_logprob(clean_rows, second),
                            "layers.*.self_attn.hook_z", by="head")
print(f"clean {heads.clean:.2f}, corrupted {heads.corrupted:.2f} (log-prob of the right token over the second copy)")
score = heads.normalised()
plt.figure(figsize=(4, 2))
plt.imshow(score, cmap="RdBu", vmin=-1, vmax=1)
plt.yticks(range(2), ["layer 0", "layer 1"]); plt.xlabel("head"); plt.colorbar(); plt.title("recovered by patching")
plt.tight_layout(); plt.show()
print("recovered per head:", [[round(v, 2) for v in row] for row in score.tolist()])

# %% [markdown]
# The layer-1 induction heads recover the answer; the layer-0 heads, which read the token at
# each position and not the copy, recover little: the corrupted and the clean runs differ at
# the second copy, but what layer 0 writes there only matters through layer 1.
#
# `attnlab inspect patch RUN --clean "..." --corrupted "..." --target ...` runs the same sweeps on
# a saved model from the command line and writes the heatmaps.
#
# ## 5. Attribution: which input tokens a prediction rests on
#
# Patching asks about components; attribution asks about inputs. **Integrated gradients**
# (Sundararajan et al. 2017) integrate the gradient of the prediction's log-probability along
# the straight path from a baseline (here zeros in place of the embeddings: the model has no pad
# token) to the real input, and multiply by the difference; the scores add up to f(input) -
# f(baseline), up to the quadrature error that `delta` reports. The circuit reads two tokens for
# a prediction in the second copy: the current one (A, to find its earlier occurrence) and the
# token after that occurrence (B, the answer, which it copies). Does the attribution say so?

# %%
table = {"current token A": [], "the answer B (copied)": [], "A's earlier occurrence": [], "any other (mean |score|)": []}
for b in range(8):
    t = int(second[b].nonzero()[3])  # the 4th predictable position of the second copy
    row, answer = clean_rows[b:b + 1], int(source[b, t])
    attribution = integrated_gradients(model, row, target=int(row[0, t + 1]), position=t, steps=32)
    scores = attribution.scores[0, :t + 1]
    others = [i for i in range(t + 1) if i not in (t, answer, answer - 1)]
    for key, value in zip(table, (scores[t], scores[answer], scores[answer - 1], scores[others].abs().mean())):
        table[key].append(round(float(value), 2))
    if b == 0:
        first = scores, t, answer, attribution.delta.item()
for key, values in table.items():
    print(f"{key:26s}", values)
scores, t, answer, delta = first
plt.figure(figsize=(8, 2))
plt.bar(range(t + 1), scores)
plt.axvline(answer, color="tab:red", ls="--"); plt.axvline(t, color="tab:green", ls="--")
plt.xlabel("input position"); plt.ylabel("attribution")
plt.title(f"row 0: integrated gradients (green: A, red: B; delta {delta:.1e})")
plt.tight_layout(); plt.show()

# %% [markdown]
# Integrated gradients give almost all of the credit to the current token, and to the answer a
# small score whose sign changes from row to row, although the induction heads attend to the
# answer and patching shows that their outputs carry it. The two answer different questions:
# along the path from all-zeros, the prediction changes most when the current token appears
# (without it there is nothing to look for); the copied token matters only once the match is
# found, near the end of
# the path. An attribution method is a choice of question (baseline, path, score), not a reading
# of the mechanism; Jain & Wallace (2019) and Wiegreffe & Pinter (2019) argue the same about
# attention weights.

# %% [markdown]
# **The logit lens** reads the residual stream after each layer through the final norm and the
# output head: what the model would predict if it stopped there. After layer 0 the stream holds
# the current token and its predecessor, not the answer; only after layer 1 (the induction
# heads) does the right token come out on top.

# %%
lens = logit_lens(model, clean_rows)  # (L, B, T, V)
targets = clean_rows[:, 1:]
mask = second[:, :-1]
for layer in range(lens.shape[0]):
    right = (lens[layer, :, :-1].argmax(-1) == targets)[mask].float().mean()
    print(f"after layer {layer}: the right next token is the top prediction at {right:.0%} of the second copy")

# %% [markdown]
# ## What next
#
# `docs/how-to/inspect.md` lists every hook point and the patching, ablation and attribution
# calls. The studies measure the same tools at full budget, in [the studies](../studies/index.md):
# the induction-heads study (when the circuit forms during training, with its loss bump), and the
# alignment study, which asks whether attention gives word alignment for free. Its answer: nearly,
# once a model translates. On held-out Bible verses the mean cross-attention of a Transformer that
# reaches BLEU 21 after 80 CPU-minutes scores an alignment error rate of 0.478 against the
# Strong's-number reference, where a statistical aligner scores 0.428 and the diagonal 0.731;
# integrated gradients align worse than that attention (0.525), and deleting the most-attended
# source word changes the translation more than deleting a random one (in 63 of 100 verses,
# against 22).

# %% [markdown]
# ## Exercises
#
# 1. **Keys or queries?** Path-patch each layer-0 head through the layer-1 heads' keys, then
#    their queries (`attnlab.inspect.path_patching.path_patching`, receivers
#    `"layers.1.self_attn.hook_k"` or `"..hook_q"`): through which does the previous-token head act?
# 2. **A shortcut.** Train with the segment always right after BOS (no filler in front) and look
#    at the patterns again: with absolute positions to lean on, the model may copy without an
#    induction head. Does ablation still single out one layer-0 head?
# 3. **When does it form?** Save the model every 100 steps (`attnlab.save`) and plot the layer-1
#    induction scores against the loss curve: the heads appear at the drop.
# 4. **Another baseline.** Integrated gradients from a baseline of random tokens' embeddings (pass
#    `baseline=` a (T, D) tensor): does the copied token get its credit now?
# 5. **From the command line.** `attnlab.save(model, "induct/")` (with a tokenizer of the 64
#    symbols) and `attnlab inspect patch` / `attnlab inspect attribute` on it.
