"""Fine-tuning recipes on an attnlab Encoder or Decoder: layer-wise learning-rate decay,
re-initialising the top layers, freezing the bottom of the stack.

Depth of a parameter (L = number of layers, layers numbered 0 .. L-1 from the bottom):

    embeddings (token, position, segment, their norm)      depth 0
    layers[l]                                              depth l + 1
    final norm, pooler, head, position bias (shared)       depth L + 1  ("top")

Layer-wise learning-rate decay (LLRD; Howard & Ruder 2018 "discriminative fine-tuning",
https://arxiv.org/abs/1801.06146; Clark et al. 2020, ELECTRA, https://arxiv.org/abs/2003.10555):

    lr(depth d) = base_lr * decay^(L + 1 - d)

so the head gets base_lr, layers[l] gets base_lr * decay^(L - l) (the top layer decay^1) and the
embeddings get base_lr * decay^(L + 1). Each depth is split again into a weight-decay and a
no-decay group by `attnlab.training.optim.decay_groups`.

Re-initialising the top k layers (Zhang et al. 2021, "Revisiting Few-sample BERT Fine-tuning",
https://arxiv.org/abs/2006.05987): linear weights N(0, init_std), biases 0, norms to their
initial state (gain 1, bias 0), drawn from a seeded generator.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.training.optim import decay_groups


def _stack(model: nn.Module) -> nn.Module:
    if not hasattr(model, "layers") or not hasattr(model, "embed"):
        raise TypeError(f"model must be an attnlab Encoder or Decoder (with .embed and .layers), "
                        f"got {type(model).__name__}")
    return model


def parameter_depths(model: nn.Module) -> dict[str, int]:
    """`{parameter name: depth}` as in the module notation (each shared tensor once)."""
    stack = _stack(model)
    top = len(stack.layers) + 1
    depths = {}
    for name, _ in stack.named_parameters():
        if name.startswith("embed."):
            depths[name] = 0
        elif name.startswith("layers."):
            depths[name] = int(name.split(".")[1]) + 1
        else:
            depths[name] = top
    return depths


def llrd_param_groups(model: nn.Module, base_lr: float, decay: float, weight_decay: float = 0.0) -> list[dict]:
    """Optimizer groups with layer-wise learning-rate decay (trainable parameters only).

    Args:
        model: an attnlab Encoder or Decoder.
        base_lr: the head's learning rate.
        decay: the per-layer factor, in (0, 1]; 1 = one learning rate for all.
        weight_decay: applied to the groups `decay_groups` marks as decayed.

    Returns:
        a list of `{"params", "lr", "lr_scale", "weight_decay", "depth", "names"}`, one per
        (depth, decayed or not) that has parameters, ordered by depth (`lr_scale` = lr / base_lr,
        which `attnlab.training.optim.Schedule` keeps under its schedule).

    Raises:
        ValueError: decay outside (0, 1] or base_lr <= 0.
    """
    if not 0 < decay <= 1:
        raise ValueError(f"layer_decay must be in (0, 1], got {decay}")
    if not base_lr > 0:
        raise ValueError(f"lr must be > 0, got {base_lr}")
    depths = parameter_depths(model)
    top = len(_stack(model).layers) + 1
    params = dict(model.named_parameters())
    groups: dict[tuple[int, float], dict] = {}
    for g in decay_groups(model, weight_decay):
        for name in g["names"]:
            d = depths[name]
            key = (d, g["weight_decay"])
            group = groups.setdefault(key, {"params": [], "names": [], "lr": base_lr * decay ** (top - d),
                                            "lr_scale": decay ** (top - d), "weight_decay": g["weight_decay"],
                                            "depth": d})
            group["params"].append(params[name])
            group["names"].append(name)
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], -k[1]))]


def reinit_top_layers(model: nn.Module, k: int, *, seed: int = 0, std: float | None = None) -> list[str]:
    """Re-initialise the top `k` layers in place (see the module notation).

    Args:
        model: an attnlab Encoder or Decoder.
        k: how many layers from the top; 0 does nothing.
        seed: seeds the generator that draws the new weights.
        std: the normal's standard deviation (default `model.config.init_std`, else 0.02).

    Returns:
        the names of the parameters re-initialised.

    Raises:
        ValueError: k < 0 or k > number of layers.
    """
    stack = _stack(model)
    if not isinstance(k, int) or not 0 <= k <= len(stack.layers):
        raise ValueError(f"reinit_layers must be an int in [0, {len(stack.layers)}], got {k!r}")
    if std is None:
        std = getattr(getattr(model, "config", None), "init_std", 0.02)
    gen = torch.Generator().manual_seed(seed)
    names = []
    first = len(stack.layers) - k
    with torch.no_grad():
        for i in range(first, len(stack.layers)):
            for mname, module in stack.layers[i].named_modules():
                own = dict(module.named_parameters(recurse=False))
                if not own:
                    continue
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    w = torch.empty(module.weight.shape).normal_(0.0, std, generator=gen)
                    module.weight.copy_(w.to(module.weight))
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
                elif "norm" in type(module).__name__.lower():
                    for pname, p in own.items():
                        p.fill_(1.0 if pname == "weight" else 0.0)
                else:  # other learned tables (relative positions ...)
                    for p in own.values():
                        p.copy_(torch.empty(p.shape).normal_(0.0, std, generator=gen).to(p))
                prefix = f"layers.{i}.{mname}." if mname else f"layers.{i}."
                names.extend(prefix + n for n in own)
    return names


def freeze(model: nn.Module, *, embeddings: bool = False, layers: int = 0) -> list[str]:
    """Stop gradients to the embeddings and/or the lowest `layers` layers.

    Returns:
        the names of the frozen parameters (requires_grad set to False).

    Raises:
        ValueError: layers < 0 or more than the model has.
    """
    stack = _stack(model)
    if not isinstance(layers, int) or not 0 <= layers <= len(stack.layers):
        raise ValueError(f"freeze_layers must be an int in [0, {len(stack.layers)}], got {layers!r}")
    frozen = []
    for name, p in stack.named_parameters():
        is_embed = name.startswith("embed.")
        is_low = name.startswith("layers.") and int(name.split(".")[1]) < layers
        if (embeddings and is_embed) or is_low:
            p.requires_grad_(False)
            frozen.append(name)
    return frozen
