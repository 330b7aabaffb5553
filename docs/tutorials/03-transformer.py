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
# # 3. The Transformer, piece by piece
#
# A Transformer layer is a handful of small parts: scaled dot-product attention, several heads of
# it, masks, a position scheme, norms and residual connections, a feed-forward network. This
# tutorial takes attnlab's implementation of each part, shows what it does, and **checks it
# against PyTorch's own modules** — `F.scaled_dot_product_attention`, `nn.MultiheadAttention`,
# `nn.TransformerEncoderLayer` — with `torch.testing.assert_close`. If a check failed, the cell
# would raise.
#
# No training here: it runs in well under a minute on a CPU.

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
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

import attnlab
from attnlab.nn import FeedForward, MultiHeadAttention, TransformerLayer, make_norm
from attnlab.nn.kernels import build_kernel
from attnlab.nn.masks import causal_mask, padding_mask, prefix_lm_mask, window_mask

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## Scaled dot-product attention
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V$$
#
# attnlab computes it in an **attention kernel**, picked by name (`attention.kernel` in a
# config): `eager` materialises the T×T weights, `sdpa` calls PyTorch's fused
# `F.scaled_dot_product_attention`, `auto` takes the fused one whenever the variant allows. Both
# must agree with the formula and with PyTorch, with and without a mask:

# %%
B, H, T, Dh = 2, 4, 6, 8
q, k, v = torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh)
eager, sdpa = build_kernel("eager"), build_kernel("sdpa")

by_hand = torch.softmax(q @ k.transpose(-2, -1) / Dh**0.5, dim=-1) @ v
out_eager, weights = eager(q, k, v, scale=Dh**-0.5)
out_sdpa, _ = sdpa(q, k, v, scale=Dh**-0.5)
reference = F.scaled_dot_product_attention(q, k, v)
torch.testing.assert_close(out_eager, by_hand)
torch.testing.assert_close(out_eager, reference)
torch.testing.assert_close(out_sdpa, reference)

mask = causal_mask(T)  # bool, True = may attend
out_eager, _ = eager(q, k, v, scale=Dh**-0.5, mask=mask)
torch.testing.assert_close(out_eager, F.scaled_dot_product_attention(q, k, v, is_causal=True))
print("eager == sdpa == F.scaled_dot_product_attention, with and without a causal mask")

# %% [markdown]
# ## Multi-head attention
#
# h heads of size d/h each, concatenated, then an output projection: the same cost as one head of
# size d, but h different patterns. `attnlab.nn.MultiHeadAttention` keeps the q, k, v projections
# in one fused `qkv_proj` (q's heads, then k's, then v's) — exactly the layout of PyTorch's
# `in_proj_weight`, so the weights copy over one to one. Self-attention with a padding mask, then
# cross-attention, against `nn.MultiheadAttention`:

# %%
D, H = 32, 4
ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
ours = MultiHeadAttention(D, H, kernel="eager").eval()
cross = MultiHeadAttention(D, H, kernel="eager", cross_attention=True).eval()
with torch.no_grad():
    ours.qkv_proj.weight.copy_(ref.in_proj_weight)
    ours.qkv_proj.bias.copy_(ref.in_proj_bias)
    w_q, w_kv = ref.in_proj_weight.split([D, 2 * D])
    b_q, b_kv = ref.in_proj_bias.split([D, 2 * D])
    cross.q_proj.weight.copy_(w_q)
    cross.q_proj.bias.copy_(b_q)
    cross.kv_proj.weight.copy_(w_kv)
    cross.kv_proj.bias.copy_(b_kv)
    for m in (ours, cross):
        m.out_proj.load_state_dict(ref.out_proj.state_dict())

x, memory = torch.randn(3, 7, D), torch.randn(3, 9, D)
real = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])  # 1 = real token
with torch.no_grad():
    out, w = ours(x, mask=padding_mask(real), need_weights=True)
    expected, expected_w = ref(x, x, x, key_padding_mask=~real.bool(), average_attn_weights=False)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w, expected_w)

    out, _ = cross(x, memory)
    expected, _ = ref(x, memory, memory)
    torch.testing.assert_close(out, expected)
print("MultiHeadAttention == nn.MultiheadAttention: self-attention with padding (outputs and weights), cross-attention")
print("parameters: ours", sum(p.numel() for p in ours.parameters()), "| torch", sum(p.numel() for p in ref.parameters()))

