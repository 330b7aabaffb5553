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
# # 2. Attention
#
# Attention is a **soft lookup**: a query is compared with every key, the scores go through a
# softmax, and the output is the weighted average of the values. This tutorial takes the pieces
# one at a time with attnlab — the weights, the six score functions side by side, why scores are
# scaled by √d_k, attention as kernel regression, permutation equivariance — and then trains the
# two classic attentions of RNN translation models (Bahdanau's additive, Luong's multiplicative)
# on real English→German sentences and looks at their alignments.
#
# It runs on a CPU in about two minutes. The translation models train for a few hundred steps
# only; the [studies](../studies/index.md) train the same models for 40 CPU-minutes each.

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

import attnlab
from attnlab.nn.kernels import attention_weights
from attnlab.nn.scores import SCORES, build_score

torch.manual_seed(0)
torch.set_num_threads(1)  # small models: one thread avoids oversubscribing a shared CPU

# %% [markdown]
# ## A soft lookup
#
# A hard lookup returns the value of the one key that matches. Attention returns
# $\sum_i \alpha_i v_i$ with $\alpha = \mathrm{softmax}(f(q, k_1), \dots, f(q, k_n))$: every
# weight lies in (0, 1), they sum to 1, so the output is a convex combination of the values —
# it lies in their convex hull. `attnlab.nn.kernels.attention_weights` is that softmax (with an
# optional bool mask, True = may attend).

# %%
keys = torch.randn(5, 4)
values = torch.randn(5, 2)
query = keys[2] + 0.1 * torch.randn(4)  # close to key 2 (a dot product also favours long keys)

scores = keys @ query  # f(q, k_i) = q . k_i
alpha = attention_weights(scores)
print("weights:", [round(a, 3) for a in alpha.tolist()], " sum =", float(alpha.sum()))
soft = alpha @ values
best = int(scores.argmax())
print("soft lookup:", [round(v, 3) for v in soft.tolist()],
      f" hard lookup (key {best}, the highest score):", [round(v, 3) for v in values[best].tolist()])
assert torch.all(alpha > 0) and torch.isclose(alpha.sum(), torch.tensor(1.0))
assert torch.all(soft >= values.min(0).values) and torch.all(soft <= values.max(0).values)  # inside the hull's box

# %% [markdown]
# ## The score functions, side by side
#
# `attention.score` picks f(q, k) in a model config; `attnlab.nn.scores.SCORES` is the registry
# behind it. Each works on per-head tensors q (B, H, Tq, Dh), k (B, H, Tk, Dh):
#
# | name | f(q, k) |
# |---|---|
# | `dot` | q·k (Luong) |
# | `scaled_dot` | q·k / √d_k (Vaswani et al.) |
# | `cosine` | cos(q, k) / τ |
# | `general` | q W kᵀ (Luong), W learned |
# | `additive` | vᵀ tanh(W_q q + W_k k) (Bahdanau), learned |
# | `gaussian` | −‖q − k‖² / 2σ² |
#
# Same queries and keys, the six score matrices and the weights they give (the learned ones at
# their initialisation):

# %%
print("registered:", ", ".join(SCORES))
Dh = 16
q = torch.randn(1, 1, 6, Dh)
k = torch.randn(1, 1, 8, Dh)
fig, axes = plt.subplots(2, 6, figsize=(14, 4.2))
for col, name in enumerate(SCORES):
    score = build_score(name, num_heads=1, head_dim=Dh)
    with torch.no_grad():
        e = score(q, k)[0, 0]  # (Tq, Tk)
    w = attention_weights(e)
    axes[0, col].imshow(e, cmap="RdBu_r")
    axes[0, col].set_title(name)
    axes[1, col].imshow(w, cmap="viridis", vmin=0, vmax=1)
    axes[1, col].set_xlabel(f"max weight {w.max():.2f}")
    print(f"{name:10s} score range [{e.min():7.2f}, {e.max():7.2f}]   largest weight {w.max():.2f}")
axes[0, 0].set_ylabel("scores")
axes[1, 0].set_ylabel("weights")
for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# The unscaled dot product gives the largest scores and so the most peaked weights; the
# Gaussian score at σ = d_k^¼ differs from `scaled_dot` only by terms that depend on ‖k‖ (the
# ‖q‖ term cancels in the softmax), which is how attnlab runs it through the fused kernel.
# Check that claim in two lines:

# %%
gauss, scaled = build_score("gaussian", 1, Dh), build_score("scaled_dot", 1, Dh)
key_norm_term = -(k * k).sum(-1)[:, :, None, :] / (2 * gauss.sigma**2)
torch.testing.assert_close(attention_weights(gauss(q, k)), attention_weights(scaled(q, k) + key_norm_term))
print("softmax(gaussian) == softmax(scaled_dot - |k|^2 / 2 sigma^2)")

