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
# # 1. RNNs and their limits
#
# Before attention there were recurrent networks. This tutorial builds them with attnlab and
# measures the three limits that motivated the Transformer:
#
# 1. **the sequential step**: `h_t` needs `h_{t-1}`, so a sequence of T tokens takes T steps
#    one after the other;
# 2. **vanishing (and exploding) gradients**: the loss at step t reaches step k through a
#    product of t - k Jacobians;
# 3. **the bottleneck**: an encoder-decoder that squeezes the whole source into one vector
#    forgets long inputs.
#
# Everything runs on a CPU in about a minute. The numbers here come from small, seeded
# budgets; the [studies](../studies/index.md) repeat the comparisons on real translation data at
# full budget.

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
from attnlab.nn.rnn import ConvEncoder, ExplicitRNN, RNNCell

torch.manual_seed(0)
torch.set_num_threads(1)  # small models: one thread avoids oversubscribing a shared CPU

# %% [markdown]
# ## The recurrence
#
# An Elman RNN keeps one hidden vector and updates it token by token:
#
# $$h_t = \tanh(W_h h_{t-1} + W_x x_t + b)$$
#
# `attnlab.nn.rnn.RNNCell` is that line; `ExplicitRNN` unrolls it in a Python loop and returns
# every `h_t` as its own tensor, so we can ask autograd about each one later.

# %%
cell = RNNCell(input_size=8, hidden_size=16)
x = torch.randn(2, 5, 8)  # (B, T, I)
h = torch.zeros(2, 16)
for t in range(x.shape[1]):  # the sequential step: t + 1 waits for t
    h = cell(x[:, t], h)

rnn = ExplicitRNN(8, 16)
rnn.cell.load_state_dict(cell.state_dict())
outputs, states = rnn(x)
print("outputs", tuple(outputs.shape), "| states:", len(states), "tensors of", tuple(states[0].shape))
torch.testing.assert_close(states[-1], h)  # the module is exactly the loop above
print("last state equals the hand-written loop")

# %% [markdown]
# PyTorch's `nn.RNN` computes the same function with fused kernels. `attnlab.nn.rnn.RecurrentLayer`
# wraps `nn.RNN` / `nn.LSTM` / `nn.GRU` for padded batches; check that the Elman cell matches
# `nn.RNN` when the weights are copied (torch keeps two biases, we keep one):

# %%
ref = torch.nn.RNN(8, 16, batch_first=True)
with torch.no_grad():
    ref.weight_ih_l0.copy_(cell.w_x.weight)
    ref.weight_hh_l0.copy_(cell.w_h.weight)
    ref.bias_ih_l0.copy_(cell.w_x.bias)
    ref.bias_hh_l0.zero_()
    expected, _ = ref(x)
torch.testing.assert_close(outputs, expected)
print("ExplicitRNN == torch.nn.RNN")

# %% [markdown]
# ## Limit 1: the sequential step
#
# However wide the machine, step t cannot start before step t - 1 has finished. A
# self-attention layer computes all T positions in one batch of matrix products. Time both on
# the same input as T grows (one layer each, width 128, one thread):

# %%
from attnlab.nn import FeedForward, MultiHeadAttention, TransformerLayer
from attnlab.nn.masks import causal_mask
from attnlab.nn.norms import make_norm

D = 128
lstm = torch.nn.LSTM(D, D, batch_first=True)
layer = TransformerLayer(MultiHeadAttention(D, 4), FeedForward(D, 4 * D),
                         make_norm=lambda: make_norm("layernorm", D), placement="pre", dropout=0.0)


