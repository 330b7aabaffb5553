"""A Vision Transformer against a CNN and an MLP on scikit-learn's 8 x 8 digits, at equal
wall-clock time.

The lecture's "break the image into units": a ViT (attnlab.models.vision) reads an 8 x 8 digit
as 16 patches of 2 x 2 pixels (or 4 of 4 x 4) after a [CLS] vector, through attnlab's own encoder
layers, and classifies from [CLS]. The baselines see the pixels directly: a small CNN (two 3 x 3
convolutions, max-pooling, two linear layers) and an MLP (64 -> 384 -> 256 -> 10), each of about
the ViT's parameter count. Every model trains for the same number of seconds of its own training
steps (evaluation is not charged), with the same data, batches, augmentation, optimiser and a
learning-rate schedule that runs on the fraction of the budget spent, so each completes it.

    OMP_NUM_THREADS=1 python examples/vit_digits/run.py --minutes 2 --out-dir examples/vit_digits

Writes OUT/results.json (test accuracy, parameters, steps, seconds, load average per model, and
the test accuracy at each tenth of the budget) and OUT/attention.png (the ViT's [CLS] attention
over the patches, per layer and rolled out, for one test digit of each of several classes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.data.images import load_digits, stratified_split
from attnlab.inspect.attention_maps import capture_attention
from attnlab.models.vision import VisionConfig, VisionEncoder, default_encoder
from attnlab.training.tasks.images import ImageClassificationTask, evaluate_images
from attnlab.training.optim import build_optimizer


class ConvNet(nn.Module):
    """conv3x3(32) -> ReLU -> conv3x3(64) -> ReLU -> maxpool 2 -> Linear(1024, 128) -> ReLU ->
    Dropout -> Linear(128, 10): LeNet's shape at the digits' size."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                                      nn.ReLU(), nn.MaxPool2d(2))  # (B, 64, 4, 4)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Dropout(dropout),
                                        nn.Linear(128, num_classes))

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(images))


class MLP(nn.Module):
    """The 64 pixels through two hidden ReLU layers: no notion of neighbouring pixels at all."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 384), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(384, 256), nn.ReLU(), nn.Dropout(dropout), nn.Linear(256, num_classes))

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)


def vit(patch_size: int) -> VisionEncoder:
    """attnlab's default ViT encoder (4 layers x 64, 4 heads, GELU, pre-LN, learned positions)."""
    return VisionEncoder(VisionConfig(image_size=8, patch_size=patch_size, channels=1, encoder=default_encoder(10)))


MODELS = {"vit_p2": lambda: vit(2), "vit_p4": lambda: vit(4), "cnn": ConvNet, "mlp": MLP}


def lr_factor(fraction: float, warmup: float = 0.05, min_ratio: float = 0.1) -> float:
    """Linear warm-up over the first `warmup` of the budget, then cosine to `min_ratio`; by the
    fraction of the time budget spent, so every model ends its schedule when its time is up."""
    if fraction < warmup:
        return fraction / warmup
    progress = min(1.0, (fraction - warmup) / (1 - warmup))
    return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * progress)) / 2


