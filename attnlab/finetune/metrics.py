"""Classification metrics from (gold, predicted) label ids, written from their definitions.

Notation: N examples, K classes, C the (K, K) confusion matrix, C[i, j] = #(gold i, predicted j).

    accuracy  = trace(C) / N
    macro-F1  = mean over classes k of 2 P_k R_k / (P_k + R_k)   (0 for a class with P_k + R_k = 0;
                the mean runs over the K classes of `num_classes`, or those seen in gold or predictions)
    MCC       = (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2))
                with c = trace(C), s = N, t_k = row sums (gold), p_k = column sums (predicted);
                Matthews 1975 (binary), Gorodkin 2004 (K classes,
                https://doi.org/10.1016/j.compbiolchem.2004.09.006); 0 when a denominator factor is 0.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import torch


def _labels(gold: Sequence[int], pred: Sequence[int]) -> tuple[list[int], list[int]]:
    gold, pred = [int(g) for g in gold], [int(p) for p in pred]
    if len(gold) != len(pred):
        raise ValueError(f"gold ({len(gold)}) and pred ({len(pred)}) differ in length")
    if not gold:
        raise ValueError("gold and pred are empty: metrics need at least one example")
    if min(gold + pred) < 0:
        raise ValueError("labels must be ids >= 0")
    return gold, pred


def confusion_matrix(gold: Sequence[int], pred: Sequence[int], num_classes: int | None = None) -> torch.Tensor:
    """(K, K) int64 counts, rows = gold, columns = predicted.

    Raises:
        ValueError: lengths differ, no examples, negative ids, or an id >= num_classes.
    """
    gold, pred = _labels(gold, pred)
    k = num_classes if num_classes is not None else max(gold + pred) + 1
    if max(gold + pred) >= k:
        raise ValueError(f"num_classes={k} but a label id is {max(gold + pred)}")
    c = torch.zeros(k, k, dtype=torch.long)
    for g, p in zip(gold, pred):
        c[g, p] += 1
    return c


def accuracy(gold: Sequence[int], pred: Sequence[int]) -> float:
    """Fraction of examples whose predicted label equals the gold one."""
    gold, pred = _labels(gold, pred)
    return sum(g == p for g, p in zip(gold, pred)) / len(gold)


def macro_f1(gold: Sequence[int], pred: Sequence[int], num_classes: int | None = None) -> float:
    """Unweighted mean of the per-class F1 (see the module notation)."""
    c = confusion_matrix(gold, pred, num_classes).double()
    tp, gold_k, pred_k = c.diag(), c.sum(1), c.sum(0)
    f1 = [0.0 if gold_k[k] + pred_k[k] == 0 else float(2 * tp[k] / (gold_k[k] + pred_k[k])) for k in range(len(tp))]
    return sum(f1) / len(f1)


def matthews_corrcoef(gold: Sequence[int], pred: Sequence[int], num_classes: int | None = None) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K); 0.0 when undefined (a constant
    gold or prediction vector)."""
    c = confusion_matrix(gold, pred, num_classes).double()
    s, correct = float(c.sum()), float(c.trace())
    t, p = c.sum(1), c.sum(0)
    cov_tp = correct * s - float((t * p).sum())
    cov_pp = s * s - float((p * p).sum())
    cov_tt = s * s - float((t * t).sum())
    if cov_pp == 0 or cov_tt == 0:
        return 0.0
    return cov_tp / math.sqrt(cov_pp * cov_tt)


def classification_report(gold: Sequence[int], pred: Sequence[int], num_classes: int | None = None) -> dict:
    """`{"accuracy", "macro_f1", "mcc", "n"}` of one evaluation."""
    return {"accuracy": accuracy(gold, pred), "macro_f1": macro_f1(gold, pred, num_classes),
            "mcc": matthews_corrcoef(gold, pred, num_classes), "n": len(gold)}


def format_confusion(matrix: torch.Tensor, names: Sequence[str]) -> str:
    """The confusion matrix as an aligned text table (rows gold, columns predicted)."""
    names = [str(n) for n in names]
    if len(names) != matrix.shape[0]:
        raise ValueError(f"names has {len(names)} entries for a {tuple(matrix.shape)} matrix")
    width = max([len(n) for n in names] + [len(str(int(matrix.max()))) if matrix.numel() else 1, len("gold\\pred")])
    rows = ["gold\\pred".ljust(width) + " " + " ".join(n.rjust(width) for n in names)]
    for name, row in zip(names, matrix.tolist()):
        rows.append(name.ljust(width) + " " + " ".join(str(v).rjust(width) for v in row))
    return "\n".join(rows)


def plot_confusion(matrix: torch.Tensor, names: Sequence[str], path: str | os.PathLike, *,
                   title: str | None = None) -> str:
    """Write the confusion matrix as a PNG heatmap (atomically, through attnlab.inspect.plots)."""
    from attnlab.inspect.plots import plot_heatmap

    return plot_heatmap(matrix.float(), path, x_labels=list(names), y_labels=list(names), title=title,
                        x_name="predicted", y_name="gold")
