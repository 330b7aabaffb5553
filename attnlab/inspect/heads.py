"""Which attention heads matter: importance scores, pruning by mask and by removal, the curve.

Notation: H heads of a MultiHeadAttention, Dh head_dim; the input of `out_proj` is the
concatenation [head_0 | head_1 | ... ] (B, T, H * Dh).

- Masking (Michel et al. 2019, https://arxiv.org/abs/1905.10650): a forward pre-hook on
  `out_proj` multiplies head h's slice by xi_h. xi = 1 changes nothing; xi_h = 0 prunes head h.
- Gradient importance: I_h = |sum over the data of dL/dxi_h| at xi = 1 (the brief's form of
  Michel et al.'s score; `normalize=True` divides each layer's scores by their L2 norm, as they do).
- Entropy: mean over real queries of -sum_k alpha_k log alpha_k (low = a focused head).
- Removal: q/k/v rows and out_proj columns of the removed heads are deleted and `num_heads`
  reduced; per-head parameters follow (the `general` score's W_h, the `additive` scorer's
  W_q, W_k, v). Shaw relative tables are shared across heads (nothing to slice). ALiBi slopes and
  T5 biases are computed once per stack for every layer, so a pruned layer gets a pre-hook that
  keeps its heads' rows of the bias. Grouped / multi-query key-value heads are refused.
  A pruned model has per-layer head counts no ModelConfig describes: it is for measurement,
  not for `attnlab.save`.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.inspect.attention_maps import capture_attention
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.scores import Additive, General

LossFn = Callable[[nn.Module, object], Tensor]


def mha_modules(model: nn.Module) -> dict[str, MultiHeadAttention]:
    """Every MultiHeadAttention of `model` by qualified name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}


def ones_mask(model: nn.Module, requires_grad: bool = False) -> dict[str, Tensor]:
    """{name: ones(H)} for every attention module: the mask that keeps every head."""
    return {n: torch.ones(m.num_heads, requires_grad=requires_grad, device=m.out_proj.weight.device)
            for n, m in mha_modules(model).items()}


@contextmanager
def head_mask(model: nn.Module, mask: dict[str, Tensor]) -> Iterator[None]:
    """Inside the block, head h of module `name` is scaled by `mask[name][h]` (0 = pruned).

    Raises:
        ValueError: an unknown module name, or a mask of the wrong length.
    """
    modules = mha_modules(model)
    handles = []
    try:
        for name, xi in mask.items():
            if name not in modules:
                raise ValueError(f"mask names {name!r}, which is not an attention module; choose from {', '.join(modules)}")
            m = modules[name]
            if xi.shape != (m.num_heads,):
                raise ValueError(f"mask[{name!r}] must have shape ({m.num_heads},), got {tuple(xi.shape)}")

            def pre(mod, args, xi=xi, H=m.num_heads, Dh=m.head_dim):
                x = args[0]  # (B, T, H * Dh)
                scaled = (x.unflatten(-1, (H, Dh)) * xi.to(x.dtype)[:, None]).flatten(-2)
                return (scaled, *args[1:])

            handles.append(m.out_proj.register_forward_pre_hook(pre))
        yield
    finally:
        for h in handles:
            h.remove()


