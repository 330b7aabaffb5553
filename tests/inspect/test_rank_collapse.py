import pytest
import torch

from attnlab.inspect.rank_collapse import plot_rank_collapse, rank_collapse, relative_residual


def test_relative_residual_is_zero_exactly_for_rank_one():
    row = torch.randn(1, 1, 8)
    assert float(relative_residual(row.expand(1, 5, 8))) < 1e-6
    x = torch.randn(3, 5, 8)
    # the mean is the best x for the Frobenius norm: any other shift leaves a larger residual
    best = (x - x.mean(1, keepdim=True)).flatten(1).norm(dim=-1)
    other = (x - x[:, :1]).flatten(1).norm(dim=-1)
    assert (best <= other).all()
    torch.testing.assert_close(relative_residual(x), best / x.flatten(1).norm(dim=-1))


def test_pure_attention_collapses_residual_stack_does_not(tmp_path):
    curves = {v: rank_collapse(v, depth=6, seq_len=16, d_model=32) for v in ("attention", "residual", "transformer")}
    pure = curves["attention"]
    assert pure[0] > 0.9
    assert (pure[1:4] < pure[0:3]).all()  # shrinks with depth until float precision
    assert pure[-1] < 1e-4
    assert curves["residual"][-1] > 0.5 and curves["transformer"][-1] > 0.5
    assert open(plot_rank_collapse(curves, tmp_path / "r.png"), "rb").read(4) == b"\x89PNG"
    with pytest.raises(ValueError, match="variant"):
        rank_collapse("mlp")
