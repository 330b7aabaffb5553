"""The logit lens (nostalgebraist 2020): read each layer's residual stream through the model's
final norm and output head, as if the model stopped there.

Notation: L layers of the stack with the vocabulary head, B batch, T tokens, V vocabulary.

    logits_l = head(final_norm(h_l))      h_l = the residual stream after layer l (l = 1..L)

The last row is the model's own output: final_norm(h_L) is what the head reads. The stack read
is the one whose head predicts: the decoder of a decoder-only model or of an encoder-decoder
(the target side, attending to the source), an encoder with a masked-LM head.

    lens = logit_lens(model, ids)                 # (L, B, T, V)
    top = lens.topk(5, dim=-1).indices            # each layer's five best guesses per position
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.inspect.hooks import run_with_cache


def _head_stack(model: nn.Module) -> tuple[str, int, nn.Module]:
    """(module prefix, layers, stack) of the stack whose vocabulary head predicts."""
    from attnlab.models.families import family
    from attnlab.models.heads import VocabularyHead

    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model must be an attnlab model (with .config), got {type(model).__name__}")
    own = family(config)
    stacks = own.stacks(config)
    if not stacks:
        raise ValueError(f"{own.description} has no stack of Transformer layers to read through its head")
    prefix, n = stacks[-1]
    stack = model.get_submodule(prefix.rstrip(".")) if prefix else model
    if not isinstance(getattr(stack, "head", None), VocabularyHead):
        raise ValueError(f"{own.description} has no vocabulary head (masked-LM or next-token) to read the "
                         "residual stream through; the logit lens needs one")
    return prefix, n, stack


def residual_stream(model: nn.Module, *inputs: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
    """The residual stream after each layer of the predicting stack, (L, B, T, D), and the model's
    output, from one forward pass without gradients (eval mode; modes restored after)."""
    from attnlab.inspect.attribution import _eval

    prefix, n, stack = _head_stack(model)
    with _eval(model), torch.no_grad():
        output, cache = run_with_cache(model, *inputs, names=f"{prefix}layers.*.hook_resid_post", **kwargs)
    if len(cache) != n:
        raise ValueError(f"{len(cache)} of the {n} layers of {prefix or 'the model'} ran: is it the stack these inputs feed?")
    return cache.stack("hook_resid_post", prefix=prefix), output


def logit_lens(model: nn.Module, *inputs: Tensor, **kwargs) -> Tensor:
    """Each layer's residual stream read through the final norm and the head: (L, B, T, V) float.

    Args:
        model: a decoder, an encoder with a masked-LM head, or an encoder-decoder (its decoder).
        inputs, kwargs: what `model(*inputs, **kwargs)` takes.

    Raises:
        ValueError: a model without Transformer layers or a vocabulary head.
    """
    _, _, stack = _head_stack(model)
    hidden, _ = residual_stream(model, *inputs, **kwargs)
    with torch.no_grad():
        normed = stack.final_norm(hidden) if stack.final_norm is not None else hidden
        return stack.head(normed).float()


def lens_top_tokens(lens: Tensor, k: int = 1) -> tuple[Tensor, Tensor]:
    """The k best tokens per layer and position with their probabilities: ids and probs (L, B, T, k).

    Raises:
        ValueError: k outside [1, V].
    """
    if not isinstance(k, int) or not 1 <= k <= lens.shape[-1]:
        raise ValueError(f"k must be an integer in [1, {lens.shape[-1]}], got {k!r}")
    probs, ids = lens.softmax(-1).topk(k, dim=-1)
    return ids, probs
