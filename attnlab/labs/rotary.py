"""Lab `rotary`: rotary position embedding (Su et al. 2021) as a position scheme.

The student writes `rotate(x, positions, *, base) -> x rotated`; the checks hold it to
`attnlab.nn.positions.RotaryEmbedding` and to the property that makes it a relative scheme:
q_s . k_t depends on s - t only. A passing piece is registered as the position scheme
`lab-rotary` (`model.position.scheme: lab-rotary`), in training and in cached decoding.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from attnlab.labs.base import Check, CheckFailed, Lab, close, need
from attnlab.nn.positions import POSITION_SCHEMES, PositionScheme, RotaryEmbedding

SCHEME_NAME = "lab-rotary"

STUB = '''"""Lab rotary: rotary position embedding (Su et al. 2021, https://arxiv.org/abs/2104.09864).

Check it with `attnlab lab check rotary`; once it passes, `attnlab --lab DIR train ...` can use it
as the position scheme `lab-rotary` (model.position.scheme: lab-rotary).
"""

import torch


def rotate(x, positions, *, base=10000.0):
    """Rotate each feature pair of x by an angle proportional to its position.

    Args:
        x: queries or keys (B, H, T, Dh), Dh even.
        positions: long tensor (B, T) or (1, T): the position of each of the T tokens (they may
            differ per row, and need not start at 0: a decoding step passes one position).
        base: sets the frequencies: pair i turns by angle  positions * base ** (-2 i / Dh).

    Returns:
        x rotated, same shape and dtype. The pairs are (i, i + Dh/2) for i < Dh/2 (the first
        half of the features with the second half, as GPT-NeoX and Llama lay them out):
            out[..., i]          = x[..., i] cos(a_i) - x[..., i + Dh/2] sin(a_i)
            out[..., i + Dh/2]   = x[..., i + Dh/2] cos(a_i) + x[..., i] sin(a_i)
        so that q rotated at s dotted with k rotated at t depends on s - t only.

    Hints:
        - inv_freq = base ** (-torch.arange(0, Dh, 2).float() / Dh)   -> (Dh/2,)
        - angles = positions.float()[:, None, :, None] * inv_freq     -> (B or 1, 1, T, Dh/2)
        - split x into halves x1, x2 = x[..., :Dh//2], x[..., Dh//2:]
    """
    raise NotImplementedError("write rotate(): see the docstring")
'''

SOLUTION = '''"""The reference solution of lab rotary: attnlab's RotaryEmbedding."""

from attnlab.nn.positions import RotaryEmbedding


def rotate(x, positions, *, base=10000.0):
    return RotaryEmbedding(x.shape[-1], base=base).rotate(x, positions)
'''


def _x(B=2, H=2, T=6, Dh=8, seed=0) -> Tensor:
    return torch.randn(B, H, T, Dh, generator=torch.Generator().manual_seed(seed))


def _rotate(module: ModuleType, x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    out = need(module, "rotate")(x, positions, base=base)
    if not isinstance(out, Tensor) or out.shape != x.shape:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise CheckFailed(f"expected a tensor of x's shape {tuple(x.shape)}, got {shape}")
    return out


def check_shape_and_dtype(module):
    x = _x()
    out = _rotate(module, x, torch.arange(6)[None])
    if out.dtype != x.dtype:
        raise CheckFailed(f"expected dtype {x.dtype} (that of x), got {out.dtype}")


def check_position_zero(module):
    x = _x(seed=1)
    close(_rotate(module, x, torch.zeros(1, 6, dtype=torch.long)), x, "at position 0 (angle 0) x is unchanged")


def check_equals_reference(module):
    x = _x(seed=2, Dh=16)
    pos = torch.arange(3, 9)[None]
    close(_rotate(module, x, pos), RotaryEmbedding(16).rotate(x, pos), "positions 3..8, Dh=16")


def check_base(module):
    x = _x(seed=3)
    pos = torch.arange(6)[None]
    close(_rotate(module, x, pos, base=100.0), RotaryEmbedding(8, base=100.0).rotate(x, pos), "base=100")


def check_row_positions(module):
    x = _x(seed=4)
    pos = torch.stack([torch.arange(6), torch.arange(6) + 7])  # (B, T): each row its own positions
    close(_rotate(module, x, pos), RotaryEmbedding(8).rotate(x, pos), "(B, T) positions, one row per sequence")


def check_norm(module):
    x = _x(seed=5)
    out = _rotate(module, x, torch.arange(6)[None] * 5)
    close(out.norm(dim=-1), x.norm(dim=-1), "the length of each vector (a rotation keeps it)")


def check_relative(module):
    q, k = _x(seed=6), _x(seed=7)
    s, t = torch.arange(6)[None], torch.arange(6)[None].flip(-1)
    scores = _rotate(module, q, s) @ _rotate(module, k, t).transpose(-2, -1)
    shifted = _rotate(module, q, s + 11) @ _rotate(module, k, t + 11).transpose(-2, -1)
    close(shifted, scores, "q_s . k_t when every position moves by 11 (it must depend on s - t only)", atol=1e-4)


CHECKS = (
    Check("shape and dtype", check_shape_and_dtype),
    Check("position 0 is the identity", check_position_zero),
    Check("equals attnlab's RotaryEmbedding", check_equals_reference),
    Check("base", check_base),
    Check("positions per row", check_row_positions),
    Check("rotation keeps lengths", check_norm),
    Check("scores depend on i - j only", check_relative),
)


class LabRotary(RotaryEmbedding):
    """RotaryEmbedding whose rotation is the student's `rotate` (on the first rotary_dim features).

    A decoding step asks for `cos_sin` once per step and `apply_rotation` per layer; here the
    "angles" handed between the two are the position ids themselves."""

    fn = None  # set by `plug`

    def __init__(self, head_dim: int, rotary_dim: int | None = None, base: float = 10000.0):
        super().__init__(head_dim, rotary_dim, base)
        self.base = base

    def cos_sin(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, None]:
        return position_ids, None

    def apply_rotation(self, x: Tensor, positions: Tensor, _unused: None) -> Tensor:
        r = self.rotary_dim
        rotated = type(self).fn(x[..., :r], positions, base=self.base)
        return torch.cat((rotated, x[..., r:]), dim=-1) if r < x.shape[-1] else rotated


def plug(module: ModuleType) -> list[str]:
    """Register the student's rotation as the position scheme `lab-rotary`."""
    LabRotary.fn = staticmethod(module.rotate)
    POSITION_SCHEMES[SCHEME_NAME] = PositionScheme(
        "rotary", lambda p, s: LabRotary(s.head_dim, p.rotary_dim, p.rotary_base))
    return [f"position.scheme={SCHEME_NAME}"]


def unplug() -> None:
    POSITION_SCHEMES.pop(SCHEME_NAME, None)


LAB = Lab(name="rotary", filename="rotary.py", writes="rotate(x, positions, *, base): a position scheme",
          lecture="[T] The Transformer: position", stub=STUB, solution=SOLUTION, checks=CHECKS,
          plug=plug, unplug=unplug)
