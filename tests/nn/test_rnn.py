import pytest
import torch
from torch import nn

from attnlab.nn.rnn import (AdditiveAttention, ConvEncoder, ExplicitLSTM, ExplicitRNN, MultiplicativeAttention,
                            RecurrentLayer, RNNCell, build_recurrent_attention)


def test_explicit_rnn_equals_torch_rnn():
    ref = nn.RNN(3, 5, batch_first=True)
    mine = ExplicitRNN(3, 5)
    with torch.no_grad():
        mine.cell.w_x.weight.copy_(ref.weight_ih_l0)
        mine.cell.w_x.bias.copy_(ref.bias_ih_l0 + ref.bias_hh_l0)  # one bias b = b_ih + b_hh
        mine.cell.w_h.weight.copy_(ref.weight_hh_l0)
    x = torch.randn(2, 7, 3)
    out, states = mine(x)
    torch.testing.assert_close(out, ref(x)[0])
    assert len(states) == 7 and states[3].shape == (2, 5)


def test_explicit_lstm_equals_torch_lstm_and_bound_factor():
    ref = nn.LSTM(3, 4, batch_first=True)
    mine = ExplicitLSTM(3, 4)
    with torch.no_grad():
        for a, b in (("weight_ih", "weight_ih_l0"), ("weight_hh", "weight_hh_l0"), ("bias_ih", "bias_ih_l0"),
                     ("bias_hh", "bias_hh_l0")):
            getattr(mine.cell, a).copy_(getattr(ref, b))
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(mine(x)[0], ref(x)[0])
    cell = RNNCell(2, 3)
    with torch.no_grad():
        cell.w_h.weight.copy_(torch.diag(torch.tensor([0.5, -2.0, 1.0])))
    assert abs(cell.gradient_bound_factor() - 2.0) < 1e-6
    with pytest.raises(ValueError, match="nonlinearity"):
        RNNCell(2, 3, "relu6")


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_recurrent_layer_ignores_padding_on_either_side(cell, bidirectional):
    layer = RecurrentLayer(cell, 3, 4, num_layers=2, bidirectional=bidirectional)
    x = torch.randn(1, 4, 3)
    alone = layer(x)[0]
    padded = torch.cat([torch.randn(1, 2, 3), x, torch.randn(1, 1, 3)], dim=1)  # left and right padding
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    out = layer(padded, mask)[0]
    torch.testing.assert_close(out[:, 2:6], alone)
    assert out[:, [0, 1, 6]].abs().max() == 0
    with pytest.raises(ValueError, match="no real token"):
        layer(padded, torch.zeros(1, 7))


def test_conv_encoder_interaction_distance():
    enc = ConvEncoder(6, window=3, num_layers=2)
    x = torch.randn(1, 12, 6)
    base = enc(x)
    changed = x.clone()
    changed[0, 0] += 1.0
    diff = (enc(changed) - base).abs().sum(-1)[0]
    assert (diff[:3] > 0).all() and (diff[3:] == 0).all()  # 2 layers x reach 1 = distance 2
    assert enc.layers_to_connect(11) == 11
    mask = torch.ones(1, 12)
    mask[0, 8:] = 0
    out = enc(torch.cat([x[:, :8], torch.randn(1, 4, 6)], 1), mask)
    torch.testing.assert_close(out[:, :8], enc(x[:, :8]))
    with pytest.raises(ValueError, match="window"):
        ConvEncoder(6, window=4)


def test_additive_attention_equals_bahdanau_formula():
    att = AdditiveAttention(5, 6, 7)
    s, h = torch.randn(2, 3, 5), torch.randn(2, 4, 6)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    ctx, w = att(s, h, mask)
    W_s, W_h, b, v = att.w_query.weight, att.w_key.weight, att.w_key.bias, att.v.weight[0]
    e = torch.empty(2, 3, 4)
    for bi in range(2):
        for t in range(3):
            for i in range(4):
                e[bi, t, i] = v @ torch.tanh(W_s @ s[bi, t] + W_h @ h[bi, i] + b)
    e[0, :, 3] = float("-inf")
    alpha = torch.softmax(e, -1)
    torch.testing.assert_close(w[:, 0], alpha)
    torch.testing.assert_close(ctx, alpha @ h)
    assert w.shape == (2, 1, 3, 4)


def test_multiplicative_attention():
    dot = MultiplicativeAttention(4, 4, "dot")
    s, h = torch.randn(1, 2, 4), torch.randn(1, 3, 4)
    ctx, w = dot(s, h)
    torch.testing.assert_close(w[:, 0], torch.softmax(s @ h.transpose(1, 2), -1))
    gen = MultiplicativeAttention(4, 6, "general")
    h6 = torch.randn(1, 3, 6)
    _, w = gen(s, h6)
    W = gen.weight.weight  # (4, 6)
    torch.testing.assert_close(w[:, 0], torch.softmax(s @ W @ h6[0].T, -1))
    assert (w >= 0).all()
    with pytest.raises(ValueError, match="query_dim == key_dim"):
        MultiplicativeAttention(4, 6, "dot")
    assert build_recurrent_attention("none", 4, 4) is None
    with pytest.raises(ValueError, match="attention"):
        build_recurrent_attention("cosine", 4, 4)
