"""source_gradient_norms on encoder-decoders (Transformer and recurrent): equal to the gradient
taken at a leaf that replaces the encoder input, and zero on source padding."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.inspect.gradient_flow import source_gradient_norms

V = 20


def _model(arch, **rnn):
    if arch == "rnn_encoder_decoder":
        cfg = ModelConfig(arch=arch, vocab_size=V, d_model=8, dropout=0.0,
                          rnn={"hidden_size": 8, **rnn})
    else:
        cfg = ModelConfig(arch=arch, vocab_size=V, d_model=8, num_layers=1, num_heads=2, d_ff=16, dropout=0.0)
    torch.manual_seed(0)
    return build_model(cfg).eval()


def _leaf_reference(model, embed, src, tgt, labels, mask):
    """Replace the encoder input by a leaf tensor and differentiate the loss with respect to it."""
    holder = []

    def swap(mod, args, out):
        if holder:
            return None
        leaf = out.detach().requires_grad_(True)
        holder.append(leaf)
        return leaf

    handle = embed.register_forward_hook(swap)
    try:
        logits = model(src, tgt, mask)
    finally:
        handle.remove()
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                             reduction="sum")
    loss.backward()
    return holder[0].grad.norm(dim=-1).norm(dim=0)  # (S,)


@pytest.mark.parametrize("arch,rnn", [("encoder_decoder", {}), ("rnn_encoder_decoder", {"cell": "lstm"}),
                                      ("rnn_encoder_decoder", {"cell": "rnn", "attention": "none"})])
def test_equals_a_leaf_reference_and_padding_gets_nothing(arch, rnn):
    model = _model(arch, **rnn)
    src = torch.randint(1, V, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    src[1, 5:] = 0
    tgt, labels = torch.randint(1, V, (2, 4)), torch.randint(1, V, (2, 4))
    labels[0, -1] = -100
    norms = source_gradient_norms(model, src, tgt, labels, mask)
    embed = model.src_embed if arch == "rnn_encoder_decoder" else model.encoder.embed
    torch.testing.assert_close(norms, _leaf_reference(model, embed, src, tgt, labels, mask), rtol=1e-5, atol=1e-7)
    assert norms.shape == (7,) and (norms > 0).all()  # row 0 is real everywhere
    one = source_gradient_norms(model, src[1:], tgt[1:], labels[1:], mask[1:])
    assert (one[5:] == 0).all() and (one[:5] > 0).all()
    with pytest.raises(TypeError, match="EncoderDecoder"):
        source_gradient_norms(torch.nn.Linear(2, 2), src, tgt, labels)