# %% [markdown]
# Note the mask conventions: attnlab's masks say where a query **may** attend (True), PyTorch's
# `key_padding_mask` and bool `attn_mask` say where it may **not** — hence the `~`.
#
# ## Masks
#
# All of attnlab's masks are bool tensors broadcastable to (B, H, Tq, Tk), built outside a layer
# and passed in: causal (a decoder), padding (a batch of different lengths), prefix LM (a prefix
# seen both ways, the rest causally: T5's prefix LM, tutorial 4), a local window (Longformer-style,
# tutorial 6).

# %%
T = 8
masks = {
    "causal": causal_mask(T),
    "padding (5 real)": padding_mask(torch.tensor([[1] * 5 + [0] * 3]))[0, 0].expand(T, T),
    "prefix LM (prefix 3)": prefix_lm_mask(T, torch.tensor([3]))[0, 0],
    "window ±2": window_mask(T, 2),
    "causal & padding": causal_mask(T) & padding_mask(torch.tensor([[1] * 5 + [0] * 3]))[0, 0],
}
fig, axes = plt.subplots(1, len(masks), figsize=(14, 3))
for ax, (name, m) in zip(axes, masks.items()):
    ax.imshow(m, cmap="Greys", vmin=0, vmax=1)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("key")
axes[0].set_ylabel("query")
plt.show()

# %% [markdown]
# ## Positions: every scheme
#
# Attention alone is permutation-equivariant (tutorial 2), so word order must come from a
# position scheme. attnlab has them all behind one config field, `position.scheme`:
#
# | scheme | where it acts | paper |
# |---|---|---|
# | `sinusoidal` | added to the embeddings | Vaswani et al. 2017 |
# | `learned` | added to the embeddings | BERT, GPT |
# | `binary` | added: the bits of the index | — |
# | `relative` | a term on the scores (and values) per distance | Shaw et al. 2018 |
# | `rotary` | rotates q and k | Su et al. 2021 |
# | `alibi` | a bias −slope·\|i−j\| on the scores | Press et al. 2022 |
# | `t5_bias` | a learned bias per distance bucket | Raffel et al. 2020 |
#
# First the absolute codes, as the modules of `attnlab.nn.positions` produce them:

# %%
from attnlab.nn.positions import ALiBi, BinaryPositions, RotaryEmbedding, SinusoidalPositions, T5RelativeBias

pos = torch.arange(64)[None]
fig, axes = plt.subplots(1, 2, figsize=(11, 3))
axes[0].imshow(SinusoidalPositions(64)(pos)[0].T, aspect="auto", cmap="RdBu_r")
axes[0].set_title("sinusoidal: feature 2i = sin(t / 10000^(2i/d))")
axes[1].imshow(BinaryPositions(16, max_len=64)(pos)[0].T, aspect="auto", cmap="RdBu_r")
axes[1].set_title("binary: bit i of t as -1/+1")
for ax in axes:
    ax.set_xlabel("position t")
    ax.set_ylabel("feature")
plt.show()

# %% [markdown]
# The sinusoidal code has a property the paper points out: PE(t + k) is a fixed linear map of
# PE(t) (one 2×2 rotation per frequency), the same for every t — so relative offsets are easy for
# a linear layer to read. Build that map from the module's frequencies and check it far from 0:
#
# $$\begin{pmatrix}\sin(t+k)\omega\\ \cos(t+k)\omega\end{pmatrix} =
# \begin{pmatrix}\cos k\omega & \sin k\omega\\ -\sin k\omega & \cos k\omega\end{pmatrix}
# \begin{pmatrix}\sin t\omega\\ \cos t\omega\end{pmatrix}$$

# %%
sin = SinusoidalPositions(64)
offset = 5
M = torch.zeros(64, 64)  # PE(t) @ M = PE(t + offset): one rotation per frequency omega_i
for i, omega in enumerate(sin.inv_freq.tolist()):
    c, s_ = torch.cos(torch.tensor(offset * omega)), torch.sin(torch.tensor(offset * omega))
    M[2 * i, 2 * i], M[2 * i + 1, 2 * i] = c, s_  # sin((t+k)w) = sin(tw) cos(kw) + cos(tw) sin(kw)
    M[2 * i, 2 * i + 1], M[2 * i + 1, 2 * i + 1] = -s_, c  # cos((t+k)w) = cos(tw) cos(kw) - sin(tw) sin(kw)
for t0 in (0, 100, 1000):
    t = torch.arange(t0, t0 + 40)[None]
    torch.testing.assert_close(sin(t)[0] @ M, sin(t + offset)[0], atol=1e-4, rtol=1e-4)
print(f"PE(t + {offset}) = PE(t) @ M for t in 0..39, 100..139 and 1000..1039: one matrix for every t")

