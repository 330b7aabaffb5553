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
# # 7. Vision: attention over image patches
#
# Attention is general purpose: nothing in a Transformer layer knows that its tokens are words.
# A Vision Transformer (ViT, Dosovitskiy et al. 2021) cuts an image into `P x P` patches, turns each
# patch into a vector with one linear map, puts a learned `[CLS]` vector in front, adds positions,
# and runs the same encoder layers a text model runs. A linear head on `[CLS]` classifies.
#
# This tutorial trains attnlab's `VisionEncoder` on real handwritten digits (scikit-learn's 8 x 8
# digits, 1,797 images, fetched from the scikit-learn wheel on PyPI without installing it), then
# looks at what it learned:
#
# 1. patches: the linear patch embedding is a convolution (checked against PyTorch's `Conv2d`);
# 2. training on the one training loop, beside a small MLP;
# 3. positions matter: shuffling the patches;
# 4. where `[CLS]` looks, layer by layer and head by head.

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
import json
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import Image, display
from torch import nn

from attnlab.data.images import load_digits, stratified_split
from attnlab.inspect.patch_maps import image_attention, on_grid, plot_cls_attention
from attnlab.models.vision import VisionConfig, VisionEncoder, patchify
from attnlab.training.config import TrainConfig
from attnlab.training.tasks.images import ImageClassificationTask, evaluate_images
from attnlab.training.trainer import Trainer

torch.manual_seed(0)
torch.set_num_threads(1)  # small matrices: one thread wastes nothing, and the machine may be shared
work = Path(tempfile.mkdtemp(prefix="attnlab-tutorial-07-"))

# %% [markdown]
# ## 1. Images as sequences of patches
#
# `load_digits` returns `(1797, 1, 8, 8)` images in `[0, 1]` and their labels; `stratified_split`
# holds out 20% with every class in the same proportion. With `P = 2` an image becomes
# `(8 / 2)^2 = 16` patches of 4 pixels: 17 tokens with `[CLS]`.

# %%
images, labels = load_digits()
train, test = stratified_split(labels, 0.2, seed=0)
print(f"images {tuple(images.shape)}, {len(train)} for training, {len(test)} held out")

P = 2
patches = patchify(images[:1], P)  # (B, N, C P P)
print("one image as patches:", tuple(patches.shape))

fig, axes = plt.subplots(1, 6, figsize=(11, 2))
for ax, i in zip(axes[:5], range(5)):
    ax.imshow(images[i, 0], cmap="gray_r"); ax.set_title(f"label {labels[i].item()}"); ax.axis("off")
grid = 8 // P
axes[5].imshow(images[0, 0], cmap="gray_r")
for r in range(grid):
    for c in range(grid):
        axes[5].text(c * P + 0.5, r * P + 0.5, str(1 + r * grid + c), color="tab:red", ha="center", va="center",
                     fontsize=8)
axes[5].set_xticks([x - 0.5 for x in range(0, 9, P)]); axes[5].set_yticks([y - 0.5 for y in range(0, 9, P)])
axes[5].grid(color="tab:blue"); axes[5].set_xticklabels([]); axes[5].set_yticklabels([])
axes[5].set_title("token of each patch")
plt.tight_layout(); plt.show()

# %% [markdown]
# The patch embedding is one `nn.Linear` over each flattened patch. `patchify` lays the pixels
# out channel-major, as `Conv2d` lays out its weight, so the embedding equals a convolution with
# kernel = stride = `P`. Checked against PyTorch:

# %%
torch.manual_seed(0)
vit_cfg = VisionConfig(image_size=8, patch_size=P, encoder={"num_layers": 2})
vit = VisionEncoder(vit_cfg)
conv = nn.Conv2d(1, vit_cfg.d_model, kernel_size=P, stride=P)
with torch.no_grad():
    conv.weight.copy_(vit.patch_embed.weight.reshape(conv.weight.shape))
    conv.bias.copy_(vit.patch_embed.bias)
    by_linear = vit.patch_embed(patchify(images[:8], P))  # (B, N, D)
    by_conv = conv(images[:8]).flatten(2).transpose(1, 2)  # (B, D, g, g) -> (B, N, D)