def best_time(fn, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


lengths = [32, 64, 128, 256, 512]
rnn_ms, attn_ms = [], []
with torch.no_grad():
    for T in lengths:
        xs = torch.randn(8, T, D)
        mask = causal_mask(T)
        rnn_ms.append(1000 * best_time(lambda: lstm(xs)))
        attn_ms.append(1000 * best_time(lambda: layer(xs, mask)))
for T, r, a in zip(lengths, rnn_ms, attn_ms):
    print(f"T={T:4d}  LSTM {r:7.2f} ms   Transformer layer {a:7.2f} ms   ratio {r / a:5.1f}x")

fig, ax = plt.subplots(figsize=(5, 3.2))
ax.plot(lengths, rnn_ms, "o-", label="LSTM (T sequential steps)")
ax.plot(lengths, attn_ms, "s-", label="Transformer layer (all positions at once)")
ax.set_xlabel("sequence length T")
ax.set_ylabel("forward time (ms, batch 8)")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.legend()
plt.show()

# %% [markdown]
# Note that on one CPU thread the LSTM is *not* slower. Its step costs about
# 8·D² multiply-adds per token, one Transformer layer about 12·D² (attention projections and a
# feed-forward four times as wide) plus T·D for the scores, which is why the layer's curve bends
# upward at large T (attention is O(T²)). What the plot cannot show on one thread is the
# **sequential depth**: the LSTM's T steps must run one after another, whatever the hardware,
# while the layer's T positions are one batch of matrix products that spreads over every core of
# a GPU. That is the systems argument for the Transformer, and [tutorial 8](08-scale.ipynb)
# measures step time against cores.
#
# A word-window (1-D convolution) encoder is parallel over positions too, but two tokens T apart
# only meet after about T / (w // 2) layers:

# %%
conv = ConvEncoder(d_model=32, window=3, num_layers=2)
for distance in (4, 16, 64):
    print(f"tokens {distance:3d} apart: {conv.layers_to_connect(distance):3d} layers of a width-3 convolution")

# %% [markdown]
# ## Limit 2: vanishing and exploding gradients
#
# Backpropagation through time multiplies one Jacobian per step:
#
# $$\frac{\partial h_t}{\partial h_k} = \prod_{j=k+1}^{t} \mathrm{diag}(\tanh'(a_j))\, W_h,
# \qquad \left\lVert\frac{\partial h_t}{\partial h_k}\right\rVert \le \big(\sigma_{\max}(W_h)\big)^{t-k}$$
#
# `attnlab.inspect.gradient_flow` measures it rather than stating it: it runs a random
# sequence through a model, takes a loss on the **last** output only and returns
# ‖∂L/∂h_k‖ for every position k. `spectral_norm` sets W_h to that multiple of a random
# orthogonal matrix, so σ_max(W_h) is exactly the number given.

# %%
from attnlab.inspect import gradient_flow

T = 60
flows = {
    "tanh RNN, sigma=0.9": gradient_flow("rnn", seq_len=T, spectral_norm=0.9),
    "tanh RNN, sigma=1.1": gradient_flow("rnn", seq_len=T, spectral_norm=1.1),
    "linear RNN, sigma=0.9": gradient_flow("linear_rnn", seq_len=T, spectral_norm=0.9),
    "linear RNN, sigma=1.1": gradient_flow("linear_rnn", seq_len=T, spectral_norm=1.1),
    "LSTM (torch's init)": gradient_flow("lstm", seq_len=T),
    "Transformer (2 pre-LN layers)": gradient_flow("transformer", seq_len=T),
}
fig, ax = plt.subplots(figsize=(6.5, 3.8))
for name, norms in flows.items():
    ax.plot(range(T - 1, -1, -1), norms, label=name)
ax.set_yscale("log")
ax.set_xlabel("distance from the loss, t - k")
ax.set_ylabel("||dL/dh_k||")
ax.legend(fontsize=8)
plt.show()
for name, norms in flows.items():
    print(f"{name:32s} near end {norms[-1]:9.3g}   30 steps back {norms[-31]:9.3g}   "
          f"59 steps back {norms[0]:9.3g}")

# %% [markdown]
# Read the plot from left (the position of the loss) to right (the start of the sequence):
#
# - The **linear RNN** follows the bound exactly: ×0.9 per step vanishes (0.9³⁰ ≈ 0.04),
#   ×1.1 per step explodes (1.1³⁰ ≈ 17). Check it:

# %%
lin = flows["linear RNN, sigma=0.9"]
print("measured decay over 30 steps:", float(lin[-31] / lin[-1]), " bound 0.9**30 =", 0.9**30)
lin = flows["linear RNN, sigma=1.1"]
print("measured growth over 30 steps:", float(lin[-31] / lin[-1]), " bound 1.1**30 =", 1.1**30)

# %% [markdown]
# - The **tanh RNN** vanishes even at σ = 1.1: tanh' < 1 wherever the units are not at zero,
#   so the effective factor per step stays below one. (It can still explode with larger W_h.)
# - The **LSTM** vanishes too here, freshly initialised: its additive cell path only carries
#   gradient far when the forget gate is near 1, which training (or a forget-gate bias of 1)
#   arranges. The gates *allow* long memory; they do not guarantee it.
# - The **Transformer** connects every position to the loss through one attention step: the
#   gradient does not decay with distance — position 0 gets as much as the position just before
#   the loss (the last position's own input gets more, through the residual path).
#
# On a trained translation model, `attnlab.inspect.source_gradient_norms` measures how much of
# the target's loss reaches each source word; the `rnn_vs_transformer` study in the
# [studies](../studies/index.md) reports it (the plain RNN's far end gets 0.22 of its near end's).

# %% [markdown]
# ## Limit 3: the fixed-size bottleneck
#
# An encoder-decoder without attention (Sutskever et al. 2014, Cho et al. 2014) hands the decoder
# one vector: the encoder's last state. `attnlab` builds it with `arch="rnn_encoder_decoder"` and
# `rnn.attention="none"`; the same model with `"additive"` (Bahdanau) or `"dot"` (Luong) lets
# the decoder look at every encoder state instead. The summary has the same size for a 3-word and
# a 300-word source:

# %%
cfg = attnlab.ModelConfig(arch="rnn_encoder_decoder", vocab_size=20, d_model=32, dropout=0.0,
                          rnn={"cell": "gru", "attention": "none", "hidden_size": 64})
model = attnlab.build_model(cfg)
for S in (3, 300):
    memory = model.encode(torch.randint(3, 20, (1, S)))
    print(f"source of {S:3d} tokens -> memory {tuple(memory.shape)} -> summary {tuple(model.summary(memory).shape)}")

# %% [markdown]
# Does the bottleneck hurt? Train both kinds for the same few hundred steps on a task where
# every output token depends on one far-away input token: **reverse a random sequence** of 4 to
# 24 symbols. Batches come from `attnlab.data.objectives.seq2seq` (teacher forcing: start token +
# target in, target + end token as labels) and the loss from `attnlab.training.tasks.batch_loss.batch_loss`,
# the function `attnlab train` calls.

# %%
from attnlab.data.objectives import seq2seq
from attnlab.training.tasks.batch_loss import batch_loss

V, PAD, BOS, EOS = 20, 0, 1, 2  # symbols 3..19


def reversal_batch(n, generator, shortest=4, longest=24):
    lengths = torch.randint(shortest, longest + 1, (n,), generator=generator).tolist()
    src = [torch.randint(3, V, (L,), generator=generator).tolist() for L in lengths]
    return seq2seq(src, [s[::-1] for s in src], pad_id=PAD, bos_id=BOS, eos_id=EOS)


def train_reverser(attention, steps=200, seed=0):
    torch.manual_seed(seed)
    cfg = attnlab.ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=32, dropout=0.0,
                              rnn={"cell": "gru", "attention": attention, "hidden_size": 64})
    model = attnlab.build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss = batch_loss(model, reversal_batch(32, gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def accuracy_by_length(model, lengths=range(4, 25, 4)):
    batch = reversal_batch(600, torch.Generator().manual_seed(123))
    with torch.no_grad():
        pred = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"]).argmax(-1)
    real = batch["labels"] != -100
    correct = (pred == batch["labels"]) & real
    src_len = batch["src_mask"].sum(1) - 1  # without the end token
    return {L: float(correct[src_len == L].sum() / real[src_len == L].sum()) for L in lengths}


start = time.perf_counter()
results = {name: accuracy_by_length(train_reverser(kind))
           for name, kind in [("GRU, bottleneck", "none"), ("GRU + Luong (dot) attention", "dot")]}
print(f"trained both in {time.perf_counter() - start:.0f} s")
fig, ax = plt.subplots(figsize=(5, 3.2))
for name, acc in results.items():
    ax.plot(list(acc), list(acc.values()), "o-", label=name)
    print(name, {L: round(a, 2) for L, a in acc.items()})
ax.set_xlabel("source length")
ax.set_ylabel("token accuracy (teacher forced)")
ax.set_ylim(0, 1.02)
ax.legend()
plt.show()

# %% [markdown]
# At this budget (200 steps of 32 sequences, seconds of CPU) the bottleneck model's accuracy
# falls as the sources get longer, while the model with attention keeps more of them right:
# its decoder looks up the one source position it needs instead of recovering it from a single
# vector. What this small run does **not** show: how the two compare on real text, at equal
# training time, against the Transformer — that is the `rnn_vs_transformer` study in the
# [studies](../studies/index.md) (on Bible verses, LSTM + Luong attention ties the Transformer at
# 40 CPU-minutes; the bottleneck LSTM stays far behind). [Tutorial 2](02-attention.ipynb) opens
# the attention itself.

# %% [markdown]
# ## Exercises
#
# 1. **Exploding gradients in a tanh RNN.** Call `gradient_flow("rnn", spectral_norm=s)` for
#    s = 1.5, 2, 4. At what s does the gradient 30 steps back exceed the one at the loss? Why does
#    tanh's saturation keep it from growing like the linear RNN's?
# 2. **An LSTM that remembers.** `attnlab.nn.rnn.ExplicitLSTM` wraps `nn.LSTMCell`. Set the
#    forget-gate part of its biases (`cell.bias_ih[H:2H]`) to 1 or 3 and measure ‖∂L/∂h_k‖ with
#    `attnlab.inspect.state_gradient_norms` as `gradient_flow` does. How far back does the
#    gradient now reach?
# 3. **Longer sources than trained.** Train `train_reverser("dot")` on lengths 4-12 only
#    (`reversal_batch(..., longest=12)`) and measure `accuracy_by_length` up to 24. RNNs do not
#    generalise far past their training lengths; the `positions` study in the
#    [studies](../studies/index.md) measures the same question for Transformer position schemes.
# 4. **Other cells.** Swap `rnn.cell` for `"lstm"`, `"rnn"` or `"conv"` (the word-window encoder)
#    and `rnn.attention` for `"additive"` (Bahdanau) in `train_reverser`. Which cell suffers most
#    from the bottleneck?
