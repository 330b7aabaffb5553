"""Norms against their definitions and Hugging Face's: RMSNorm (eps inside the square root, gain
only) and LayerNorm, through the module and through `apply_norm`'s fast path, and the configured
norm_eps reaching every norm of a built model."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.nn.norms import apply_norm, make_norm


def rms_formula(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * g (Zhang & Sennrich 2019), in float64."""
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain.double()


def layernorm_formula(x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(biased var + eps) * g + b (Ba et al. 2016), in float64."""
    x = x.double()
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * gain.double() + bias.double()


def _inputs(scale: float) -> torch.Tensor:
    # a small scale makes eps matter: where it sits (inside or outside the root) shows
    return torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0)) * scale


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
@pytest.mark.parametrize("scale", [1.0, 0.05])
def test_rmsnorm_equals_the_formula_and_llama(eps, scale):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = make_norm("rmsnorm", 16, eps=eps)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x = _inputs(scale)
    expected = rms_formula(x, norm.weight, eps)
    hf = LlamaRMSNorm(16, eps=eps)
    with torch.no_grad():
        hf.weight.copy_(norm.weight)
    for got in (norm(x), apply_norm(norm, x), hf(x)):
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    assert not any(n for n, _ in norm.named_parameters() if n != "weight")  # a gain, no bias


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layernorm_equals_the_formula(eps):
    norm = make_norm("layernorm", 16, eps=eps)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.normal_()
    x = _inputs(0.05)
    expected = layernorm_formula(x, norm.weight, norm.bias, eps)
    for got in (norm(x), apply_norm(norm, x)):
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_configured_norm_eps_reaches_every_norm(norm):
    cfg = ModelConfig(arch="decoder", vocab_size=20, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0,
                      norm=norm, norm_eps=0.03, norm_placement="pre", position={"scheme": "rotary"})
    model = build_model(cfg)
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm))]
    assert len(norms) >= 2 * 2 + 1  # two per layer and the final one
    x = _inputs(0.05)
    for m in norms:
        with torch.no_grad():
            m.weight.uniform_(0.5, 2.0)
        expected = (rms_formula(x, m.weight, 0.03) if norm == "rmsnorm"
                    else layernorm_formula(x, m.weight, m.bias, 0.03))
        torch.testing.assert_close(apply_norm(m, x).double(), expected, atol=1e-5, rtol=1e-5)
