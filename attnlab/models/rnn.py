"""Recurrent encoder-decoders: the models attention was invented for.

    src ids -> Embedding -> encoder (RNN / LSTM / GRU, optionally bidirectional, or a word-window
               ConvEncoder) -> memory h_1..h_S (B, S, Hm)
    tgt ids -> Embedding -> decoder RNN -> s_t; c_t from the memory; logits = W_out tanh(W_o [s_t; c_t])

c_t depends on the attention (`RNNConfig.attention`):
    none      c_t = the fixed-size summary of the source (the bottleneck of Sutskever et al. 2014 /
              Cho et al. 2014): last forward state, first backward state, or the masked mean (conv);
              it also feeds every decoder input.
    additive  Bahdanau et al. 2015 (https://arxiv.org/abs/1409.0473): s_{t-1} scores every h_i,
              c_t = sum_i alpha_i h_i feeds the step that makes s_t (a Python loop over steps).
    dot, general  Luong et al. 2015 (https://arxiv.org/abs/1508.04025): s_t (computed for all steps
              at once) scores every h_i; c_t joins s_t in the output layer.
The first decoder state is tanh(W_b summary) in every layer (LSTM cells start at 0).

Contract (as `EncoderDecoder`): `model(src_ids, tgt_ids, src_mask=None, tgt_mask=None) -> (B, Tt, V)`,
`encode(src_ids, src_mask) -> memory`, `decode(tgt_ids, memory, src_mask, tgt_mask, cache)`
(`features(...)`: the same, before the output projection). Decoding with `attnlab.generate` goes
through `attnlab.decoding.runner.RecurrentRunner` (the state above plays the KV cache's part).
The decoder is causal by construction; target padding must follow the real tokens (right
padding), as in teacher forcing. Source padding may sit anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.nn.hook_points import HasHookPoints, HookPoint, tap
from attnlab.nn.rnn import ConvEncoder, RecurrentLayer, build_recurrent_attention


@dataclass
class RNNDecoderState:
    """Incremental decoding state: pass the same object to successive `decode` calls with only
    the new target tokens; it holds the recurrent state, the last top-layer output s_{t-1} and
    the number of steps taken."""

    state: Any = None  # h (L, B, Hd), or (h, c) for an LSTM decoder
    last_output: Tensor | None = None  # (B, Hd)
    length: int = 0
    projected_keys: Tensor | None = None  # additive attention's W_h h_i (B, S, A), computed at the first call

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) the batch rows `index` (N,): beam search and sampled copies."""
        if isinstance(self.state, tuple):
            self.state = tuple(s.index_select(1, index) for s in self.state)
        elif self.state is not None:
            self.state = self.state.index_select(1, index)
        if self.last_output is not None:
            self.last_output = self.last_output.index_select(0, index)
        if self.projected_keys is not None:
            self.projected_keys = self.projected_keys.index_select(0, index)


def _check_ids(name: str, ids: Tensor, vocab_size: int) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32):
        raise ValueError(f"{name} must be an integer tensor of shape (B, T), got "
                         f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name} is empty (T = 0)")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab_size})")


