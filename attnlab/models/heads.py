"""Task heads on top of the last hidden state (B, T, D)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.activations import activation_fn
from attnlab.nn.linear import project_few_rows


def pool(hidden: Tensor, attention_mask: Tensor | None, how: str) -> Tensor:
    """(B, T, D) -> (B, D): the `first` token ([CLS]), the `last` real token (right or left
    padding alike), or the `mean` over real tokens."""
    if how == "first":
        return hidden[:, 0]
    if attention_mask is None:
        return hidden[:, -1] if how == "last" else hidden.mean(1)
    mask = attention_mask.bool()
    if how == "last":
        T = mask.shape[1]
        # index of the right-most real token: works whichever side the padding is on
        last = (torch.arange(T, device=mask.device) * mask).argmax(-1)  # (B,)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if how == "mean":
        m = mask[..., None].to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)
    raise ValueError(f"pooling={how!r} is not one of first, last, mean")


class Pooler(nn.Module):
    """BERT's pooler: tanh(W h_[CLS] + b)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, pooled: Tensor) -> Tensor:
        return torch.tanh(self.dense(pooled))


class VocabularyHead(nn.Module):
    """A head whose last layer is a (V, D) output matrix over the vocabulary (`output_layer`):
    `output_weight`, `output_bias` and `transform` (the hidden states as they meet that matrix) are
    what a fused loss needs (`training.steps`), so it never forms the (B, T, V) logits."""

    def output_layer(self) -> nn.Linear:
        raise NotImplementedError

    @property
    def output_weight(self) -> Tensor:
        """The (V, D) output matrix (the token embedding when tied)."""
        return self.output_layer().weight

    @property
    def output_bias(self) -> Tensor | None:
        return self.output_layer().bias

    def transform(self, hidden: Tensor) -> Tensor:
        raise NotImplementedError


class LMHead(VocabularyHead):
    """Next-token logits (s h) W_e^T (+ b); the weight is tied to the token embedding when given.

    scale: s, 1 by default; T5 with tied embeddings uses d_model^-0.5 (Raffel et al. 2020,
    https://arxiv.org/abs/1910.10683), so the logits do not grow with the embedding norm.
    """

    def __init__(self, d_model: int, vocab_size: int, *, bias: bool = False, tied: nn.Embedding | None = None,
                 scale: float = 1.0):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=bias)
        self.scale = scale
        if tied is not None:
            self.proj.weight = tied.weight

    def output_layer(self) -> nn.Linear:
        return self.proj

    def transform(self, hidden: Tensor) -> Tensor:
        """The hidden states as they meet the output matrix: s h."""
        return hidden * self.scale if self.scale != 1.0 else hidden

    def forward(self, hidden: Tensor) -> Tensor:
        return self.proj(self.transform(hidden))  # (B, T, V)

    def step(self, hidden: Tensor) -> Tensor:
        """`forward` for the last hidden state of each row while decoding: (N, D) -> (N, V),
        through the inference layout of the output matrix (`attnlab.nn.linear`)."""
        return project_few_rows(self.proj, self.transform(hidden))


class MLMHead(VocabularyHead):
    """BERT's masked-LM head: dense + activation + norm, then the tied decoder with a bias."""

    def __init__(self, d_model: int, vocab_size: int, *, activation: str = "gelu", norm: nn.Module,
                 tied: nn.Embedding | None = None):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = activation_fn(activation)
        self.norm = norm
        self.decoder = nn.Linear(d_model, vocab_size, bias=True)
        if tied is not None:
            self.decoder.weight = tied.weight

    def output_layer(self) -> nn.Linear:
        return self.decoder

    def transform(self, hidden: Tensor) -> Tensor:
        """BERT's prediction transform: norm(act(dense(h))), (..., D) -> (..., D)."""
        return self.norm(self.act(self.dense(hidden)))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.transform(hidden))  # (B, T, V)


