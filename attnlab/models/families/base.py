"""`Family`: what differs between the model families, as data and functions, and the loss
pieces they share.

A family's file (decoder.py, encoder.py, ...) makes one `Family`; the registry
(`attnlab.models.families`) maps the config's `arch` to it. Code above the models — the training
loss, the pipeline stages, decoding, inspection, the Hugging Face converters — asks the family
instead of comparing arch strings.

Notation: B batch, T tokens (Tt an encoder-decoder's target), D model width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import Tensor, nn

from attnlab.config.families import FamilyTraits
from attnlab.models.heads import VocabularyHead
from attnlab.nn.losses import IGNORE, cross_entropy, linear_cross_entropy

Batch = dict[str, Tensor]


def _no_alignment(name: str) -> bool:
    return False


def _no_stacks(config: Any) -> tuple[tuple[str, int], ...]:
    return ()


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per family
class Family:
    """One model family.

    name: the `arch` a config writes (`vision` for a ViT, whose config has none).
    traits: the config-level facts (`attnlab.config.families.FamilyTraits`).
    description: how an error message names a model of it (`a decoder-only model`).
    build: (config) -> a freshly initialised model (`build_model` calls it and sets `model.config`).
    batch_loss: (model, batch, label_smoothing) -> the batch's mean token cross-entropy
        (attnlab.training.tasks.batch_loss.batch_loss: a pretraining objective's batch).
    features: (model, batch) -> (the stack whose head predicts, its last hidden states (B, T, D));
        None for a family without such a head (the recurrent encoder-decoder).
    eval_sums: (model, batch) -> extra evaluation sums (masked-LM accuracy, NSP, SBO); None:
        the loss and token count only.
    first_input: the batch's ids the model reads first (`input_ids`; `src_ids` beside a target).
    stage_inputs: the keyword inputs of each pipeline stage besides the first stage's ids and the
        targets, with the axis each spans (`input`: the first ids' width, `target`: the
        targets', None: a number per row); None: the family cannot be cut into stages.
    unstaged: batch tensors its objectives may make that the stages ignore.
    padding_mask: the mask of the first input that must hide padding added after the real
        positions (a stack attending both ways sees it); None where the first stack is causal.
    stacks: (config) -> its Transformer stacks as (module prefix, layers), in the order a
        pipeline cuts them; () for a family that is not made of Transformer layers.
    decoding: how generation starts: `prompt` (continues input_ids), `source` (a target side
        from a start token, conditioned on a source), or None (it does not generate).
    hf_model_types: the Hugging Face `model_type`s whose weights convert to and from it
        (attnlab.interop holds the converters).
    is_alignment: (attention module name) -> whether its captured attention map aligns the
        target with the source (drawn as an alignment, not a grid of heads).
    config_type: for a family without `arch`, the config class that names it.
    """

    name: str
    traits: FamilyTraits
    description: str
    build: Callable[[Any], nn.Module]
    batch_loss: Callable[..., Tensor]
    features: Callable[[nn.Module, Batch], tuple[nn.Module, Tensor]] | None = None
    eval_sums: Callable[[nn.Module, Batch], dict[str, float]] | None = None
    first_input: str = "input_ids"
    stage_inputs: dict[str, str | None] | None = None
    unstaged: frozenset[str] = field(default_factory=frozenset)
    padding_mask: str | None = None
    stacks: Callable[[Any], tuple[tuple[str, int], ...]] = _no_stacks
    decoding: str | None = None
    hf_model_types: tuple[str, ...] = ()
    is_alignment: Callable[[str], bool] = _no_alignment
    config_type: type | None = None

    def reads(self, name: str) -> bool:
        """Whether its forward pass reads the batch tensor `name` (`input_ids`, `token_type_ids`, ...)."""
        return name == self.first_input or name in (self.stage_inputs or {})

    def decoder_layers(self, config: Any) -> int:
        """Layers that keep keys and values while decoding: those of the last Transformer stack."""
        stacks = self.stacks(config)
        return stacks[-1][1] if stacks else 0

    def head_prefix(self, config: Any) -> str:
        """The module prefix of the head that predicts (`head.`, `decoder.head.`)."""
        stacks = self.stacks(config)
        return (stacks[-1][0] if stacks else "") + "head."


def head_loss(stack: nn.Module, hidden: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of `stack`'s head on `hidden` (B, T, D) against `labels` (B, T):
    a vocabulary head's transform on the rows that take a loss, its output layer fused with the
    loss (`losses.linear_cross_entropy`, no (B, T, V) logits); any other head's output whole."""
    head = stack.head
    keep = labels != IGNORE
    if isinstance(head, VocabularyHead):
        rows = hidden[keep] if not bool(keep.all()) else hidden.reshape(-1, hidden.shape[-1])
        return linear_cross_entropy(head.transform(rows), head.output_weight, labels[keep], head.output_bias,
                                    label_smoothing=label_smoothing)
    return cross_entropy(stack.apply_head(hidden, None), labels, label_smoothing=label_smoothing)


def require(batch: Batch, key: str, message: str) -> None:
    """Raise ValueError(message) unless the batch holds `key`."""
    if key not in batch:
        raise ValueError(message)


__all__ = ["Batch", "Family", "head_loss", "require"]
