"""Task heads on top of the last hidden state (B, T, D)."""

from __future__ import annotations

import torch
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