class NSPHead(nn.Module):
    """BERT's next-sentence classifier, beside the MLM head: a linear layer on the pooled [CLS]
    vector (B, D) -> (B, 2) logits; label 0 = B follows A (IsNext), 1 = B is random (NotNext).
    Devlin et al. 2019, https://arxiv.org/abs/1810.04805 (3.1, task 2)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, 2)

    def forward(self, pooled: Tensor) -> Tensor:
        return self.proj(pooled)  # (B, 2)


class DropoutLinear(nn.Module):
    """Dropout + linear over the last dimension: (..., D) -> (..., num_labels)."""

    def __init__(self, d_model: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(d_model, num_labels)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.dropout(x))


class ClassificationHead(DropoutLinear):
    """Dropout + linear on a pooled vector (B, D) -> (B, num_labels); the stack pools before it."""


class RegressionHead(ClassificationHead):
    """Dropout + linear on a pooled vector (B, D) -> (B,): one real number per sequence,
    trained with mean squared error (BERT's STS-B recipe, Devlin et al. 2019,
    https://arxiv.org/abs/1810.04805). A ClassificationHead subclass, so the stack pools
    before it exactly as for classification."""

    def __init__(self, d_model: int, dropout: float = 0.1):
        super().__init__(d_model, 1, dropout)

    def forward(self, pooled: Tensor) -> Tensor:
        return super().forward(pooled).squeeze(-1)  # (B,)


class TokenClassificationHead(DropoutLinear):
    """Dropout + linear on every position (B, T, D) -> (B, T, num_labels) (BERT's NER head); not a
    ClassificationHead, so the stack does not pool before it."""


class SpanBoundaryHead(VocabularyHead):
    """SpanBERT's span-boundary objective (SBO; Joshi et al. 2020, https://arxiv.org/abs/1907.10529,
    3.2), beside the MLM head: each token x_i of a masked span x_s..x_e is predicted from the
    encodings of the two tokens just outside the span and the embedding of its place in it:

        h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]        (3 D)
        h1 = LayerNorm(GELU(W1 h0 + b1))           (D)
        y  = LayerNorm(GELU(W2 h1 + b2))           (D)
        logits = y W_out^T + b                     W_out: the MLM head's output matrix (the token
                                                   embedding when tied), b: the head's own bias

    Position p_1 is the span's first token; tokens past `max_span` take the last embedding.

    Args:
        d_model: D.
        vocab_size: V.
        max_span: rows of the position table (tokens into a span).
        output: the MLM head's output layer, whose weight is shared (None: a matrix of its own).
        norm_eps: the LayerNorms' epsilon.
    """

    def __init__(self, d_model: int, vocab_size: int, *, max_span: int, output: nn.Linear | None = None,
                 norm_eps: float = 1e-5):
        super().__init__()
        self.position = nn.Embedding(max_span, d_model)
        self.dense1 = nn.Linear(3 * d_model, d_model)
        self.norm1 = nn.LayerNorm(d_model, eps=norm_eps)
        self.dense2 = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model, eps=norm_eps)
        self.decoder = nn.Linear(d_model, vocab_size, bias=True)
        if output is not None:
            self.decoder.weight = output.weight

    def output_layer(self) -> nn.Linear:
        return self.decoder

    def transform(self, hidden: Tensor, span_left: Tensor | None = None, span_right: Tensor | None = None) -> Tensor:
        """y (N, D) for the N targets: the positions with span_left >= 0, in row-major order (the
        order of `hidden[span_left >= 0]`).

        Args:
            hidden: (B, T, D) the encoder's last hidden states.
            span_left, span_right: (B, T) the positions s - 1 and e + 1 of each target's span, -1
                where a position is no target (`attnlab.data.objectives.span_boundaries`).

        Raises:
            ValueError: missing or mis-shaped boundaries.
        """
        if span_left is None or span_right is None or span_left.shape != hidden.shape[:2] \
                or span_right.shape != hidden.shape[:2]:
            raise ValueError(f"span_left and span_right must be (B, T) = {tuple(hidden.shape[:2])} position tensors")
        rows, cols = (span_left >= 0).nonzero(as_tuple=True)  # (N,) each
        left, right = span_left[rows, cols], span_right[rows, cols]
        place = (cols - left - 1).clamp(max=self.position.num_embeddings - 1)  # i - s: p_{i-s+1} is row i - s
        h = torch.cat([hidden[rows, left], hidden[rows, right], self.position(place).to(hidden.dtype)], -1)
        h = self.norm1(F.gelu(self.dense1(h)))
        return self.norm2(F.gelu(self.dense2(h)))  # (N, D)

    def forward(self, hidden: Tensor, span_left: Tensor, span_right: Tensor) -> Tensor:
        """(N, V) logits of the N targets (see `transform`)."""
        return self.decoder(self.transform(hidden, span_left, span_right))


def span_boundary_head(config, mlm_head: MLMHead) -> SpanBoundaryHead:
    """The SBO head of a ModelConfig with `sbo_head=True` (d_model, vocab_size, sbo_max_span,
    norm_eps), sharing `mlm_head`'s output matrix."""
    return SpanBoundaryHead(config.d_model, config.vocab_size, max_span=config.sbo_max_span,
                            output=mlm_head.output_layer(), norm_eps=config.norm_eps)