def lm_loss(model: nn.Module, batch: object) -> Tensor:
    """Mean next-token cross-entropy: batch = ids (B, T) for a decoder, (src, tgt) for an
    encoder-decoder (targets are tgt shifted by one). Padding id (config.pad_token_id) is ignored."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    ignore = -100 if pad is None else pad
    if isinstance(batch, (tuple, list)):
        src, tgt = batch
        logits = model(src, tgt[:, :-1])
    else:
        tgt = batch
        logits = model(tgt[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=ignore)


def head_importance(model: nn.Module, batches: Iterable[object], loss_fn: LossFn = lm_loss, *,
                    normalize: bool = False) -> dict[str, Tensor]:
    """Gradient importance |sum over batches of dL/dxi_h| per head (Michel et al. 2019).

    Args:
        model: the model (put it in eval mode for deterministic scores).
        batches: inputs for `loss_fn`.
        loss_fn: (model, batch) -> scalar loss; default `lm_loss`.
        normalize: divide each module's scores by their L2 norm.

    Returns:
        {module name: (H,) scores}.

    Raises:
        ValueError: no batches.
    """
    mask = ones_mask(model, requires_grad=True)
    total = {n: torch.zeros_like(x) for n, x in mask.items()}
    seen = 0
    with head_mask(model, mask):
        for batch in batches:
            grads = torch.autograd.grad(loss_fn(model, batch), list(mask.values()), allow_unused=True)
            for n, g in zip(mask, grads):
                if g is not None:
                    total[n] += g
            seen += 1
    if not seen:
        raise ValueError("batches is empty: give at least one batch")
    scores = {n: t.abs() for n, t in total.items()}
    if normalize:
        scores = {n: s / s.norm().clamp(min=1e-12) for n, s in scores.items()}
    return scores


def attention_entropy(model: nn.Module, batches: Iterable[tuple], **kwargs) -> dict[str, Tensor]:
    """Mean entropy (nats) of each head's weights over the real queries of `model(*batch, **kwargs)`.

    A self-attention query is real when its row has weight (all-masked rows are 0) and its own
    position is a key some query attends to: a padded position is a masked key for every query,
    so padded rows count for nothing and a padded batch scores as its rows alone. A
    cross-attention's queries are all counted (its weights do not show the target's padding).

    Returns:
        {module name: (H,) entropies}; a uniform head over n keys scores log n.
    """
    sums: dict[str, Tensor] = {}
    counts: dict[str, Tensor] = {}
    with torch.no_grad():
        for batch in batches:
            with capture_attention(model) as rec:
                model(*batch, **kwargs)
            for name in rec.names():
                module = model.get_submodule(name)
                self_attention = isinstance(module, MultiHeadAttention) and module.qkv_proj is not None
                for w in rec.calls(name):  # (B, H, Tq, Tk)
                    real = w.sum(-1) > 0  # all-masked query rows are 0
                    if self_attention and w.shape[-2] == w.shape[-1]:
                        real = real & (w.sum((1, 2)) > 0)[:, None, :]  # (B, 1, T): keys no query may see
                    ent = -(w * w.clamp(min=1e-30).log()).sum(-1)  # (B, H, Tq)
                    sums[name] = sums.get(name, 0) + (ent * real).sum((0, 2))
                    counts[name] = counts.get(name, 0) + real.sum((0, 2))
    return {n: sums[n] / counts[n].clamp(min=1) for n in sums}


# ---- physical removal -----------------------------------------------------------------------------


def _keep_rows(linear: nn.Linear, index: Tensor) -> nn.Linear:
    new = nn.Linear(linear.in_features, len(index), bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[index])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[index])
    return new


def _keep_cols(linear: nn.Linear, index: Tensor) -> nn.Linear:
    new = nn.Linear(len(index), linear.out_features, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, index])
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


def remove_heads_(attn: MultiHeadAttention, heads: Iterable[int]) -> MultiHeadAttention:
    """Delete `heads` from one attention module in place; returns it.

    Raises:
        ValueError: grouped/multi-query kv heads, an index out of range, or every head removed.
    """
    drop = sorted(set(int(h) for h in heads))
    if not drop:
        return attn
    H, Dh = attn.num_heads, attn.head_dim
    if attn.num_kv_heads != H:
        raise ValueError(f"cannot remove heads physically with grouped key/value heads (num_kv_heads="
                         f"{attn.num_kv_heads} < num_heads={H}): a kv head serves several query heads; "
                         "use head_mask instead")
    if drop[0] < 0 or drop[-1] >= H:
        raise ValueError(f"heads {drop} out of range for a module with {H} heads")
    keep = [h for h in range(H) if h not in drop]
    if not keep:
        raise ValueError(f"removing all {H} heads leaves no attention; keep at least one (or use head_mask)")
    keep_t = torch.tensor(keep, device=attn.out_proj.weight.device)
    index = (keep_t[:, None] * Dh + torch.arange(Dh, device=keep_t.device)).flatten()  # features of kept heads
    if attn.qkv_proj is not None:  # fused q | k | v: the kept heads' rows of each
        attn.qkv_proj = _keep_rows(attn.qkv_proj, torch.cat([index, H * Dh + index, 2 * H * Dh + index]))
    else:  # cross-attention: q, and fused k | v
        attn.q_proj = _keep_rows(attn.q_proj, index)
        attn.kv_proj = _keep_rows(attn.kv_proj, torch.cat([index, H * Dh + index]))
    attn.out_proj = _keep_cols(attn.out_proj, index)
    with torch.no_grad():
        if isinstance(attn.score, General):
            attn.score.weight = nn.Parameter(attn.score.weight[keep_t].clone())
        elif isinstance(attn.score, Additive):
            for pname in ("w_q", "w_k", "v"):
                setattr(attn.score, pname, nn.Parameter(getattr(attn.score, pname)[keep_t].clone()))
    attn.num_heads = attn.num_kv_heads = len(keep)
    return attn


def _slice_bias_hook(keep: Tensor):
    def pre(mod, args, kwargs):
        bias = kwargs.get("bias")
        if bias is not None and bias.shape[1] > len(keep):  # a per-head (B, H, Tq, Tk) stack bias
            kwargs = {**kwargs, "bias": bias.index_select(1, keep.to(bias.device))}
        return args, kwargs
    return pre


def prune_heads(model: nn.Module, heads: dict[str, Iterable[int]], *, copy_model: bool = True) -> nn.Module:
    """Remove heads physically: {module name: head indices}.

    Args:
        model: any attnlab Transformer.
        heads: the heads to remove per attention module.
        copy_model: prune a deep copy (default) rather than `model` itself.

    Returns:
        The pruned model (same outputs as `head_mask` with those heads at 0).

    Raises:
        ValueError: an unknown module name, or `remove_heads_` refuses.
    """
    target = copy.deepcopy(model) if copy_model else model
    modules = mha_modules(target)
    for name, hs in heads.items():
        if name not in modules:
            raise ValueError(f"heads names {name!r}, which is not an attention module; choose from {', '.join(modules)}")
        m = modules[name]
        hs = sorted(set(int(h) for h in hs))
        if not hs:
            continue
        keep = torch.tensor([h for h in range(m.num_heads) if h not in hs])
        remove_heads_(m, hs)
        m.register_forward_pre_hook(_slice_bias_hook(keep), with_kwargs=True)
    return target


def mask_from_heads(model: nn.Module, heads: dict[str, Iterable[int]]) -> dict[str, Tensor]:
    """The 0/1 mask equivalent to removing `heads`."""
    mask = ones_mask(model)
    for name, hs in heads.items():
        if name not in mask:
            raise ValueError(f"heads names {name!r}, which is not an attention module")
        mask[name][list(hs)] = 0.0
    return mask


def pruning_curve(model: nn.Module, batches: list[object], scores: dict[str, Tensor],
                  loss_fn: LossFn = lm_loss, steps: Iterable[int] | None = None) -> list[tuple[int, float]]:
    """Loss after masking the k least important heads (globally ranked by `scores`), for each k.

    Args:
        batches: evaluation inputs for `loss_fn` (a list: it is read once per k).
        scores: {module name: (H,) importance}, e.g. from `head_importance`.
        steps: the k values; default 0, 1, ..., every head.

    Returns:
        [(k, mean loss)].
    """
    ranked = sorted(((float(s), name, h) for name, sc in scores.items() for h, s in enumerate(sc.tolist())))
    total = len(ranked)
    steps = list(range(total + 1)) if steps is None else [int(k) for k in steps]
    if any(k < 0 or k > total for k in steps):
        raise ValueError(f"steps must lie in [0, {total}], got {steps}")
    curve = []
    with torch.no_grad():
        for k in steps:
            mask = ones_mask(model)
            for _, name, h in ranked[:k]:
                mask[name][h] = 0.0
            with head_mask(model, mask):
                losses = [float(loss_fn(model, b)) for b in batches]
            curve.append((k, sum(losses) / len(losses)))
    return curve


def plot_pruning_curve(curves: dict[str, list[tuple[int, float]]], path: str) -> str:
    """Loss against heads removed, one line per ranking (e.g. importance vs random)."""
    from attnlab.inspect.plots import plot_lines

    series = {name: ([k for k, _ in c], [v for _, v in c]) for name, c in curves.items()}
    return plot_lines(series, path, xlabel="heads removed", ylabel="loss", title="head pruning")