# %% [markdown]
# Rotary positions rotate q and k so that their dot product depends on the **offset** s − t
# only; ALiBi and T5 add a bias that depends on the offset too:

# %%
rope = RotaryEmbedding(head_dim=16)
qv, kv = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)


def rotary_score(s, t):
    return float(rope.rotate(qv, torch.tensor([[s]])) @ rope.rotate(kv, torch.tensor([[t]])).transpose(-2, -1))


print("rotary q_s . k_t for (s, t) = (3, 1), (10, 8), (50, 48):",
      [round(rotary_score(s, t), 4) for s, t in ((3, 1), (10, 8), (50, 48))])
assert abs(rotary_score(3, 1) - rotary_score(50, 48)) < 1e-4

T = 16
p = torch.arange(T)[None]
t5 = T5RelativeBias(num_heads=4, num_buckets=8, max_distance=16, bidirectional=True)
nn.init.normal_(t5.weight, std=1.0)  # trained values would be learned; random ones show the buckets
fig, axes = plt.subplots(1, 3, figsize=(11, 3))
alibi = ALiBi(4)(p, p)[0]  # (H, T, T): -slope_h * |i - j|, slopes 1/4, 1/16, 1/64, 1/256
axes[0].imshow(alibi[0], cmap="viridis", vmin=-3.75, vmax=0)  # one colour scale for both heads
axes[0].set_title("ALiBi bias, head 0 (slope 1/4)")
axes[1].imshow(alibi[3], cmap="viridis", vmin=-3.75, vmax=0)
axes[1].set_title("ALiBi bias, head 3 (slope 1/256)")
axes[2].imshow(t5(p, p)[0, 0].detach(), cmap="viridis")
axes[2].set_title("T5 bias: one value per bucket")
plt.show()

# %% [markdown]
# Now the schemes inside whole models. A property separates the two families: a **relative**
# scheme sees only offsets, so shifting every position id by the same amount leaves a decoder's
# output unchanged; an **absolute** one changes it. Build a tiny decoder per scheme with
# `attnlab.presets.get("tiny-decoder", position={"scheme": ...})` and test it:

# %%
ids = torch.randint(0, 100, (2, 12))
for scheme in ("none", "sinusoidal", "learned", "binary", "relative", "rotary", "alibi", "t5_bias"):
    torch.manual_seed(0)
    cfg = attnlab.presets.get("tiny-decoder", vocab_size=100, position={"scheme": scheme, "max_len": 128})
    model = attnlab.build_model(cfg).eval()
    with torch.no_grad():
        a = model(ids, position_ids=torch.arange(12)[None])
        b = model(ids, position_ids=torch.arange(12)[None] + 7)
    same = torch.allclose(a, b, atol=1e-5)
    print(f"{scheme:10s} output unchanged by a shift of every position: {same}")
    assert same == (scheme in ("none", "relative", "rotary", "alibi", "t5_bias"))

# %% [markdown]
# (`relative` clips offsets at `relative_max_distance` and `t5_bias` buckets them, so both are
# shift-invariant but stop distinguishing far offsets.) Which of them still works **past the
# trained length** is measured in the `positions` study of the [studies](../studies/index.md):
# ALiBi degrades least, sinusoidal most.
#
# ## Norms and their placement
#
# LayerNorm normalises each token's features to mean 0 and variance 1, then applies a gain and a
# bias; RMSNorm only divides by the root mean square. `attnlab.nn.make_norm` builds either, and
# they are PyTorch's own modules:

# %%
x = torch.randn(2, 5, 32) * 3 + 1
ln, rms = make_norm("layernorm", 32), make_norm("rmsnorm", 32)
with torch.no_grad():
    torch.testing.assert_close(ln(x), F.layer_norm(x, (32,)))
    torch.testing.assert_close(rms(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt())
    print("layernorm: mean", round(float(ln(x).mean()), 4), "variance", round(float(ln(x).var(-1, unbiased=False).mean()), 4),
          "| rmsnorm: mean square", round(float(rms(x).pow(2).mean()), 4))

# %% [markdown]
# Where the norm sits around each sublayer f is `norm_placement`:
#
# - `post` (the paper): x = Norm(x + f(x))
# - `pre` (GPT-2 and most models since): x = x + f(Norm(x)), with a final norm on the stack
# - `both` (NormFormer-style sandwich): x = x + Norm'(f(Norm(x)))
#
# ## One layer, checked against nn.TransformerEncoderLayer
#
# `attnlab.nn.TransformerLayer` composes self-attention, the feed-forward W₂ act(W₁x + b₁) + b₂,
# two residual blocks and their norms. Copy the weights of a PyTorch encoder layer into one, for
# both placements (`norm_first=True` is PyTorch's pre-LN), and compare with padding:

# %%
def copy_from_torch(ref, layer):
    with torch.no_grad():
        layer.self_attn.qkv_proj.weight.copy_(ref.self_attn.in_proj_weight)
        layer.self_attn.qkv_proj.bias.copy_(ref.self_attn.in_proj_bias)
        layer.self_attn.out_proj.load_state_dict(ref.self_attn.out_proj.state_dict())
        layer.ffn.w1.load_state_dict(ref.linear1.state_dict())
        layer.ffn.w2.load_state_dict(ref.linear2.state_dict())
        layer.self_attn_block.norm.load_state_dict(ref.norm1.state_dict())
        layer.ffn_block.norm.load_state_dict(ref.norm2.state_dict())


D, H, FF = 32, 4, 64
x = torch.randn(3, 7, D)
real = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
for placement, norm_first in (("post", False), ("pre", True)):
    for activation in ("relu", "gelu"):
        ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                         norm_first=norm_first).eval()
        for prm in ref.parameters():  # norms start at gain 1, bias 0: randomise so they matter
            nn.init.normal_(prm, std=0.3)
        layer = TransformerLayer(MultiHeadAttention(D, H), FeedForward(D, FF, activation),
                                 make_norm=lambda: make_norm("layernorm", D), placement=placement, dropout=0.0).eval()
        copy_from_torch(ref, layer)
        with torch.no_grad():
            ours = layer(x, padding_mask(real))
            expected = ref(x, src_key_padding_mask=~real.bool())
        keep = real.bool()  # PyTorch's fast path may leave padded rows as zeros: compare real tokens
        torch.testing.assert_close(ours[keep], expected[keep], atol=1e-5, rtol=1e-5)
        print(f"TransformerLayer(placement={placement!r}, {activation}) == "
              f"nn.TransformerEncoderLayer(norm_first={norm_first})")

# %% [markdown]
# The whole encoder-decoder is tested the same way against `nn.Transformer` in attnlab's test
# suite (`tests/parity/test_torch_transformer.py`).
#
# ## Sizes
#
# The paper's base model: N = 6, d_model = 512, d_ff = 2048, h = 8, a shared 37k BPE vocabulary,
# "65M" parameters; "big" is 1024 / 4096 / 16 heads, "213M". attnlab's presets count 63.1M and
# 214.2M with a 37,000-token vocabulary (the paper's exact vocabulary size is not given). Count the presets
# without allocating their weights (the meta device), and see where the FLOPs of a forward pass
# go with `attnlab.inspect.cost_table`:

# %%
for name in ("vaswani-base", "vaswani-big"):
    with torch.device("meta"):
        model = attnlab.build_model(attnlab.presets.get(name))
    print(f"{name:13s} {sum(p.numel() for p in model.parameters()):>12,d} parameters")

from attnlab.inspect import cost_table, crossover_seq_len

cfg = attnlab.presets.get("vaswani-base")
print("attention's T^2 terms overtake the T d^2 ones at T =", int(crossover_seq_len(cfg)))
print(f"{'first encoder layer, T = 4096':42s} {'parameters':>12s} {'GFLOPs':>8s}")
for row in cost_table(cfg, 4096)[1:5]:
    print(f"{row.name:42s} {row.params:12,d} {row.flops / 1e9:8.1f}")

# %% [markdown]
# ## Exercises
#
# 1. **A decoder layer.** Build a `TransformerLayer` with `cross_attn=MultiHeadAttention(D, H,
#    cross_attention=True)` and check it against `nn.TransformerDecoderLayer` (it has `norm1`,
#    `norm2`, `norm3` and `multihead_attn`; pass `memory=` and a causal mask).
# 2. **Sandwich norms.** `placement="both"` has no PyTorch counterpart. Write the expected output
#    by hand from the formula x + Norm'(f(Norm(x))) and compare.
# 3. **Grouped-query attention.** `MultiHeadAttention(D, 8, num_kv_heads=2)`: how many parameters
#    does `qkv_proj` hold now? Show that with `num_kv_heads=8` and the k/v weights of each group
#    copied into its heads it gives the same outputs.
# 4. **Labs.** The rotary-positions lab and the pre-LN layer lab (`attnlab lab start NAME`; the
#    [labs page](../labs.md) lists them) have you write `RotaryEmbedding.rotate` and the pre-LN
#    residual block; the checks are the properties used above (offset-only scores, equality with
#    `norm_first=True`).
