"""Pooling (B, T, D) -> (B, D) over real tokens only: a padded row pools to what its unpadded
tokens pool to, whatever the padding holds and whichever side it is on; and a classification
model's logits for a padded row equal those of the row alone."""

import pytest
import torch

from attnlab.models.heads import pool

from .helpers import ids, tiny


def _padded(hidden_rows: list[torch.Tensor], side: str, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of real hidden states (n_b, D) -> (B, T, D) padded with `fill`, and the (B, T) mask."""
    T, D = max(len(r) for r in hidden_rows), hidden_rows[0].shape[1]
    hidden = torch.full((len(hidden_rows), T, D), fill)
    mask = torch.zeros(len(hidden_rows), T, dtype=torch.long)
    for b, r in enumerate(hidden_rows):
        cols = slice(0, len(r)) if side == "right" else slice(T - len(r), T)
        hidden[b, cols], mask[b, cols] = r, 1
    return hidden, mask


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("fill", [0.0, 100.0])
def test_mean_and_last_pool_the_real_tokens_only(side, fill):
    rows = [torch.randn(n, 6) for n in (5, 2, 1)]
    hidden, mask = _padded(rows, side, fill)
    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.stack([r.mean(0) for r in rows]))
    torch.testing.assert_close(pool(hidden, mask, "last"), torch.stack([r[-1] for r in rows]))
    torch.testing.assert_close(pool(hidden, mask.bool(), "mean"), torch.stack([r.mean(0) for r in rows]))


def test_pool_without_a_mask_uses_every_position():
    hidden = torch.randn(2, 4, 3)
    torch.testing.assert_close(pool(hidden, None, "mean"), hidden.mean(1))
    torch.testing.assert_close(pool(hidden, None, "last"), hidden[:, -1])
    torch.testing.assert_close(pool(hidden, None, "first"), hidden[:, 0])


@pytest.mark.parametrize("arch, pooling", [("encoder", "mean"), ("encoder", "first"), ("decoder", "last"),
                                           ("decoder", "mean")])
def test_classification_of_a_padded_row_equals_the_row_alone(arch, pooling):
    torch.manual_seed(0)
    model = tiny(arch, head="classification", num_labels=3, classifier_pooling=pooling)
    x = ids(2, 6)
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3])
    x[1, 3:] = 7  # padding ids that would move a pooled mean if they counted
    with torch.no_grad():
        batch = model(x, mask)
        alone = model(x[1:, :3])
    torch.testing.assert_close(batch[1:], alone, atol=1e-5, rtol=1e-5)