def train_for(model: nn.Module, task: ImageClassificationTask, seconds: float, test: tuple[Tensor, Tensor], *,
              lr: float, weight_decay: float, seed: int, checkpoints: int = 10) -> dict:
    """Train until `seconds` of training steps have passed; evaluate on `test` at every tenth."""
    opt = build_optimizer(model, "adamw", lr, betas=(0.9, 0.999), weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed + 1)  # the shifts: the same stream for every model
    spent, steps, curve, next_eval = 0.0, 0, [], seconds / checkpoints
    load_before = os.getloadavg()
    wall = time.perf_counter()
    model.train()
    while spent < seconds:
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr * lr_factor(spent / seconds)
        loss = task.loss(model, task.train_batch(gen)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        spent += time.perf_counter() - start
        steps += 1
        if spent >= next_eval or spent >= seconds:  # not charged to the budget
            curve.append([round(spent, 1), round(evaluate_images(model, *test)["accuracy"], 4)])
            next_eval += seconds / checkpoints
    final = evaluate_images(model, *test)
    return {"steps": steps, "images_seen": steps * task.batch_size, "train_seconds": round(spent, 1),
            "wall_seconds": round(time.perf_counter() - wall, 1), "last_train_loss": round(float(loss.detach()), 4),
            "test_accuracy": round(final["accuracy"], 4), "test_loss": round(final["val_loss"], 4),
            "test_errors": round((1 - final["accuracy"]) * len(test[1])), "curve": curve,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


# ---- attention over the patches ----------------------------------------------------------------

@torch.no_grad()
def cls_attention(model: VisionEncoder, images: Tensor) -> tuple[Tensor, Tensor]:
    """The [CLS] query's attention over the patches, averaged over heads, per layer (B, L, N),
    and rolled out through the layers (B, N): Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928,
    with each layer's map averaged with the identity for the residual path and rows renormalised."""
    model.eval()
    with capture_attention(model, "layers.*.self_attn") as record:
        model(images)
    maps = [record[f"layers.{i}.self_attn"].mean(1) for i in range(len(model.layers))]  # each (B, T, T)
    per_layer = torch.stack([m[:, 0, 1:] for m in maps], 1)  # (B, L, N)
    eye = torch.eye(maps[0].shape[-1])
    rolled = eye.expand_as(maps[0])
    for m in maps:
        a = (m + eye) / 2
        rolled = (a / a.sum(-1, keepdim=True)) @ rolled
    return per_layer, rolled[:, 0, 1:]


def plot_attention(model: VisionEncoder, images: Tensor, labels: Tensor, path: Path) -> None:
    """One row per digit: the digit, then the [CLS] attention over the patch grid in each layer
    and rolled out, with the digit's outline drawn over each map."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # off-screen (Agg), no pyplot state
    from matplotlib.figure import Figure

    from attnlab.inspect.plots import save_figure

    per_layer, rolled = cls_attention(model, images)
    preds = model(images).argmax(-1)
    g, P = model.config.grid, model.config.patch_size
    B, L = per_layer.shape[:2]
    fig = Figure(figsize=(1.6 * (L + 2), 1.7 * B), dpi=100)
    FigureCanvasAgg(fig)
    titles = ["digit"] + [f"layer {i + 1}" for i in range(L)] + ["rollout"]
    for b in range(B):
        maps = [per_layer[b, i] for i in range(L)] + [rolled[b]]
        for col in range(L + 2):
            ax = fig.add_subplot(B, L + 2, b * (L + 2) + col + 1)
            ax.set_xticks([])
            ax.set_yticks([])
            if b == 0:
                ax.set_title(titles[col], fontsize=9)
            if col == 0:
                ax.imshow(images[b, 0], cmap="gray_r", vmin=0, vmax=1)
                ax.set_ylabel(f"{int(labels[b])} (pred {int(preds[b])})", fontsize=9)
                continue
            grid = maps[col - 1].view(g, g).repeat_interleave(P, 0).repeat_interleave(P, 1)  # (8, 8) pixels
            ax.imshow(grid, cmap="viridis")
            ax.contour(images[b, 0], levels=[0.4], colors="white", linewidths=0.8)
    fig.suptitle(f"ViT {P}x{P} patches: [CLS] attention over the {g * g} patches (mean over heads)", fontsize=10)
    save_figure(fig, path)


def one_per_class(labels: Tensor, classes: int) -> Tensor:
    return torch.stack([(labels == c).nonzero()[0, 0] for c in range(classes)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=2.0, help="training time per model (default 2)")
    p.add_argument("--models", nargs="+", default=["vit_p2", "cnn", "mlp"], choices=list(MODELS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--max-shift", type=int, default=0,
                   help="random translation of training digits, in pixels (default 0: none)")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--plot-digits", type=int, default=6, help="test digits (one per class) in attention.png")
    p.add_argument("--wheel", help="a scikit-learn wheel already on disk (else pip downloads the pinned one)")
    p.add_argument("--out-dir", default="runs/vit_digits")
    args = p.parse_args()
    if args.minutes <= 0:
        p.error(f"--minutes must be > 0, got {args.minutes}")
    torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    images, labels = load_digits(args.wheel)
    train, test = stratified_split(labels, args.test_fraction, seed=args.seed)
    test_set = (images[test], labels[test])
    print(f"digits: {len(train)} train, {len(test)} test; {args.minutes:g} min per model; "
          f"{args.threads} thread(s); load average {os.getloadavg()}", flush=True)
    rows, vit_model = [], None
    for name in args.models:
        torch.manual_seed(args.seed)
        model = MODELS[name]()
        task = ImageClassificationTask(images[train], labels[train], batch_size=args.batch_size, seed=args.seed,
                                       max_shift=args.max_shift)
        row = {"model": name, "params": sum(p.numel() for p in model.parameters()),
               **train_for(model, task, 60 * args.minutes, test_set, lr=args.lr, weight_decay=args.weight_decay,
                           seed=args.seed)}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
        if vit_model is None and isinstance(model, VisionEncoder):
            vit_model = model
    if vit_model is not None:
        pick = test[one_per_class(labels[test], 10)][:args.plot_digits]
        plot_attention(vit_model, images[pick], labels[pick], out / "attention.png")
    print("\n| model | params | steps | train s | test accuracy | errors / test |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params']:,} | {r['steps']:,} | {r['train_seconds']} | "
              f"{100 * r['test_accuracy']:.1f}% | {r['test_errors']} / {len(test)} |")
    result = {"args": vars(args), "torch": torch.__version__, "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count(), "train": len(train), "test": len(test),
              "models": rows}
    from attnlab.io.files import atomic_write_text

    atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    print(f"wrote {out / 'results.json'}" + (f" and {out / 'attention.png'}" if vit_model is not None else ""))


if __name__ == "__main__":
    main()