# %% [markdown]
# ## Why divide by √d_k
#
# With q and k of unit-variance entries, q·k is a sum of d_k products of variance 1, so
# var(q·k) = d_k. Large scores saturate the softmax (one weight near 1, gradients near 0).
# Measure it:

# %%
for d in (4, 16, 64, 256):
    qs, ks = torch.randn(20000, d), torch.randn(20000, d)
    dots = (qs * ks).sum(-1)
    print(f"d_k={d:4d}  var(q.k) = {dots.var():7.1f}   var(q.k / sqrt(d_k)) = {(dots / d**0.5).var():.2f}")

# %% [markdown]
# ## Attention as kernel regression
#
# Nadaraya and Watson (1964) predicted y at a new x as a weighted average of the training
# targets, weighted by a kernel of the distance between x and each training input. That is
# attention with queries = new points, keys = training inputs, values = targets and the Gaussian
# score: `attnlab.inspect.nadaraya_watson`. The bandwidth plays the part of the temperature.

# %%
from attnlab.inspect import nadaraya_watson
from attnlab.inspect.kernel_regression import toy_data, true_function

x_train, y_train = toy_data(50, seed=0)
x_query = torch.linspace(0, 5, 100)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
axes[0].plot(x_train, y_train, "o", ms=3, color="grey", label="training pairs (keys, values)")
axes[0].plot(x_query, true_function(x_query), "k--", lw=1, label="true function")
for h in (0.1, 0.5, 2.0):
    pred, weights = nadaraya_watson(x_query, x_train, y_train, bandwidth=h)
    mse = float(((pred - true_function(x_query)) ** 2).mean())
    axes[0].plot(x_query, pred, label=f"bandwidth {h} (MSE {mse:.2f})")
axes[0].legend(fontsize=7)
_, weights = nadaraya_watson(x_query, x_train, y_train, bandwidth=0.5)
axes[1].imshow(weights, aspect="auto", cmap="viridis")
axes[1].set_xlabel("training input (sorted)")
axes[1].set_ylabel("query")
axes[1].set_title("weights, bandwidth 0.5")
plt.tight_layout()
plt.show()

# %% [markdown]
# A narrow bandwidth follows the noise, a wide one averages the curve away: the same trade-off a
# score's scale sets in a Transformer.
#
# ## Self-attention, permutation and masks
#
# In self-attention the queries, keys and values are three linear maps of the same inputs:
# Q = XW_Q, K = XW_K, V = XW_V. `attnlab.nn.MultiHeadAttention` holds the three maps as one fused
# projection (`qkv_proj`). Without position information it cannot tell order: permuting the
# inputs permutes the outputs, nothing more.

# %%
from attnlab.nn import MultiHeadAttention, causal_mask

mha = MultiHeadAttention(32, num_heads=4).eval()
x = torch.randn(1, 7, 32)
perm = torch.randperm(7)
with torch.no_grad():
    out, _ = mha(x)
    out_perm, _ = mha(x[:, perm])
torch.testing.assert_close(out_perm, out[:, perm])
print("self-attention(permuted x) == permuted self-attention(x)")

# %% [markdown]
# A causal mask sets the scores of future positions to −∞ before the softmax, so their weights
# are exactly 0; a padding mask does the same for padding keys. Masks are bool, True = may
# attend, built outside the layer and passed in:

# %%
with torch.no_grad():
    _, w = mha(x, mask=causal_mask(7), need_weights=True)  # (B, H, Tq, Tk)
print("weights above the diagonal:", float(w[0].triu(diagonal=1).abs().max()))
print("rows sum to 1:", torch.allclose(w.sum(-1), torch.ones(1, 4, 7)))

# %% [markdown]
# [Tutorial 3](03-transformer.ipynb) takes multi-head attention, masks and positions apart and
# checks each against PyTorch's own modules.
#
# ## Alignment on real translation: Bahdanau and Luong
#
# Attention was invented for RNN translation models (Bahdanau et al. 2015): at each target step
# the decoder state scores every encoder state, and the context it reads is their weighted
# average. Plotting those weights gives an **alignment** between target and source words, for
# free. attnlab builds both classic variants as `arch="rnn_encoder_decoder"`:
#
# - `rnn.attention="additive"` (Bahdanau): the previous decoder state s_{t-1} scores
#   h_i with vᵀ tanh(W_s s + W_h h_i); the context feeds the step that makes s_t (a loop over
#   target steps);
# - `rnn.attention="general"` (Luong): the current state s_t scores h_i with s_tᵀ W h_i; the
#   context joins s_t in the output layer (all steps at once, faster).
#
# The data: attnlab's built-in `de-en` corpus (English→German sentences of the Ding
# dictionary, fetched from Debian into the cache on first use; `attnlab data fetch de-en` does the
# same). We keep short sentences (3-6 words each side) and train one byte-level BPE on both sides.

