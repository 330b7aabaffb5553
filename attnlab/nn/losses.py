"""Losses: cross-entropy with label smoothing, computed together with the output projection
in row chunks so the (N, V) logits never exist whole.

Notation: N rows (B * T positions), D hidden size, V vocabulary, eps the label smoothing.

    logits = h W^T + b                       (N, V), one chunk of rows at a time
    loss_i = (1 - eps) * -log p_i[y_i] + eps * mean_v(-log p_i[v])   (Szegedy et al. 2016,
             https://arxiv.org/abs/1512.00567; the same definition as PyTorch's label_smoothing)
    d loss_i / d logits_i = p_i - q_i,   q_i = (1 - eps) onehot(y_i) + eps / V

The gradient for each chunk is formed right after its forward pass (the softmax is at hand),
so backward only scales the stored dh, dW, db by the incoming gradient: the same three
matmuls as an unfused head and no (N, V) tensor written and read back again. Within a chunk
the logits buffer is overwritten in place (logits -> log-probs -> p - q) a block of rows at a
time, each block small enough to stay in cache across its passes; under bf16 autocast the
matmuls run in bf16 and the softmax of each block in float32 (a small scratch block), so the
loss equals the float32 cross-entropy of the bf16 logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE = -100


# rows whose (rows, V) logit gradients are held at once (one chunk for GPT-2's vocabulary and 2,048
# bf16 rows), and rows per softmax block: small enough to stay in a 32 MiB L3 cache between its
# passes, large enough that a few dozen parallel regions, not hundreds, run per call (on a busy
# 2-core machine, 2 threads: 1.9 s per call at 16 MiB vs 4.4 s at 4 MiB; 1 thread: within 3%)
_GRAD_BUFFER_BYTES = 256 * 2**20
_SOFTMAX_BLOCK_BYTES = 16 * 2**20


def _compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, label_smoothing: float,
                chunk_rows: int | None, want_grad: bool):
        N, _ = hidden.shape
        V = weight.shape[0]
        cdt = _compute_dtype(hidden.device.type, hidden.dtype)
        acc = torch.promote_types(torch.float32, cdt)  # softmax and sums: float32, or float64 inputs' own
        valid = targets != IGNORE
        count = valid.sum().clamp(min=1)
        row_scale = valid.to(acc) / count  # (N,) d mean-loss / d loss_i
        safe_y = targets.clamp(min=0)
        w = weight.to(cdt)  # one cast per call (autocast would cast it per chunk)
        b = bias.to(acc) if bias is not None else None
        esize = torch.finfo(cdt).bits // 8
        rows = chunk_rows or max(1, _GRAD_BUFFER_BYTES // (V * esize))
        sub = max(1, _SOFTMAX_BLOCK_BYTES // (V * 4))
        losses = torch.empty(N, dtype=acc, device=hidden.device)
        grad_h = torch.empty_like(hidden) if want_grad else None
        grad_w = grad_b = None
        scratch = None if acc == cdt else torch.empty(min(sub, N), V, dtype=acc, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, N, rows):
                h = hidden[start: start + rows].to(cdt)  # (n, D)
                n = h.shape[0]
                d = h @ w.t()  # (n, V) logits, then in place: log-probs, probs, d loss / d logits
                for s in range(0, n, sub):  # cache-sized blocks of rows for the softmax
                    blk = d[s: s + sub]
                    lp = blk if scratch is None else scratch[: blk.shape[0]].copy_(blk)
                    if b is not None:
                        lp += b
                    torch.log_softmax(lp, dim=-1, out=lp)
                    y = safe_y[start + s: start + s + blk.shape[0]]
                    nll = -lp.gather(1, y[:, None]).squeeze(1)
                    if label_smoothing:
                        nll = (1 - label_smoothing) * nll - label_smoothing * lp.mean(-1)
                    losses[start + s: start + s + blk.shape[0]] = nll
                    if want_grad:
                        lp.exp_()  # softmax
                        if label_smoothing:
                            lp.sub_(label_smoothing / V)
                        lp[torch.arange(len(y), device=y.device), y] -= 1 - label_smoothing
                        if b is not None:
                            part = row_scale[start + s: start + s + blk.shape[0]] @ lp
                            grad_b = part if grad_b is None else grad_b + part
                        if scratch is not None:
                            blk.copy_(lp)
                if want_grad:
                    # the row scale goes on the small (n, D) side of each matmul, not on (n, V)
                    scale = row_scale[start: start + n, None]
                    grad_h[start: start + n] = ((d @ w).to(acc) * scale).to(hidden.dtype)
                    part = (d.t() @ (h.to(acc) * scale).to(cdt)).to(acc)  # (V, D)
                    grad_w = part if grad_w is None else grad_w.add_(part)
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype), grad_b.to(bias.dtype) if grad_b is not None else None)
        return (losses * valid).sum() / count

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        if grad_out.device.type == "cpu" and grad_out.item() == 1.0:
            # `loss.backward()`: the stored gradients are the answer as they are; scaling them by 1
            # would write a fresh (V, D) tensor (20-30 ms a step at V = 32-50k on a 2-core CPU)
            return grad_h, grad_w, grad_b, None, None, None, None
        g = grad_out.to(grad_h.dtype)
        return grad_h * g, grad_w * g, (grad_b * g if grad_b is not None else None), None, None, None, None


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None, *,
                         label_smoothing: float = 0.0, chunk_rows: int | None = None) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T (+ bias)` against `targets`, fused and chunked.

    Equal to `F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=-100,
    label_smoothing=label_smoothing)`, without materialising the logits.

    Args:
        hidden: (N, D) or (B, T, D) final hidden states.
        weight: (V, D) output projection (tied to the embedding or not).
        targets: (N,) or (B, T) ids, -100 where no loss is taken.
        bias: (V,) or None.
        label_smoothing: eps in [0, 1).
        chunk_rows: rows of logits (and of their gradient) held at once; default: as many as
            fit in 256 MiB.

    Returns:
        a scalar float32 tensor (float64 for float64 inputs).

    Raises:
        ValueError: rows of hidden and targets differ; label_smoothing or chunk_rows out of range.
    """
    if hidden.dim() == 3:
        hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"hidden has {hidden.shape[0]} rows but targets has {targets.shape[0]}")
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive number of rows or None, got {chunk_rows}")
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _FusedLinearCrossEntropy.apply(hidden, weight, bias, targets, float(label_smoothing), chunk_rows,
                                          want_grad)


def cross_entropy(logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """PyTorch's cross-entropy over (..., V) logits, ignoring -100, in float32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE,
                           label_smoothing=label_smoothing)
