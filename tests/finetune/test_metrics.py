"""Metrics against values worked out by hand from their definitions."""

import math

import pytest
import torch

from attnlab.finetune.metrics import (accuracy, confusion_matrix, format_confusion, macro_f1, matthews_corrcoef,
                                      plot_confusion)

GOLD = [0, 0, 1, 1, 2, 2, 2]
PRED = [0, 1, 1, 1, 2, 0, 2]


def test_confusion_matrix_counts_rows_gold_columns_predicted():
    c = confusion_matrix(GOLD, PRED)
    assert c.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 2]]
    assert confusion_matrix([0], [0], num_classes=3).shape == (3, 3)


def test_accuracy_and_macro_f1_by_hand():
    assert accuracy(GOLD, PRED) == pytest.approx(5 / 7)
    # per class: P0 = 1/2, R0 = 1/2 -> F1 1/2; P1 = 2/3, R1 = 1 -> 0.8; P2 = 1, R2 = 2/3 -> 0.8
    assert macro_f1(GOLD, PRED) == pytest.approx((0.5 + 0.8 + 0.8) / 3)
    # a class in num_classes that never occurs counts as F1 0 in the mean
    assert macro_f1([0, 1], [0, 1], num_classes=3) == pytest.approx(2 / 3)


def test_binary_mcc_equals_the_phi_coefficient():
    gold = [1, 1, 1, 0, 0, 0, 0, 1]
    pred = [1, 0, 1, 0, 0, 1, 0, 1]
    tp, tn, fp, fn = 3, 3, 1, 1
    phi = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert matthews_corrcoef(gold, pred) == pytest.approx(phi)


def test_multiclass_mcc_by_gorodkin_formula():
    # c = 5, s = 7, t = (2, 2, 3), p = (2, 3, 2)
    num = 5 * 7 - (2 * 2 + 2 * 3 + 3 * 2)
    den = math.sqrt((49 - (4 + 9 + 4)) * (49 - (4 + 4 + 9)))
    assert matthews_corrcoef(GOLD, PRED) == pytest.approx(num / den)


def test_mcc_edge_cases():
    assert matthews_corrcoef([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0  # constant gold: undefined -> 0
    assert matthews_corrcoef([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0  # constant prediction
    assert matthews_corrcoef([0], [0]) == 0.0


def test_metric_errors_name_the_problem():
    with pytest.raises(ValueError, match="differ in length"):
        accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="empty"):
        macro_f1([], [])
    with pytest.raises(ValueError, match="num_classes=2"):
        confusion_matrix([0, 2], [0, 1], num_classes=2)


def test_confusion_text_and_png(tmp_path):
    c = confusion_matrix(GOLD, PRED)
    text = format_confusion(c, ["a", "b", "c"])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[3].split() == ["c", "1", "0", "2"]
    path = plot_confusion(c, ["a", "b", "c"], tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(path).endswith("c.png")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    with pytest.raises(ValueError, match="names"):
        format_confusion(c, ["a"])