# %%
from attnlab.data.corpora import split_files
from attnlab.data.sources import read_pairs

files = split_files("de-en")  # fetches and caches the corpus the first time
pairs = list(read_pairs(files["train"]))
short = [(en, de) for en, de in pairs if 3 <= len(en.split()) <= 6 and 3 <= len(de.split()) <= 6]
print(f"{len(pairs)} training pairs, {len(short)} with 3-6 words on each side, e.g.")
for en, de in short[:3]:
    print("  ", en, "->", de)

tok = attnlab.Tokenizer.train([en for en, _ in short] + [de for _, de in short], kind="bpe",
                              vocab_size=1000, special_tokens=["<pad>", "<s>", "</s>"])
PAD, BOS, EOS = tok.pad_token_id, tok.bos_token_id, tok.eos_token_id
src_ids = tok.encode_batch([en for en, _ in short])
tgt_ids = tok.encode_batch([de for _, de in short])
print("vocabulary", tok.vocab_size, "| mean tokens per sentence: en",
      round(sum(map(len, src_ids)) / len(src_ids), 1), "de", round(sum(map(len, tgt_ids)) / len(tgt_ids), 1))

# %% [markdown]
# Training is a plain loop over attnlab's pieces: `attnlab.data.objectives.seq2seq` collates a
# batch for teacher forcing and `attnlab.training.tasks.batch_loss.batch_loss` is the loss `attnlab train`
# computes for this architecture. (`attnlab train` with `data.source: de-en` and
# `objective: seq2seq` runs the same thing with checkpoints, evaluation and BLEU.)

# %%
from attnlab.data.objectives import seq2seq
from attnlab.training.tasks.batch_loss import batch_loss

STEPS, BATCH = 250, 32


def build_translator(attention, seed=0):
    torch.manual_seed(seed)
    cfg = attnlab.ModelConfig(arch="rnn_encoder_decoder", vocab_size=tok.vocab_size, d_model=64, dropout=0.0,
                              rnn={"cell": "gru", "attention": attention, "hidden_size": 96})
    return attnlab.build_model(cfg)


def train_translator(attention, seed=0):
    model = build_translator(attention, seed)
    opt = torch.optim.Adam(model.parameters(), lr=4e-3)
    gen = torch.Generator().manual_seed(seed)
    losses, start = [], time.perf_counter()
    for _ in range(STEPS):
        idx = torch.randint(0, len(src_ids), (BATCH,), generator=gen).tolist()
        batch = seq2seq([src_ids[i] for i in idx], [tgt_ids[i] for i in idx], pad_id=PAD, bos_id=BOS, eos_id=EOS)
        loss = batch_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    print(f"{attention:9s} {STEPS} steps in {time.perf_counter() - start:.0f} s, "
          f"loss {sum(losses[:10]) / 10:.2f} -> {sum(losses[-10:]) / 10:.2f}")
    return model.eval(), losses


models, curves = {}, {}
for kind in ("additive", "general"):
    models[kind], curves[kind] = train_translator(kind)

# %% [markdown]
# Now the alignments. `attnlab.inspect.capture_attention` records the weights of the model's
# attention module (`"attention"` in a recurrent model) while it runs; the recurrent decoder's
# steps are joined into one (B, 1, T_target, T_source) tensor.

# %%
from attnlab.inspect import capture_attention

valid = [(en, de) for en, de in read_pairs(files["valid"]) if 3 <= len(en.split()) <= 6 and 3 <= len(de.split()) <= 6]
example = valid[:3]
batch = seq2seq(tok.encode_batch([en for en, _ in example]), tok.encode_batch([de for _, de in example]),
                pad_id=PAD, bos_id=BOS, eos_id=EOS)
