"""Every activation against its definition and Hugging Face's ACT2FN, and the gated feed-forward
(gate half first) against Llama's MLP (SwiGLU) and T5 v1.1's gated-gelu."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.activations import ACTIVATIONS, GATED
from attnlab.nn.layers import FeedForward


def _gelu_exact(x):  # x Phi(x), Phi the standard normal CDF (Hendrycks & Gimpel 2016)
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _gelu_tanh(x):  # the tanh approximation (GPT-2's gelu_new)
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))


def _silu(x):  # x sigmoid(x) (Elfwing et al. 2018; Swish with beta = 1)
    return x / (1 + torch.exp(-x))


FORMULAS = {  # name -> (the element-wise function, gated, HF ACT2FN name)
    "relu": (lambda x: x.clamp(min=0), False, "relu"),
    "gelu": (_gelu_exact, False, "gelu"),
    "gelu_tanh": (_gelu_tanh, False, "gelu_new"),
    "silu": (_silu, False, "silu"),
    "reglu": (lambda x: x.clamp(min=0), True, "relu"),
    "geglu": (_gelu_exact, True, "gelu"),
    "geglu_tanh": (_gelu_tanh, True, "gelu_new"),
    "swiglu": (_silu, True, "silu"),
}


def test_every_registered_activation_has_a_reference():
    assert set(FORMULAS) == set(ACTIVATIONS)
    assert GATED == {name for name, (_, gated, _) in FORMULAS.items() if gated}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_equals_its_formula_and_transformers(name):
    from transformers.activations import ACT2FN

    formula, gated, hf_name = FORMULAS[name]
    x = torch.linspace(-5, 5, 2001, dtype=torch.float64)
    got = ACTIVATIONS[name].fn(x)
    torch.testing.assert_close(got, formula(x), atol=1e-12, rtol=1e-12)  # exact vs tanh differ by ~1e-3
    torch.testing.assert_close(got, ACT2FN[hf_name](x), atol=1e-12, rtol=1e-12)
    assert ACTIVATIONS[name].gated == gated


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_feed_forward_applies_the_activation_to_the_gate_half(name):
    torch.manual_seed(0)
    ffn = FeedForward(8, 16, name, bias=False)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    ffn = ffn.double()
    formula, gated, _ = FORMULAS[name]
    if gated:
        w1, w3 = ffn.w13.weight.chunk(2)  # W1 (the gate), then W3
        expected = (formula(x @ w1.T) * (x @ w3.T)) @ ffn.w2.weight.T
    else:
        expected = formula(x @ ffn.w1.weight.T) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)


def test_swiglu_feed_forward_equals_llama_mlp():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    hf = LlamaMLP(LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=2,
                                hidden_act="silu")).double()
    _assert_gated_equals("swiglu", hf, hf.gate_proj.weight, hf.up_proj.weight, hf.down_proj.weight)


def test_geglu_tanh_feed_forward_equals_t5_gated_gelu():
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5DenseGatedActDense

    hf = T5DenseGatedActDense(T5Config(d_model=8, d_ff=16, dropout_rate=0.0,
                                       feed_forward_proj="gated-gelu")).double().eval()
    _assert_gated_equals("geglu_tanh", hf, hf.wi_0.weight, hf.wi_1.weight, hf.wo.weight)


def test_gelu_is_exact_not_the_tanh_approximation():
    # the two differ by up to ~5e-4 near |x| = 2: a swap of one for the other must show
    x = torch.linspace(-4, 4, 801, dtype=torch.float64)
    assert (F.gelu(x) - F.gelu(x, approximate="tanh")).abs().max() > 1e-4
    assert (ACTIVATIONS["gelu"].fn(x) - _gelu_tanh(x)).abs().max() > 1e-4
    assert (ACTIVATIONS["gelu_tanh"].fn(x) - _gelu_exact(x)).abs().max() > 1e-4


def _assert_gated_equals(activation: str, hf: torch.nn.Module, gate: torch.Tensor, up: torch.Tensor,
                         down: torch.Tensor) -> None:
    """attnlab's gated feed-forward given `hf`'s gate, up and down weights computes what `hf` does (float64)."""
    ffn = FeedForward(8, 16, activation, bias=False).double()
    with torch.no_grad():
        ffn.w13.weight.copy_(torch.cat([gate, up]))
        ffn.w2.weight.copy_(down)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(ffn(x), hf(x))
