
import pytest
import torch

from attnlab.inspect.kernel_regression import gaussian_kernel, kernel_regression_demo, nadaraya_watson, toy_data


def test_equals_explicit_kernel_formula_and_is_convex():
    x, y = toy_data(30)
    q = torch.linspace(-1, 6, 17)
    h = 0.4
    pred, w = nadaraya_watson(q, x, y, h)
    k = gaussian_kernel((q[:, None] - x[None]) / h)
    torch.testing.assert_close(pred, (k * y).sum(1) / k.sum(1))
    torch.testing.assert_close(w.sum(1), torch.ones(17))
    assert (pred >= y.min() - 1e-6).all() and (pred <= y.max() + 1e-6).all()


def test_is_dot_product_attention_on_augmented_features():
    # -(q - k)^2 / 2h^2 = (q k - k^2 / 2) / h^2 - q^2 / 2h^2; the last term is constant per query,
    # so softmax over keys equals scaled-dot attention with q' = [q, 1], k' = [k, -k^2/2]
    x, y = toy_data(20)
    q = torch.linspace(0, 5, 7)
    h = 0.5
    pred, _ = nadaraya_watson(q, x, y, h)
    qa = torch.stack([q, torch.ones_like(q)], -1)[None, None]
    ka = torch.stack([x, -x**2 / 2], -1)[None, None]
    ref = torch.nn.functional.scaled_dot_product_attention(qa, ka, y[None, None, :, None], scale=1 / h**2)
    torch.testing.assert_close(pred, ref[0, 0, :, 0])


def test_bandwidth_limits_and_demo(tmp_path):
    x, y = toy_data(10)
    tiny, _ = nadaraya_watson(x, x, y, 1e-3)
    torch.testing.assert_close(tiny, y)  # h -> 0: nearest neighbour
    wide, _ = nadaraya_watson(x, x, y, 1e3)
    torch.testing.assert_close(wide, y.mean().expand(10))  # h -> inf: the global mean
    errors = kernel_regression_demo(tmp_path / "nw.png", bandwidths=(0.3, 5.0))
    assert errors[0.3] < errors[5.0]
    assert open(tmp_path / "nw.png", "rb").read(4) == b"\x89PNG"
    with pytest.raises(ValueError, match="bandwidth"):
        nadaraya_watson(x, x, y, 0.0)
