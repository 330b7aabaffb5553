"""Losses: cross-entropy with label smoothing, computed together with the output projection
in row chunks so the (N, V) logits never exist whole.

Notation: N rows (B * T positions), D hidden size, V vocabulary, eps the label smoothing.

    logits = h W^T + b                       (N, V), one chunk of rows at a time
    loss_i = (1 - eps) * -log p_i[y_i] + eps * mean_v(-log p_i[v])   (Szegedy et al. 2016,
             https://arxiv.org/abs/1512.00567; the same definition as PyTorch's label_smoothing)
    d loss_i / d logits_i = p_i - q_i,   q_i = (1 - eps) onehot(y_i) + eps / V

The gradient for each chunk is formed right after its forward pass (the softmax is at hand),
so backward only scales the stored dh, dW, db by the incoming gradient: the same three
matmuls as an unfused head, about 1/num_chunks of the memory, and no (N, V) tensor written
and read back again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE = -100


def _compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, label_smoothing: float,
                chunk_rows: int, want_grad: bool):
        N, _ = hidden.shape
        V = weight.shape[0]
        cdt = _compute_dtype(hidden.device.type, hidden.dtype)
        valid = targets != IGNORE
        count = valid.sum().clamp(min=1)
        acc = torch.promote_types(torch.float32, cdt)  # softmax and sums: float32, or float64 inputs' own
        w = weight.to(cdt)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        grad_h = torch.empty_like(hidden) if want_grad else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_grad else None
        grad_b = torch.zeros(V, dtype=acc, device=weight.device) if want_grad and bias is not None else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, N, chunk_rows):
                h = hidden[start: start + chunk_rows].to(cdt)
                y = targets[start: start + chunk_rows]
                ok = valid[start: start + chunk_rows]
                logits = (h @ w.t()).to(acc)  # (n, V)
                if bias is not None:
                    logits += bias.to(acc)
                lse = torch.logsumexp(logits, dim=-1)  # (n,)
                safe_y = y.clamp(min=0)
                nll = lse - logits.gather(1, safe_y[:, None]).squeeze(1)
                loss = nll if not label_smoothing else (1 - label_smoothing) * nll + label_smoothing * (lse - logits.mean(-1))
                total += (loss * ok).sum()
                if want_grad:
                    probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                    if label_smoothing:
                        probs.sub_(label_smoothing / V)
                    probs[torch.arange(len(y), device=y.device), safe_y] -= 1 - label_smoothing
                    # d mean-loss / d logits = row_scale * probs; the scale goes on the small
                    # (n, D) side of each matmul rather than over the (n, V) matrix
                    row_scale = ok.to(acc) / count  # (n,)
                    d = probs.to(cdt)
                    grad_h[start: start + chunk_rows] = ((d @ w) * row_scale[:, None].to(cdt)).to(hidden.dtype)
                    grad_w += (d.t() @ (h * row_scale[:, None].to(cdt))).to(acc)
                    if grad_b is not None:
                        grad_b += row_scale @ probs
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype), grad_b.to(bias.dtype) if grad_b is not None else None)
        return total / count

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        g = grad_out.to(grad_h.dtype)
        return grad_h * g, grad_w * g, (grad_b * g if grad_b is not None else None), None, None, None, None


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None, *,
                         label_smoothing: float = 0.0, chunk_rows: int = 1024) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T (+ bias)` against `targets`, fused and chunked.

    Equal to `F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=-100,
    label_smoothing=label_smoothing)`, without materialising the logits.

    Args:
        hidden: (N, D) or (B, T, D) final hidden states.
        weight: (V, D) output projection (tied to the embedding or not).
        targets: (N,) or (B, T) ids, -100 where no loss is taken.
        bias: (V,) or None.
        label_smoothing: eps in [0, 1).
        chunk_rows: rows of logits formed at once.

    Returns:
        a scalar float32 tensor.
    """
    if hidden.dim() == 3:
        hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"hidden has {hidden.shape[0]} rows but targets has {targets.shape[0]}")
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _FusedLinearCrossEntropy.apply(hidden, weight, bias, targets, float(label_smoothing), int(chunk_rows),
                                          want_grad)


def cross_entropy(logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """PyTorch's cross-entropy over (..., V) logits, ignoring -100, in float32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE,
                           label_smoothing=label_smoothing)