torch.testing.assert_close(by_linear, by_conv)
print("patch embedding == Conv2d(kernel=stride=P):", tuple(by_linear.shape))
print(f"ViT: {vit_cfg.encoder.num_layers} layers x {vit_cfg.d_model}, {vit_cfg.encoder.num_heads} heads, "
      f"{vit_cfg.seq_len} tokens, {sum(p.numel() for p in vit.parameters()):,} parameters")

# %% [markdown]
# ## 2. Training it
#
# Images go through the same `Trainer` as text: `ImageClassificationTask` supplies seeded batches
# and the cross-entropy loss, the `TrainConfig` the optimiser (AdamW), schedule (cosine with
# warm-up), evaluation and checkpoints. The budget here is 300 steps of 64 images, two layers
# of 64; `examples/vit_digits/` trains four layers for two minutes against a CNN and an MLP at
# equal wall-clock time (about 99% for each).

# %%
STEPS = 300


def train_vit(model, steps):
    task = ImageClassificationTask(images[train], labels[train], batch_size=64,
                                   valid=(images[test], labels[test]), seed=0)
    config = TrainConfig.from_dict({
        "optim": {"lr": 1e-3, "weight_decay": 0.05},
        "schedule": {"name": "cosine", "warmup_steps": 20},
        "train": {"out_dir": str(work / "vit"), "max_steps": steps, "eval_every": 50, "checkpoint_every": steps,
                  "log_every": steps, "seed": 0, "threads": 1, "precision": "fp32"}})
    trainer = Trainer(config, task=task, model=model, show_progress=False, log=lambda line: None)
    trainer.fit()
    rows = [json.loads(line) for line in (work / "vit" / "metrics.jsonl").read_text().splitlines()]
    return trainer.model.eval(), [(r["step"], r["accuracy"]) for r in rows if "accuracy" in r]


start = time.perf_counter()
torch.manual_seed(0)
vit, vit_curve = train_vit(VisionEncoder(vit_cfg), STEPS)
vit_seconds = time.perf_counter() - start

# The Trainer reads a model's ModelConfig (for the schedule and the MoE loss), which a bare
# nn.Sequential lacks: the MLP trains in a plain loop on the same task's batches.
start = time.perf_counter()
torch.manual_seed(0)
mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
task = ImageClassificationTask(images[train], labels[train], batch_size=64, valid=(images[test], labels[test]), seed=0)
opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3, weight_decay=0.05)
gen, mlp_curve = torch.Generator().manual_seed(0), []
for step in range(1, STEPS + 1):
    batch = task.train_batch(gen)
    loss = task.loss(mlp, batch).loss
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 50 == 0:
        mlp_curve.append((step, evaluate_images(mlp.eval(), images[test], labels[test])["accuracy"])); mlp.train()
mlp.eval()
mlp_seconds = time.perf_counter() - start

for name, model, seconds in [("ViT", vit, vit_seconds), ("MLP", mlp, mlp_seconds)]:
    result = evaluate_images(model, images[test], labels[test])
    print(f"{name}: test accuracy {result['accuracy']:.1%} after {STEPS} steps, {seconds:.0f} s")

plt.figure(figsize=(5, 3))
for name, curve in [("ViT", vit_curve), ("MLP", mlp_curve)]:
    steps, acc = zip(*curve)
    plt.plot(steps, acc, "o-", label=name)
plt.xlabel("step"); plt.ylabel("test accuracy"); plt.ylim(0, 1); plt.legend(); plt.tight_layout(); plt.show()

# %% [markdown]
# On 8 x 8 digits an MLP is as good and far cheaper: a ViT has no built-in notion that
# neighbouring pixels belong together, and learns it from data (the reason ViTs shine with
# large data sets and lose to CNNs on small ones). What the small budget shows: the same layers
# learn images; what it does not: any advantage of attention on images this small.
#
# ## 3. Positions carry the layout
#
# Without positions, self-attention is permutation-equivariant, and `[CLS]` sees a *set* of
# patches. The model above learned a position per token, so it should fail when the patches of a
# test image are shuffled (every image the same shuffle). The same shuffle leaves the MLP's
# pixels in a new order too, which it cannot undo either.

