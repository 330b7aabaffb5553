"""Token embeddings plus whatever the config adds before the first layer.

    h_0 = Dropout(Norm(E[x] * (sqrt(D) if scaled) + P[t] + S[segment]))
    h_0 = Dropout(Norm([E[x] * (..); P[t]] + S[segment]))      # positions concatenated
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Embeddings(nn.Module):
    """Token embedding with optional scale, absolute positions, segments and norm.

    Args:
        token: the (V, D) embedding; pass the same module to share it (encoder and decoder).
        positions: an absolute position module mapping ids (B, T) -> (B, T, D), or None.
        scale: multiply token vectors by sqrt(D) (Vaswani et al. 2017, section 3.4).
        type_vocab_size: segment vocabulary (BERT's token_type_ids); 0 = none.
        norm: a norm applied to the sum (BERT), or None.
        concat_dim: 0 adds the positions; > 0 joins that many position features after the token
            features ([x; p], `position.combine='concat'`): the token table is then narrower than
            the model.
    """

    def __init__(self, token: nn.Embedding, *, positions: nn.Module | None = None, scale: bool = False,
                 type_vocab_size: int = 0, norm: nn.Module | None = None, dropout: float = 0.0,
                 concat_dim: int = 0):
        super().__init__()
        if concat_dim and positions is None:
            raise ValueError("concat_dim > 0 joins positions to the token vectors: give a position module")
        self.token = token
        self.positions = positions
        self.concat = concat_dim > 0
        self.scale = math.sqrt(token.embedding_dim) if scale else 1.0
        width = token.embedding_dim + concat_dim
        self.segment = nn.Embedding(type_vocab_size, width) if type_vocab_size else None
        self.norm = norm
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: Tensor, position_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        h = self.token(input_ids)  # (B, T, D)
        if self.scale != 1.0:
            h = h * self.scale
        if self.concat:
            p = self.positions(position_ids).to(h.dtype)
            h = torch.cat([h, p.expand(*h.shape[:-1], p.shape[-1])], -1)
        elif self.positions is not None:
            h = h + self.positions(position_ids).to(h.dtype)
        if self.segment is not None:
            segments = token_type_ids if token_type_ids is not None else input_ids.new_zeros(input_ids.shape)
            h = h + self.segment(segments)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but the model has no segment embeddings (type_vocab_size=0)")
        if self.norm is not None:
            h = self.norm(h)
        return self.dropout(h) if self.training else h  # no call at inference (a decoding step)

    def step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """`forward` for one new token per row while decoding: tokens (N,), positions (N, 1) -> (N, D)
        (segment 0, as `forward` without token_type_ids)."""
        return self(tokens[:, None], positions)[:, 0]
