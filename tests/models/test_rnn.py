import itertools

import pytest
import torch
import torch.nn.functional as F

from attnlab import ModelConfig, build_model
from attnlab.inspect.attention_maps import attention_maps
from attnlab.models.rnn import RNNDecoderState, RNNEncoderDecoder

V = 23
COMBOS = [(c, a) for c, a in itertools.product(["rnn", "lstm", "gru", "conv"], ["none", "additive", "dot", "general"])]


def rnn_model(cell, attention, **kw):
    rnn = {"cell": cell, "attention": attention, "hidden_size": 16, "num_layers": 2,
           "bidirectional": cell != "conv" and attention != "dot", **kw}
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=16, dropout=0.0, rnn=rnn)
    return build_model(cfg).eval()


@pytest.mark.parametrize("cell,attention", COMBOS)
def test_causal_padding_and_incremental(cell, attention):
    model = rnn_model(cell, attention)
    assert isinstance(model, RNNEncoderDecoder) and model.config.arch == "rnn_encoder_decoder"
    src, tgt = torch.randint(1, V, (2, 6)), torch.randint(1, V, (2, 5))
    logits = model(src, tgt)
    assert logits.shape == (2, 5, V)
    # causality: changing target token 3 leaves logits 0..2 unchanged
    edited = tgt.clone()
    edited[:, 3] = (edited[:, 3] % (V - 1)) + 1
    out = model(src, edited)
    torch.testing.assert_close(out[:, :3], logits[:, :3])
    assert not torch.allclose(out[:, 3:], logits[:, 3:])
    # source padding on either side changes nothing
    padded = torch.cat([torch.full((2, 2), 0), src, torch.full((2, 1), 0)], 1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0]] * 2)
    torch.testing.assert_close(model(padded, tgt, mask), logits, rtol=1e-5, atol=1e-5)
    # target right padding changes nothing at real positions
    tgt_pad = torch.cat([tgt, torch.zeros(2, 2, dtype=torch.long)], 1)
    tgt_mask = torch.cat([torch.ones(2, 5), torch.zeros(2, 2)], 1)
    torch.testing.assert_close(model(src, tgt_pad, tgt_mask=tgt_mask)[:, :5], logits)
    # incremental decoding with a state equals the full forward
    memory, state = model.encode(src), RNNDecoderState()
    steps = [model.decode(tgt[:, i : i + 1], memory, cache=state) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), logits, rtol=1e-5, atol=1e-5)
    assert state.length == 5


@pytest.mark.parametrize("attention", ["additive", "dot", "general"])
def test_attention_weights_are_distributions_over_real_source(attention):
    model = rnn_model("gru", attention)
    src, tgt = torch.randint(1, V, (2, 6)), torch.randint(1, V, (2, 4))
    mask = torch.ones(2, 6)
    mask[0, 4:] = 0
    w = attention_maps(model, src, tgt, mask)["attention"]
    assert w.shape == (2, 1, 4, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 4))
    assert w[0, :, :, 4:].abs().max() == 0 and (w >= 0).all()


def test_bottleneck_has_no_attention_and_config_validation():
    assert rnn_model("lstm", "none").attention is None
    assert len(attention_maps_or_empty(rnn_model("lstm", "none"))) == 0
    with pytest.raises(ValueError, match="rnn.attention: 'dot'"):
        ModelConfig(arch="rnn_encoder_decoder", rnn={"attention": "dot", "bidirectional": True})
    with pytest.raises(ValueError, match="rnn.cell"):
        ModelConfig(arch="rnn_encoder_decoder", rnn={"cell": "transformer"})
    with pytest.raises(ValueError, match="rnn.bidirectional"):
        ModelConfig(arch="rnn_encoder_decoder", rnn={"cell": "conv", "bidirectional": True})
    with pytest.raises(ValueError, match="unknown rnn field"):
        ModelConfig(arch="rnn_encoder_decoder", rnn={"cells": "lstm"})
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=V, d_model=16, rnn={"cell": "gru", "hidden_size": 8})
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="src_ids"):
        build_model(cfg)(torch.full((1, 3), V), torch.ones(1, 2, dtype=torch.long))


def attention_maps_or_empty(model):
    from attnlab.inspect.attention_maps import attention_modules

    return attention_modules(model)


def _overfit(attention, steps):
    torch.manual_seed(0)
    model = rnn_model("lstm", attention, num_layers=1, bidirectional=False)
    model.train()
    src = torch.randint(3, V, (4, 7))
    tgt = torch.cat([torch.ones(4, 1, dtype=torch.long), src.flip(1)], 1)  # start token, reversed source
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(steps):
        loss = F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def test_tiny_lstm_with_luong_attention_overfits_one_batch():
    assert _overfit("general", 60) < 0.05  # from ln(23) = 3.1


@pytest.mark.slow
def test_tiny_lstm_with_bahdanau_attention_overfits_one_batch():
    assert _overfit("additive", 80) < 0.05

