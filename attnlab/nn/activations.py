"""Element-wise activations of the feed-forward, by config name (`ModelConfig.activation`).

A gated name (a GLU, Shazeer 2020, https://arxiv.org/abs/2002.05202) makes the feed-forward
W2 (act(W1 x) * W3 x) with `act` its gate's function; geglu_tanh is T5 v1.1's "gated-gelu".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Activation:
    fn: Callable[[Tensor], Tensor]
    gated: bool = False  # act(W1 x) * W3 x


_gelu_tanh = partial(F.gelu, approximate="tanh")  # GPT-2's "gelu_new"

ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(F.relu),
    "gelu": Activation(F.gelu),
    "gelu_tanh": Activation(_gelu_tanh),
    "silu": Activation(F.silu),
    "reglu": Activation(F.relu, gated=True),
    "geglu": Activation(F.gelu, gated=True),
    "geglu_tanh": Activation(_gelu_tanh, gated=True),
    "swiglu": Activation(F.silu, gated=True),
}
GATED = frozenset(name for name, a in ACTIVATIONS.items() if a.gated)


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """The element-wise function called `name` (gated names give their gate's function).

    Raises:
        ValueError: an unknown name, listing the registered ones.
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name].fn
