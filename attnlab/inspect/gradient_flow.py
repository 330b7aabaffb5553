"""How far back a loss reaches: ||dL/dh_k|| at every position k, for RNN, LSTM and Transformer.

Backpropagation through time multiplies Jacobians: for h_t = tanh(W_h h_{t-1} + W_x x_t + b),

    dh_t/dh_k = prod_{j=k+1..t} diag(tanh'(a_j)) W_h,   ||dh_t/dh_k|| <= (sigma_max(W_h) * max|tanh'|)^(t-k)

so with sigma_max(W_h) < 1 the signal from a loss at step t decays geometrically with t - k
(Bengio et al. 1994; Pascanu et al. 2013, https://arxiv.org/abs/1211.5063). An LSTM's additive
cell path decays more slowly; self-attention connects every position to the loss in one step.

The task here is the same for all three: a random input sequence x (B, T, d), a loss on the
output at the last position only, and h_k = the state the model holds for position k (the
recurrent hidden state; for the Transformer, the input of its first layer at position k).

On a trained translation model, `source_gradient_norms` measures the same thing over source
positions: ||dL/dx_k|| with L the target's summed negative log-likelihood (teacher forcing) and
x_k the encoder's input at source position k (token embedding, plus positions in a Transformer).
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from torch import Tensor, nn

from attnlab.nn.layers import FeedForward, TransformerLayer
from attnlab.nn.norms import make_norm
from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.masks import causal_mask
from attnlab.nn.rnn import ExplicitLSTM, ExplicitRNN

ARCHS = ("rnn", "linear_rnn", "lstm", "transformer")


def state_gradient_norms(loss: Tensor, states: Sequence[Tensor]) -> Tensor:
    """||dL/dh_k|| for each state tensor (the norm over the batch and features).

    Args:
        loss: a scalar in the graph of `states`.
        states: the per-position tensors h_1..h_T (each (B, d)), or one (B, T, d) tensor.

    Returns:
        (T,) float tensor of gradient norms.
    """
    if isinstance(states, Tensor):
        (g,) = torch.autograd.grad(loss, states)
        return g.transpose(0, 1).flatten(1).norm(dim=-1)
    grads = torch.autograd.grad(loss, list(states), allow_unused=True)
    return torch.stack([g.norm() if g is not None else torch.zeros(()) for g in grads])


def scale_recurrent_matrix_(rnn: ExplicitRNN, spectral_norm: float, generator: torch.Generator | None = None) -> None:
    """Set W_h to `spectral_norm` times a random orthogonal matrix (all singular values equal)."""
    n = rnn.cell.hidden_size
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=generator))
    with torch.no_grad():
        rnn.cell.w_h.weight.copy_(q * spectral_norm)


def gradient_flow(arch: str, *, seq_len: int = 40, d_model: int = 32, batch_size: int = 4,
                  spectral_norm: float | None = None, num_layers: int = 2, seed: int = 0) -> Tensor:
    """||dL/dh_k|| for k = 1..T on a random sequence, with L = sum of the last output.

    Args:
        arch: `rnn` (tanh), `linear_rnn`, `lstm` or `transformer` (causal, pre-LN layers).
        seq_len, d_model, batch_size: the input size.
        spectral_norm: for the RNNs, W_h = spectral_norm * a random orthogonal matrix
            (None keeps torch's initialisation).
        num_layers: Transformer layers.
        seed: every random choice (weights, input) comes from it.

    Returns:
        (T,) gradient norms, position 0 first.

    Raises:
        ValueError: an unknown arch.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r} is not one of {', '.join(ARCHS)}")
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        x = torch.randn(batch_size, seq_len, d_model, generator=gen)
        if arch in ("rnn", "linear_rnn"):
            model = ExplicitRNN(d_model, d_model, "tanh" if arch == "rnn" else "linear")
            if spectral_norm is not None:
                scale_recurrent_matrix_(model, spectral_norm, gen)
            out, states = model(x)
            return state_gradient_norms(out[:, -1].sum(), states)
        if arch == "lstm":
            out, states = ExplicitLSTM(d_model, d_model)(x)
            return state_gradient_norms(out[:, -1].sum(), states)
        layers = nn.ModuleList(
            TransformerLayer(MultiHeadAttention(d_model, 4), FeedForward(d_model, 4 * d_model),
                             make_norm=lambda: make_norm("layernorm", d_model), placement="pre", dropout=0.0)
            for _ in range(num_layers))
        h0 = x.clone().requires_grad_(True)
        h, mask = h0, causal_mask(seq_len)
        for layer in layers:
            h = layer(h, mask)
        return state_gradient_norms(h[:, -1].sum(), h0)


def source_gradient_norms(model: nn.Module, src_ids: Tensor, tgt_ids: Tensor, labels: Tensor,
                          src_mask: Tensor | None = None) -> Tensor:
    """||dL/dx_k|| at every source position k of an encoder-decoder (Transformer or recurrent).

    Args:
        model: an `EncoderDecoder` or `RNNEncoderDecoder` (put it in eval mode: dropout off).
        src_ids: (B, S) source ids; src_mask: (B, S), 1 on real tokens, or None.
        tgt_ids: (B, T) decoder inputs (start token + target); labels: (B, T) next tokens,
            -100 where no loss is taken.

    Returns:
        (S,) norms over the batch and features of dL/dx_k, L = summed target NLL; padding
        positions get 0.

    Raises:
        TypeError: a model that is not an encoder-decoder.
    """
    from attnlab.models.rnn import RNNEncoderDecoder
    from attnlab.models.transformer import EncoderDecoder

    if isinstance(model, RNNEncoderDecoder):
        embed = model.src_embed  # (may be the target's table too: the encoder calls it first)
    elif isinstance(model, EncoderDecoder):
        embed = model.encoder.embed
    else:
        raise TypeError(f"model must be an EncoderDecoder or RNNEncoderDecoder, got {type(model).__name__}")
    captured: list[Tensor] = []
    handle = embed.register_forward_hook(lambda mod, args, out: captured.append(out) if not captured else None)
    try:
        with torch.enable_grad():
            logits = model(src_ids, tgt_ids, src_mask)  # (B, T, V)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                               reduction="sum")
            return state_gradient_norms(loss, captured[0])  # x: (B, S, D)
    finally:
        handle.remove()


def plot_gradient_flow(norms: dict[str, Tensor], path: str | os.PathLike) -> str:
    """Norms against distance from the loss (T - 1 - k), log scale, one line per model."""
    from attnlab.inspect.plots import plot_lines

    series = {name: (list(range(len(n) - 1, -1, -1)), n.tolist()) for name, n in norms.items()}
    return plot_lines(series, path, xlabel="distance from the loss (t - k)", ylabel="||dL/dh_k||",
                      title="gradient flow", logy=True)