class RNNEncoderDecoder(HasHookPoints, nn.Module):
    """An RNN / LSTM / GRU (or word-window) encoder-decoder with optional attention.

    Args:
        vocab_size: target vocabulary; src_vocab_size: source vocabulary (None = shared embedding).
        d_model: embedding width; hidden_size: recurrent width; num_layers: recurrent layers.
        cell: `rnn`, `lstm`, `gru` or `conv` (the encoder; a conv model decodes with a GRU).
        attention: `none`, `additive`, `dot` or `general`.
        bidirectional: a bidirectional encoder (recurrent cells only).
        conv_window: the window of the conv encoder.
        attention_hidden: width of the additive scorer (None = hidden_size).
        tie_embeddings: the output projection shares the target embedding matrix.

    Hook points (`hook_points()`): `hook_src_embed` (B, S, D), `hook_memory` (B, S, Hm) the encoder's
    outputs, `hook_tgt_embed` (B, T, D), `hook_states` (B, T, Hd) the decoder's top states (a replacement reaches
    the output layer; the recurrence has run by then),
    `attention.hook_pattern` (the alignment, `attnlab.nn.rnn.RecurrentAttention`), `hook_decoder_out`
    (B, T, D) what the output projection reads.

    Raises:
        ValueError: an unknown cell or attention, or `dot` with mismatched widths.
    """

    def __init__(self, vocab_size: int, d_model: int, hidden_size: int, *, cell: str = "lstm",
                 attention: str = "additive", num_layers: int = 1, bidirectional: bool = False,
                 src_vocab_size: int | None = None, conv_window: int = 3, attention_hidden: int | None = None,
                 dropout: float = 0.0, tie_embeddings: bool = True):
        super().__init__()
        if cell not in ("rnn", "lstm", "gru", "conv"):
            raise ValueError(f"cell={cell!r} is not one of rnn, lstm, gru, conv")
        self.cell, self.attention_kind, self.num_layers = cell, attention, num_layers
        self.tgt_embed = nn.Embedding(vocab_size, d_model)
        self.src_embed = self.tgt_embed if src_vocab_size is None else nn.Embedding(src_vocab_size, d_model)
        self.dropout = nn.Dropout(dropout)
        if cell == "conv":
            self.encoder = ConvEncoder(d_model, conv_window, num_layers, dropout)
            memory_dim, dec_cell = d_model, "gru"
        else:
            self.encoder = RecurrentLayer(cell, d_model, hidden_size, num_layers, bidirectional, dropout)
            memory_dim, dec_cell = self.encoder.output_size, cell
        self.bidirectional = bidirectional and cell != "conv"
        self.memory_dim, self.hidden_size = memory_dim, hidden_size
        self.attention = build_recurrent_attention(attention, hidden_size, memory_dim, attention_hidden)
        feeds_context = attention in ("none", "additive")  # c_t (or the summary) joins the decoder input
        self.decoder = RecurrentLayer(dec_cell, d_model + (memory_dim if feeds_context else 0), hidden_size,
                                      num_layers, False, dropout)
        self.bridge = nn.Linear(memory_dim, hidden_size * num_layers)
        self.combine = nn.Linear(hidden_size + memory_dim, d_model)  # W_o [s_t; c_t]
        self.out = nn.Linear(d_model, vocab_size, bias=False)
        self.hook_src_embed, self.hook_memory, self.hook_tgt_embed = HookPoint(), HookPoint(), HookPoint()
        self.hook_states, self.hook_decoder_out = HookPoint(), HookPoint()
        if tie_embeddings:
            self.out.weight = self.tgt_embed.weight

    @property
    def vocab_size(self) -> int:
        return self.tgt_embed.num_embeddings

    # ---- encoder -----------------------------------------------------------------------------
    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, Hm); padding positions are 0."""
        _check_ids("src_ids", src_ids, self.src_embed.num_embeddings)
        x = tap(self.hook_src_embed, self.dropout(self.src_embed(src_ids)))  # (B, S, D)
        memory = self.encoder(x, src_mask) if self.cell == "conv" else self.encoder(x, src_mask)[0]
        return tap(self.hook_memory, memory)

    def summary(self, memory: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """The fixed-size source vector (B, Hm): last real forward state (and first real backward
        state), or the masked mean for the conv encoder."""
        B, S, _ = memory.shape
        keep = torch.ones(B, S, dtype=torch.bool, device=memory.device) if src_mask is None else src_mask.bool()
        if self.cell == "conv":
            return (memory * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1)
        pos = torch.arange(S, device=memory.device).expand(B, S)
        last = torch.where(keep, pos, -1).amax(1)  # (B,)
        first = torch.where(keep, pos, S).amin(1)
        rows = torch.arange(B, device=memory.device)
        if not self.bidirectional:
            return memory[rows, last]
        H = self.hidden_size
        return torch.cat((memory[rows, last, :H], memory[rows, first, H:]), dim=-1)

    def _initial_state(self, summary: Tensor) -> Any:
        B = summary.shape[0]
        h0 = torch.tanh(self.bridge(summary)).view(B, self.num_layers, self.hidden_size).transpose(0, 1).contiguous()
        return (h0, torch.zeros_like(h0)) if self.decoder.cell == "lstm" else h0

    # ---- decoder -----------------------------------------------------------------------------
    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None = None,
               tgt_mask: Tensor | None = None, cache: RNNDecoderState | None = None) -> Tensor:
        """Target ids (B, T) (the new ones, with a cache) attending to memory -> logits (B, T, V).

        tgt_mask is accepted for the contract; with right padding it changes nothing at real
        positions (the decoder only looks back), and padded positions' logits are not used.
        """
        return self.out(self.features(tgt_ids, memory, src_mask, tgt_mask, cache))

    def features(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None = None,
                 tgt_mask: Tensor | None = None, cache: RNNDecoderState | None = None) -> Tensor:
        """As `decode`, but the hidden states tanh(W_o [s_t; c_t]) (B, T, D) before the output
        projection `self.out` (the trainer fuses that projection into the loss)."""
        _check_ids("tgt_ids", tgt_ids, self.vocab_size)
        if cache is not None and not isinstance(cache, RNNDecoderState):
            raise TypeError(f"cache must be an RNNDecoderState, got {type(cache).__name__}")
        if src_mask is not None and src_mask.shape != memory.shape[:2]:
            raise ValueError(f"src_mask must be (B, S) = {tuple(memory.shape[:2])}, got {tuple(src_mask.shape)}")
        B, T = tgt_ids.shape
        y = tap(self.hook_tgt_embed, self.dropout(self.tgt_embed(tgt_ids)))  # (B, T, D)
        state = cache.state if cache is not None and cache.state is not None else None
        summary = self.summary(memory, src_mask)
        if state is None:
            state = self._initial_state(summary)
        if self.attention_kind == "none":  # the bottleneck: the same summary at every step
            c = summary[:, None].expand(B, T, -1)
            s, state = self.decoder.rnn(torch.cat((y, c), -1), state)  # (B, T, Hd)
        elif self.attention_kind == "additive":
            top = cache.last_output if cache is not None and cache.last_output is not None else self._top(state)
            outs, contexts = [], []
            projected = cache.projected_keys if cache is not None else None
            projected = self.attention.w_key(memory) if projected is None else projected  # W_h h_i: once, not per step
            if cache is not None:
                cache.projected_keys = projected
            for t in range(T):
                ctx, _ = self.attention(top[:, None], memory, src_mask, projected_keys=projected)  # s_{t-1} scores h_i
                step, state = self.decoder.rnn(torch.cat((y[:, t : t + 1], ctx), -1), state)
                top = step[:, 0]
                outs.append(step)
                contexts.append(ctx)
            s, c = torch.cat(outs, 1), torch.cat(contexts, 1)
        else:
            s, state = self.decoder.rnn(y, state)  # (B, T, Hd)
            c, _ = self.attention(s, memory, src_mask)  # s_t scores h_i -> (B, T, Hm)
        s = tap(self.hook_states, s)
        if cache is not None:
            cache.state, cache.last_output, cache.length = state, s[:, -1], cache.length + T
        return tap(self.hook_decoder_out, torch.tanh(self.combine(torch.cat((self.dropout(s), c), -1))))  # (B, T, D)

    def _top(self, state: Any) -> Tensor:
        h = state[0] if isinstance(state, tuple) else state
        return h[-1]  # (B, Hd): the top layer

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        return self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask, tgt_mask)
