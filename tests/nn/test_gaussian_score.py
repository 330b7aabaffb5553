"""The Gaussian score -||q - k||^2 / (2 sigma^2): every kernel that takes it equals the definition."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.config import ConfigError
from attnlab.nn.kernels import KERNELS, build_kernel
from attnlab.nn.masks import causal_mask, padding_mask
from attnlab.nn.scores import Gaussian, build_score
from tests.models.helpers import assert_cached_steps_equal_full


def _definition(q, k, v, mask, sigma):
    """softmax over keys of -||q_i - k_j||^2 / (2 sigma^2), masked, times v: written from the
    formula with the pairwise distances, not through the score module."""
    dist2 = ((q[:, :, :, None, :] - k[:, :, None, :, :]) ** 2).sum(-1)
    scores = (-dist2 / (2 * sigma**2)).masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def test_forward_is_the_squared_distance():
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)
    dist2 = torch.cdist(q.reshape(6, 5, 8), k.reshape(6, 7, 8)).square().view(2, 3, 5, 7)
    torch.testing.assert_close(Gaussian(1.7)(q, k), -dist2 / (2 * 1.7**2), atol=1e-5, rtol=1e-5)


def test_default_sigma_gives_the_dot_product_part_the_scaled_dot_scale():
    _, _, scale = build_score("gaussian", 4, 16).prepare(torch.randn(1, 4, 2, 16), torch.randn(1, 4, 3, 16))
    assert scale == pytest.approx(16**-0.5)


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "auto"])
def test_kernels_equal_the_definition_with_causal_and_padding_masks(kernel):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8) * 2, torch.randn(2, 4, 6, 8) * 2, torch.randn(2, 4, 6, 8)
    mask = causal_mask(6)[None, None] & padding_mask(torch.tensor([[1] * 6, [1] * 4 + [0] * 2]))
    score = Gaussian(1.3)
    qs, ks, scale = score.prepare(q, k)
    out, _ = build_kernel(kernel)(qs, ks, v, scale=scale, mask=mask)
    torch.testing.assert_close(out, _definition(q, k, v, mask, 1.3), atol=1e-5, rtol=1e-5)


def test_a_decoder_with_the_gaussian_score_is_causal_and_decodes_like_its_forward():
    cfg = ModelConfig(arch="decoder", vocab_size=50, d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0,
                      attention={"score": "gaussian", "gaussian_sigma": 2.0})
    model = build_model(cfg).eval()
    ids = torch.randint(0, 50, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(0, 50, (2, 4))
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :6], model(changed)[:, :6])
        assert not torch.allclose(model(ids)[:, 6:], model(changed)[:, 6:])  # the perturbation reaches the logits
    assert_cached_steps_equal_full(model, ids, torch.ones_like(ids, dtype=torch.bool))


@pytest.mark.parametrize("kernel", [n for n, k in KERNELS.items() if not k.supports.wide_qk])
def test_kernels_that_need_equal_widths_refuse_it_naming_the_field(kernel):
    with pytest.raises(ConfigError, match="attention.kernel"):
        ModelConfig(attention={"score": "gaussian", "kernel": kernel})


def test_sigma_must_be_positive():
    with pytest.raises(ConfigError, match="attention.gaussian_sigma"):
        ModelConfig(attention={"score": "gaussian", "gaussian_sigma": 0.0})