# %%
def shuffle_patches(batch, order):
    """Move patch `order[i]` of each image to place i (an image again: (B, C, S, S))."""
    B, C, S, _ = batch.shape
    g = S // P
    x = patchify(batch, P)[:, order]  # (B, N, C P P)
    x = x.reshape(B, g, g, C, P, P).permute(0, 3, 1, 4, 2, 5)  # (B, C, g, P, g, P)
    return x.reshape(B, C, S, S)


order = torch.randperm(grid * grid, generator=torch.Generator().manual_seed(0))
torch.testing.assert_close(shuffle_patches(images[:4], torch.arange(grid * grid)), images[:4])  # identity check
shuffled = shuffle_patches(images[test], order)
for name, model in [("ViT", vit), ("MLP", mlp)]:
    print(f"{name}: {evaluate_images(model, images[test], labels[test])['accuracy']:.1%} -> "
          f"{evaluate_images(model, shuffled, labels[test])['accuracy']:.1%} with the patches shuffled")

# %% [markdown]
# And the property itself, on a ViT built with `position.scheme: none`: permuting the patches
# leaves the logits (read at `[CLS]`) unchanged.

# %%
torch.manual_seed(0)
no_pos = VisionEncoder(VisionConfig(image_size=8, patch_size=P, encoder={"num_layers": 2,
                                                                          "position": {"scheme": "none"}})).eval()
with torch.no_grad():
    torch.testing.assert_close(no_pos(images[:16]), no_pos(shuffle_patches(images[:16], order)), rtol=1e-4, atol=1e-5)
print("without positions, [CLS] sees a set: shuffled patches give the same logits")

# %% [markdown]
# ## 4. Where `[CLS]` looks
#
# `image_attention` records every layer's attention weights on one image (the captured modules
# switch to the eager kernel; the outputs do not change). `plot_cls_attention` draws `[CLS]`'s row
# over the patch grid: one row per layer, one column per head, and the mean. It is what
# `attnlab inspect attention vit/ --image 3 --out maps` writes for a saved model.

# %%
index = test[3].item()
maps = image_attention(vit, images[index])
print({name: tuple(w.shape) for name, w in maps.items()}, "(heads, tokens, tokens)")
png = plot_cls_attention(images[index], maps, grid, work / "cls.png")
display(Image(filename=str(png)))

# %% [markdown]
# The same numbers, by hand: `on_grid` puts a row over the patches back where they were cut.
# Averaged over the test images of each class, the last layer's `[CLS]` attention shows which
# places of the image the model reads for each digit.

# %%
last = list(maps)[-1]
fig, axes = plt.subplots(1, 10, figsize=(13, 1.8))
for digit, ax in enumerate(axes):
    idx = test[labels[test] == digit][:20]
    rows = torch.stack([image_attention(vit, images[i], names=last)[last][:, 0].mean(0) for i in idx.tolist()])
    ax.imshow(on_grid(rows.mean(0), grid), cmap="viridis")
    ax.set_title(str(digit)); ax.axis("off")
fig.suptitle(f"{last}: [CLS] attention over the 4x4 patches, mean of 20 test images per class", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# Attention maps show where a model reads, not why it decides: the lectures' caveat (Jain &
# Wallace 2019; Wiegreffe & Pinter 2019) holds for images too. Tutorial 2 measures it.
#
# ## Exercises
#
# 1. **Bigger patches.** Train with `patch_size=4` (5 tokens): steps per second and accuracy
#    against `P = 2`. (`VisionConfig` in `attnlab/models/vision.py`)
# 2. **Pooling.** Set `encoder={"classifier_pooling": "mean"}` to classify from the mean of the
#    patches instead of `[CLS]`; what happens to the `[CLS]` maps, and to accuracy?
# 3. **Augmentation.** `ImageClassificationTask(..., max_shift=1)` shifts each training digit by up
#    to a pixel; compare shifted test images with and without it
#    (`attnlab.data.images.random_shift`).
# 4. **A kernel from tutorial 6.** Any attention kernel plugs into the ViT: try
#    `encoder={"attention": {"kernel": "local_block", "kernel_options": {"block_size": 5}}}` and look
#    at the maps — which patches can `[CLS]` still see?
# 5. **Save and inspect.** `attnlab.save(vit, "vit/")`, then
#    `attnlab inspect attention vit/ --image 3 --out vit_maps --html vit.html` for the
#    interactive viewer (`attnlab/inspect/patch_maps.py`).
