import torch

from attnlab.inspect.gradient_flow import gradient_flow, plot_gradient_flow, scale_recurrent_matrix_, state_gradient_norms
from attnlab.nn.rnn import ExplicitRNN


def test_linear_rnn_gradients_decay_exactly_geometrically():
    sigma = 0.7
    norms = gradient_flow("linear_rnn", seq_len=20, spectral_norm=sigma)
    # W_h = sigma * orthogonal: dL/dh_k = (W_h^T)^(T-k) dL/dh_T, so the norm is exactly sigma^(T-k) times
    ratios = norms[:-1] / norms[1:]
    torch.testing.assert_close(ratios, torch.full_like(ratios, sigma), rtol=1e-4, atol=0)


def test_tanh_rnn_gradients_obey_the_bound():
    for sigma in (0.5, 0.9):
        norms = gradient_flow("rnn", seq_len=30, spectral_norm=sigma, seed=1)
        T = len(norms)
        dist = torch.arange(T - 1, -1, -1, dtype=torch.float32)
        bound = norms[-1] * sigma**dist  # ||dL/dh_k|| <= (sigma * max tanh')^(T-k) ||dL/dh_T||
        assert (norms <= bound * (1 + 1e-4)).all()
        assert norms[0] < 1e-3 * norms[-1] or sigma > 0.8
        logs = norms.log()
        assert (logs[1:] - logs[:-1]).mean() > 0  # grows towards the loss: decays with distance


def test_state_gradient_norms_match_autograd_and_transformer_is_flat(tmp_path):
    rnn = ExplicitRNN(3, 5)
    scale_recurrent_matrix_(rnn, 0.5, torch.Generator().manual_seed(0))
    x = torch.randn(2, 6, 3)
    out, states = rnn(x)
    norms = state_gradient_norms(out[:, -1].sum(), states)
    out, states = rnn(x)
    for s in states:
        s.retain_grad()
    out[:, -1].sum().backward()
    torch.testing.assert_close(norms, torch.stack([s.grad.norm() for s in states]))
    tr = gradient_flow("transformer", seq_len=30)
    rnn_n = gradient_flow("rnn", seq_len=30, spectral_norm=0.9)
    lstm_n = gradient_flow("lstm", seq_len=30)
    # h_T reaches the loss through the residual path as well; the other positions only through
    # attention, which reaches the first one as directly as the one before last: no decay
    assert tr[:-1].min() / tr[:-1].max() > 0.1
    assert rnn_n[0] / rnn_n[-2] < 1e-3 and lstm_n[0] / lstm_n[-2] < 1e-2
    path = plot_gradient_flow({"rnn": rnn_n, "lstm": lstm_n, "transformer": tr}, tmp_path / "g.png")
    assert open(path, "rb").read(4) == b"\x89PNG"
