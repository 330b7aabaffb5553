"""The logit lens: its last layer is the model's output, and layer k's row is what the same
model cut after k layers predicts."""

import copy

import pytest
import torch
from torch import nn

from attnlab import ModelConfig, build_model
from attnlab.inspect.logit_lens import lens_top_tokens, logit_lens, residual_stream

V = 25


def _model(arch, **extra):
    cfg = ModelConfig(arch=arch, vocab_size=V, d_model=16, num_layers=3, num_heads=2, d_ff=32, dropout=0.0, **extra)
    torch.manual_seed(0)
    return build_model(cfg).eval()


CASES = [("decoder", {"norm_placement": "pre"}, "", 1), ("decoder", {}, "", 1), ("encoder", {"head": "mlm"}, "", 1),
         ("encoder_decoder", {"norm_placement": "pre"}, "decoder", 2)]


@pytest.mark.parametrize("arch,extra,stack,n_inputs", CASES)
def test_each_layer_reads_like_the_model_cut_after_it(arch, extra, stack, n_inputs):
    model = _model(arch, **extra)
    inputs = (torch.randint(1, V, (2, 7)), torch.randint(1, V, (2, 5)))[:n_inputs]
    lens = logit_lens(model, *inputs)
    assert lens.shape == (3, 2, inputs[-1].shape[1], V)
    torch.testing.assert_close(lens[-1], model(*inputs))
    for k in (1, 2):
        cut = copy.deepcopy(model)
        part = cut.get_submodule(stack) if stack else cut
        part.layers = nn.ModuleList(list(part.layers)[:k])
        torch.testing.assert_close(lens[k - 1], cut(*inputs), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(lens[k - 1], lens[-1])


def test_residual_stream_and_top_tokens():
    model = _model("decoder", norm_placement="pre")  # with a final norm
    ids = torch.randint(1, V, (1, 5))
    hidden, output = residual_stream(model, ids)
    assert hidden.shape == (3, 1, 5, 16)
    torch.testing.assert_close(model.head(model.final_norm(hidden[-1])), output)
    top, probs = lens_top_tokens(logit_lens(model, ids), k=3)
    assert top.shape == probs.shape == (3, 1, 5, 3)
    assert torch.equal(top[-1, ..., 0], output.argmax(-1)) and (probs[..., 0] >= probs[..., 1]).all()
    with pytest.raises(ValueError, match="k must be"):
        lens_top_tokens(output[None], k=0)


def test_models_without_a_vocabulary_head_are_refused():
    with pytest.raises(ValueError, match="no vocabulary head"):
        logit_lens(_model("encoder"), torch.randint(1, V, (1, 4)))
    rnn = build_model(ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=8, rnn={"hidden_size": 8}))
    with pytest.raises(ValueError, match="no stack of Transformer layers"):
        logit_lens(rnn, torch.randint(1, V, (1, 4)), torch.randint(1, V, (1, 3)))