fig, axes = plt.subplots(2, 3, figsize=(13, 7))
for row, (kind, model) in enumerate(models.items()):
    with torch.no_grad(), capture_attention(model, "attention") as record:
        model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"])
    weights = record["attention"][:, 0]  # (B, Tt, Ts)
    for col in range(len(example)):
        S, T = int(batch["src_mask"][col].sum()), int(batch["tgt_mask"][col].sum())
        src_tokens = [tok.decode([i]) for i in batch["src_ids"][col, :S].tolist()]
        # row t of the weights is the step that predicts target token t (labels), read from tgt_ids[t]
        tgt_tokens = [tok.decode([i]) for i in batch["labels"][col, :T].tolist()]
        ax = axes[row, col]
        ax.imshow(weights[col, :T, :S], cmap="Greys", vmin=0, vmax=1)
        ax.set_xticks(range(S), src_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(T), tgt_tokens, fontsize=7)
        if col == 0:
            ax.set_ylabel(f"{kind}: predicted German token")
plt.tight_layout()
plt.show()

# %% [markdown]
# How diagonal are they? English and German word order is close to monotone in short sentences,
# so a good alignment lies near the diagonal. One number for it: for every target step, how far
# (as a fraction of the source length) the most-attended source position lies from the diagonal,
# averaged over 200 held-out pairs. A uniform random choice of source position scores about
# 0.33; a perfectly diagonal alignment 0.

# %%
def diagonal_distance(model, pairs):
    batch = seq2seq(tok.encode_batch([en for en, _ in pairs]), tok.encode_batch([de for _, de in pairs]),
                    pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with torch.no_grad(), capture_attention(model, "attention") as record:
        model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"])
    weights = record["attention"][:, 0]
    distances = []
    for b in range(len(pairs)):
        S, T = int(batch["src_mask"][b].sum()), int(batch["tgt_mask"][b].sum())
        where = weights[b, :T, :S].argmax(-1).float() / (S - 1)
        diagonal = torch.arange(T).float() / (T - 1)
        distances.append(float((where - diagonal).abs().mean()))
    return sum(distances) / len(distances)


held_out = valid[:200]
print(f"untrained mean distance of the attended source position from the diagonal: "
      f"{diagonal_distance(build_translator('general').eval(), held_out):.3f}")
for kind, model in models.items():
    print(f"{kind:9s} mean distance of the attended source position from the diagonal: "
          f"{diagonal_distance(model, held_out):.3f}")

fig, ax = plt.subplots(figsize=(5, 3))
for kind, losses in curves.items():
    ax.plot(torch.tensor(losses).view(-1, 10).mean(1), label=kind)
ax.set_xlabel("steps / 10")
ax.set_ylabel("training loss")
ax.legend()
plt.show()

# %% [markdown]
# **What this budget shows, honestly.** After a few hundred steps the losses have dropped from
# ln(1000) ≈ 6.9 to somewhere above 4: the models have learned frequent words and the start of
# a sentence, not yet to translate. The alignments are correspondingly rough. Bahdanau's weights
# are still spread almost evenly over the source (so its argmax, and its distance above, are
# nearly arbitrary); Luong's lock onto the first word ("Ich" on "I", "Die" on the first piece of
# "Time") and then often rest on the final full stop or the end token — a model that has learned
# where sentences start and stop, not yet which word translates which. Both distances from the
# diagonal are only somewhat better than the untrained model's. Alignment emerges with training:
# the `rnn_vs_transformer` study in the [studies](../studies/index.md) trains these models for
# 40 CPU-minutes on Bible verses, where Luong's LSTM model reaches BLEU 24.8 on held-out verses.
# Whether attention *explains* a prediction is a further question (Jain & Wallace 2019; Wiegreffe &
# Pinter 2019): plotting weights is not measuring faithfulness.

# %% [markdown]
# ## Exercises
#
# 1. **Temperature.** Build `build_score("cosine", 1, Dh, cosine_temperature=t)` for t = 1, 0.1,
#    0.01 and plot the weights as above. Which t gives a hard lookup?
# 2. **Scaling in a model.** Train two `tiny-decoder` presets with `attention={"score": "dot"}` and
#    `"scaled_dot"` at `d_model=256, num_heads=2` (head size 128). Compare the entropy of their
#    attention with `attnlab.inspect.attention_entropy`.
# 3. **Longer training.** Raise `STEPS` to 2000 and re-plot the alignments; rerun
#    `diagonal_distance`. How many steps until Luong's alignments are clearly diagonal? Does
#    Bahdanau's follow at the same step count, and at the same wall-clock time?
# 4. **A bidirectional encoder.** Add `"bidirectional": True` to the `rnn` section (Bahdanau et al.
#    used one). Does the alignment improve at the same budget?
# 5. **Write the kernel.** The scaled dot-product attention lab (`attnlab lab start NAME`; the
#    [labs page](../labs.md) lists the names) has you write the softmax-weighted sum this tutorial
#    used, and checks it against PyTorch's `F.scaled_dot_product_attention`.
