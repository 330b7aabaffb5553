"""Recurrent and convolutional sequence layers, and the attentions of RNN encoder-decoders.

Notation: B batch, T (or S) length, I input width, Hd hidden width, Tq decoder steps.

    RNN  (Elman 1990):  h_t = tanh(W_h h_{t-1} + W_x x_t + b)
    LSTM (Hochreiter & Schmidhuber 1997), GRU (Cho et al. 2014, https://arxiv.org/abs/1406.1078):
         gated cells, taken from torch.nn
    word window (1-D convolution, Kim 2014 / Collobert et al. 2011): each layer mixes a window
         of w neighbours, so two tokens T apart interact only after about T / (w - 1) layers.

Attention of a decoder state s (query) over encoder states h_i (keys = values):
    additive (Bahdanau et al. 2015, https://arxiv.org/abs/1409.0473):  e_i = v^T tanh(W_s s + W_h h_i + b)
    dot      (Luong et al. 2015, https://arxiv.org/abs/1508.04025):     e_i = s . h_i
    general  (Luong et al. 2015):                                       e_i = s^T W h_i
    alpha = softmax(e) over real source positions, context a = sum_i alpha_i h_i.

`ExplicitRNN` unrolls the plain cell in Python and returns every h_t as a graph node, so
`torch.autograd.grad(loss, states)` reads dL/dh_t at each position (see inspect.gradient_flow).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.nn.hook_points import HookPoint, tap
from attnlab.nn.kernels import attention_weights

CELLS = ("rnn", "lstm", "gru")


class RNNCell(nn.Module):
    """h' = act(W_h h + W_x x + b) with act = tanh (Elman) or identity (a linear RNN).

    Raises:
        ValueError: an unknown nonlinearity.
    """

    def __init__(self, input_size: int, hidden_size: int, nonlinearity: str = "tanh"):
        super().__init__()
        if nonlinearity not in ("tanh", "linear"):
            raise ValueError(f"nonlinearity={nonlinearity!r} is not one of tanh, linear")
        self.nonlinearity = nonlinearity
        self.hidden_size = hidden_size
        self.w_x = nn.Linear(input_size, hidden_size)  # W_x and b
        self.w_h = nn.Linear(hidden_size, hidden_size, bias=False)  # W_h

    def forward(self, x: Tensor, h: Tensor) -> Tensor:
        pre = self.w_h(h) + self.w_x(x)  # (B, Hd)
        return torch.tanh(pre) if self.nonlinearity == "tanh" else pre

    def gradient_bound_factor(self) -> float:
        """sigma_max(W_h) * max|act'|: ||dh_t/dh_k|| <= factor^(t-k) (max tanh' = 1)."""
        return float(torch.linalg.matrix_norm(self.w_h.weight.detach().float(), ord=2))


class ExplicitRNN(nn.Module):
    """The plain RNN unrolled step by step; returns every hidden state as its own tensor."""

    def __init__(self, input_size: int, hidden_size: int, nonlinearity: str = "tanh"):
        super().__init__()
        self.cell = RNNCell(input_size, hidden_size, nonlinearity)

    def forward(self, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        """x (B, T, I) -> (outputs (B, T, Hd), [h_1, ..., h_T] each (B, Hd))."""
        B, T, _ = x.shape
        h = x.new_zeros(B, self.cell.hidden_size) if h0 is None else h0
        states = []
        for t in range(T):
            h = self.cell(x[:, t], h)
            states.append(h)
        return torch.stack(states, dim=1), states


class ExplicitLSTM(nn.Module):
    """An LSTM unrolled step by step (torch.nn.LSTMCell); returns every h_t as its own tensor."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """x (B, T, I) -> (outputs (B, T, Hd), [h_1, ..., h_T])."""
        B, T, _ = x.shape
        h = c = x.new_zeros(B, self.cell.hidden_size)
        states = []
        for t in range(T):
            h, c = self.cell(x[:, t], (h, c))
            states.append(h)
        return torch.stack(states, dim=1), states


def _check_mask(mask: Tensor | None, B: int, T: int, name: str = "mask") -> Tensor | None:
    if mask is None:
        return None
    if mask.shape != (B, T):
        raise ValueError(f"{name} must have shape (B, T) = {(B, T)}, got {tuple(mask.shape)}")
    return mask.bool()


class RecurrentLayer(nn.Module):
    """torch.nn.RNN / LSTM / GRU over a padded batch (batch first).

    Padding may sit anywhere: real tokens are gathered to the front of each row, packed (so the
    recurrence never reads a padding token), run, and scattered back; padding outputs are 0.

    Args:
        cell: `rnn`, `lstm` or `gru`.
        input_size, hidden_size, num_layers, bidirectional, dropout: as in torch.nn.LSTM.

    Raises:
        ValueError: an unknown cell.
    """

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = False, dropout: float = 0.0):
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"cell={cell!r} is not one of {', '.join(CELLS)}")
        kind = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.cell = cell
        self.hidden_size = hidden_size
        self.num_directions = 2 if bidirectional else 1
        self.rnn = kind(input_size, hidden_size, num_layers=num_layers, bidirectional=bidirectional,
                        dropout=dropout if num_layers > 1 else 0.0, batch_first=True)

    @property
    def output_size(self) -> int:
        return self.hidden_size * self.num_directions

    def forward(self, x: Tensor, mask: Tensor | None = None, state=None) -> tuple[Tensor, object]:
        """x (B, T, I), mask (B, T) 1 = real -> (outputs (B, T, Hd * dirs), final state as torch.nn gives)."""
        B, T, _ = x.shape
        mask = _check_mask(mask, B, T)
        if mask is None or bool(mask.all()):
            return self.rnn(x, state)
        lengths = mask.sum(-1)
        if int(lengths.min()) == 0:
            raise ValueError("mask has a row with no real token; every sequence needs at least one")
        order = torch.argsort((~mask).int(), dim=-1, stable=True)  # real positions first, in order
        packed_in = x.gather(1, order[..., None].expand_as(x))
        packed = nn.utils.rnn.pack_padded_sequence(packed_in, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed, state)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)  # (B, T, Hd*dirs)
        restored = torch.zeros_like(out).scatter(1, order[..., None].expand_as(out), out)
        return restored, final


class ConvEncoder(nn.Module):
    """Word-window encoder: layers of x + ReLU(Conv1d_w(x)) with an odd window w ("same" padding).

    Padding positions are zeroed before every convolution, so they contribute nothing.

    Raises:
        ValueError: an even or non-positive window.
    """

    def __init__(self, d_model: int, window: int = 3, num_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        if not isinstance(window, int) or window < 1 or window % 2 == 0:
            raise ValueError(f"window must be an odd positive integer, got {window!r}")
        self.window = window
        self.convs = nn.ModuleList(nn.Conv1d(d_model, d_model, window, padding=window // 2)
                                   for _ in range(num_layers))
        self.dropout = nn.Dropout(dropout)

    def layers_to_connect(self, distance: int) -> int:
        """Layers needed before two tokens `distance` apart interact: ceil(distance / (w // 2))."""
        reach = max(1, self.window // 2)
        return -(-distance // reach)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (B, T, D), mask (B, T) -> (B, T, D)."""
        B, T, _ = x.shape
        keep = _check_mask(mask, B, T)
        for conv in self.convs:
            if keep is not None:
                x = x * keep[..., None]
            x = x + self.dropout(torch.relu(conv(x.transpose(1, 2)).transpose(1, 2)))
        return x * keep[..., None] if keep is not None else x


class RecurrentAttention(nn.Module):
    """Base: scores e (B, Tq, S) of queries over keys; forward returns (context, weights).

    Hook point `hook_pattern`: the weights (B, 1, Tq, S) (the alignment; one decoder step per call
    for the additive attention); a hook that replaces them gets the context computed from its own."""

    def __init__(self):
        super().__init__()
        self.hook_pattern = HookPoint()

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, query: Tensor, keys: Tensor, mask: Tensor | None = None, **score_options: Tensor) -> tuple[Tensor, Tensor]:
        """query (B, Tq, Dq), keys = values (B, S, Dk), mask (B, S) 1 = real ->
        (context (B, Tq, Dk), weights (B, 1, Tq, S), one head, each row a distribution).
        `score_options` go to `scores` (the additive score's `projected_keys`)."""
        B, S, _ = keys.shape
        keep = _check_mask(mask, B, S, "src_mask")
        e = self.scores(query, keys, **score_options)[:, None]  # (B, 1, Tq, S)
        weights = tap(self.hook_pattern, attention_weights(e, keep[:, None, None, :] if keep is not None else None))
        return weights[:, 0] @ keys, weights


class AdditiveAttention(RecurrentAttention):
    """e_i = v^T tanh(W_s s + W_h h_i + b) (Bahdanau et al. 2015, https://arxiv.org/abs/1409.0473)."""

    def __init__(self, query_dim: int, key_dim: int, hidden: int):
        super().__init__()
        self.w_query = nn.Linear(query_dim, hidden, bias=False)
        self.w_key = nn.Linear(key_dim, hidden, bias=True)
        self.v = nn.Linear(hidden, 1, bias=False)

    def scores(self, query: Tensor, keys: Tensor, projected_keys: Tensor | None = None) -> Tensor:
        """e (B, Tq, S); `projected_keys` = `w_key(keys)` when the caller computed it already (a
        decoder attending step by step to the same memory projects it once, not once per step)."""
        projected = self.w_key(keys) if projected_keys is None else projected_keys
        hidden = torch.tanh(self.w_query(query)[:, :, None, :] + projected[:, None, :, :])  # (B, Tq, S, A)
        return self.v(hidden)[..., 0]  # (B, Tq, S)


class MultiplicativeAttention(RecurrentAttention):
    """e_i = s . h_i (`dot`) or s^T W h_i (`general`) (Luong et al. 2015, https://arxiv.org/abs/1508.04025).

    Raises:
        ValueError: an unknown kind, or `dot` with query_dim != key_dim.
    """

    def __init__(self, query_dim: int, key_dim: int, kind: str = "general"):
        super().__init__()
        if kind not in ("dot", "general"):
            raise ValueError(f"kind={kind!r} is not one of dot, general")
        if kind == "dot" and query_dim != key_dim:
            raise ValueError(f"dot attention needs query_dim == key_dim, got {query_dim} and {key_dim}")
        self.kind = kind
        self.weight = nn.Linear(key_dim, query_dim, bias=False) if kind == "general" else None

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        k = self.weight(keys) if self.weight is not None else keys  # (B, S, Dq)
        return query @ k.transpose(1, 2)  # (B, Tq, S)


def build_recurrent_attention(kind: str, query_dim: int, key_dim: int, hidden: int | None = None) -> RecurrentAttention | None:
    """`none` -> None, `additive`, `dot`, `general` -> the module.

    Raises:
        ValueError: an unknown kind.
    """
    if kind == "none":
        return None
    if kind == "additive":
        return AdditiveAttention(query_dim, key_dim, hidden or query_dim)
    if kind in ("dot", "general"):
        return MultiplicativeAttention(query_dim, key_dim, kind)
    raise ValueError(f"attention={kind!r} is not one of none, additive, dot, general")
