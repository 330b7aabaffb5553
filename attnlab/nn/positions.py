"""Position schemes: where a Transformer gets word order from.

Notation: B batch, T length, D d_model, H heads, Dh head_dim. Position ids are long
tensors (B or 1, T); they count real tokens only (see `masks.positions_from_mask`), so
padding on either side leaves every scheme's view of the real tokens unchanged.

Three places a scheme can act:
- added to the token embeddings (absolute): `SinusoidalPositions`, `LearnedPositions`,
  `BinaryPositions` -> (B, T, D);
- inside each attention layer, on queries and keys: `RotaryEmbedding` (rotates q and k),
  `RelativePositions` (Shaw et al. 2018: a term on the scores and one on the values);
- a bias on the scores, computed once per stack and shared by its layers: `ALiBi`,
  `T5RelativeBias` -> (B or 1, H, Tq, Tk).

`POSITION_SCHEMES` maps the config name (`position.scheme`) to a `PositionScheme`: where it acts,
how it is built, and what it asks of an attention kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor, nn

# ---- absolute: added to the embeddings --------------------------------------------------------


class SinusoidalPositions(nn.Module):
    """PE(t, 2i) = sin(t / 10000^(2i/D)), PE(t, 2i+1) = cos(...) (Vaswani et al. 2017).

    Computed from the ids, so any length works. PE(t + k) is a fixed linear map (a rotation
    per frequency) of PE(t): relative offsets are easy for a linear layer to read.

    layout: `interleaved` puts sin and cos of frequency i in features 2i, 2i+1 (the paper);
    `halves` puts every sin first, then every cos ([sin | cos], Marian / fairseq checkpoints).
    """

    def __init__(self, d_model: int, base: float = 10000.0, layout: str = "interleaved"):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        if layout not in ("interleaved", "halves"):
            raise ValueError(f"layout={layout!r} is not one of interleaved, halves")
        self.layout = layout
        inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        angles = position_ids.float()[..., None] * self.inv_freq  # (B, T, D/2)
        if self.layout == "halves":
            return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (B, T, D) [sin | cos]
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (B, T, D) interleaved


class LearnedPositions(nn.Module):
    """One trained vector per position up to max_len (BERT, GPT).

    offset: rows before position 0 (BART keeps 2 unused rows: position t reads row t + 2);
    the table has max_len + offset rows.
    """

    def __init__(self, max_len: int, d_model: int, offset: int = 0):
        super().__init__()
        self.max_len = max_len
        self.offset = offset
        self.weight = nn.Parameter(torch.empty(max_len + offset, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, position_ids: Tensor) -> Tensor:
        if position_ids.numel() and int(position_ids.max()) >= self.max_len:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond the learned table (position.max_len={self.max_len})"
            )
        return self.weight[position_ids + self.offset if self.offset else position_ids]


class BinaryPositions(nn.Module):
    """Bit i of the position index as -1/+1 in feature i, for i < ceil(log2(max_len)); the
    remaining features are 0. The simplest fixed code that is unique per position."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.num_bits = max(1, math.ceil(math.log2(max_len)))
        if self.num_bits > d_model:
            raise ValueError(f"binary positions need d_model >= {self.num_bits} bits for max_len={max_len}")
        self.d_model = d_model
        self.max_len = max_len

    def forward(self, position_ids: Tensor) -> Tensor:
        if position_ids.numel() and int(position_ids.max()) >= self.max_len:
            raise ValueError(f"position {int(position_ids.max())} needs more bits than position.max_len={self.max_len}")
        bits = (position_ids[..., None] >> torch.arange(self.num_bits, device=position_ids.device)) & 1
        code = bits.float() * 2 - 1  # (B, T, num_bits)
        return nn.functional.pad(code, (0, self.d_model - self.num_bits))


# ---- inside attention, per layer ---------------------------------------------------------------


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021, https://arxiv.org/abs/2104.09864).

    Feature pairs (i, i + R/2) of the first R = rotary_dim features of q and k are rotated by
    angle t * base^(-2i/R); q_s . k_t then depends on s - t only.
    """

    def __init__(self, head_dim: int, rotary_dim: int | None = None, base: float = 10000.0,
                 scaling: dict[str, Any] | None = None):
        super().__init__()
        self.rotary_dim = rotary_dim or head_dim
        inv_freq = base ** (-torch.arange(0, self.rotary_dim, 2, dtype=torch.float32) / self.rotary_dim)
        if scaling is not None:
            inv_freq = scaled_frequencies(inv_freq, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotate(self, x: Tensor, position_ids: Tensor) -> Tensor:
        """x (B, H, T, Dh), position_ids (B or 1, T) -> x rotated."""
        cos, sin = self.cos_sin(position_ids, x.dtype)
        return self.apply_rotation(x, cos, sin)

    def cos_sin(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The (B or 1, 1, T, R) cosines and sines of the angles at position_ids (B or 1, T);
        computed once, they rotate any number of q/k tensors at those positions (decoding)."""
        angles = position_ids.float()[:, None, :, None] * self.inv_freq  # (B, 1, T, R/2)
        cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(dtype)
        sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(dtype)
        return cos, sin

    def apply_rotation(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x (B, H, T, Dh) rotated by the angles of `cos_sin`."""
        r = self.rotary_dim
        x_rot, x_pass = x[..., :r], x[..., r:]
        half1, half2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
        rotated = x_rot * cos + torch.cat((-half2, half1), dim=-1) * sin
        return torch.cat((rotated, x_pass), dim=-1)


#: rotary frequency scalings (`position.rotary_scaling`): type -> its options and their defaults
ROTARY_SCALINGS: dict[str, dict[str, float]] = {
    "linear": {"factor": 1.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192.0},
}


def rotary_scaling_problem(spec: dict[str, Any]) -> str | None:
    """What is wrong with a `position.rotary_scaling` mapping, or None."""
    kind = spec.get("type")
    if kind not in ROTARY_SCALINGS:
        return f"type must be one of {', '.join(ROTARY_SCALINGS)}, got {kind!r}"
    allowed = ROTARY_SCALINGS[kind]
    for key, value in spec.items():
        if key == "type":
            continue
        if key not in allowed:
            return f"unknown option {key!r} of {kind!r}; allowed: {', '.join(allowed)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            return f"{key} must be a number > 0, got {value!r}"
    options = {**allowed, **spec}
    if kind == "llama3" and options["high_freq_factor"] <= options["low_freq_factor"]:
        return "high_freq_factor must be above low_freq_factor"
    return None


def scaled_frequencies(inv_freq: Tensor, spec: dict[str, Any]) -> Tensor:
    """Rotary frequencies stretched for a longer context.

    `linear` (position interpolation, Chen et al. 2023, https://arxiv.org/abs/2306.15595): every
    frequency / factor, i.e. position t turns as t / factor did. `llama3` (Meta's Llama 3.1):
    wavelengths 2 pi / f longer than original / low_freq_factor are divided by factor, those
    shorter than original / high_freq_factor are kept, and those between blend the two linearly
    in original / wavelength.
    """
    o = {**ROTARY_SCALINGS[spec["type"]], **spec}
    factor = float(o["factor"])
    if spec["type"] == "linear":
        return inv_freq / factor
    original = float(o["original_max_position_embeddings"])
    low, high = float(o["low_freq_factor"]), float(o["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq
    slow = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * slow / factor + smooth * slow
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, slow)


class RelativePositions(nn.Module):
    """Relative position representations (Shaw et al. 2018, https://arxiv.org/abs/1803.02155).

    e_ij = q_i . (k_j + a^K_ij) / sqrt(Dh),  z_i = sum_j alpha_ij (v_j + a^V_ij),
    with a_ij = w[clip(j - i, -k, k)] learned, shared across heads.
    Both terms are computed against the (2k + 1)-row tables, never a (T, T, Dh) tensor.
    """

    def __init__(self, head_dim: int, max_distance: int, values: bool = True):
        super().__init__()
        self.max_distance = max_distance
        self.key_table = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim))
        self.value_table = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim)) if values else None
        for p in (self.key_table, self.value_table):
            if p is not None:
                nn.init.normal_(p, std=0.02)

    def distance_index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B or 1, Tq, Tk) index into the tables: clip(k_pos - q_pos, -k, k) + k."""
        d = k_pos[:, None, :] - q_pos[:, :, None]
        return d.clamp(-self.max_distance, self.max_distance) + self.max_distance

    def score_bias(self, q: Tensor, index: Tensor, scale: float) -> Tensor:
        """q (B, H, Tq, Dh) -> (B, H, Tq, Tk): q_i . a^K_ij * scale."""
        per_distance = q @ self.key_table.t().to(q.dtype)  # (B, H, Tq, 2k+1)
        idx = index[:, None].expand(q.shape[0], q.shape[1], -1, -1)
        return per_distance.gather(-1, idx) * scale

    def value_term(self, weights: Tensor, index: Tensor) -> Tensor:
        """weights (B, H, Tq, Tk) -> (B, H, Tq, Dh): sum_j alpha_ij a^V_ij."""
        B, H, Tq, _ = weights.shape
        idx = index[:, None].expand(B, H, -1, -1)
        per_distance = weights.new_zeros(B, H, Tq, self.value_table.shape[0]).scatter_add_(-1, idx, weights)
        return per_distance @ self.value_table.to(weights.dtype)


# ---- score biases, computed once per stack ------------------------------------------------------


def alibi_slopes(num_heads: int) -> Tensor:
    """Head slopes of ALiBi: the geometric sequence 2^(-8/n), 2^(-16/n), ... for n heads; for
    n not a power of two, the first of the closest power of two and every other one of the
    next (Press et al. 2022, https://arxiv.org/abs/2108.12409)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(closest)
    if closest < num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes)


class ALiBi(nn.Module):
    """Score bias -slope_h * |i - j|: attention decays linearly with distance, per head."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = (k_pos[:, None, :] - q_pos[:, :, None]).abs().float()  # (B, Tq, Tk)
        return -self.slopes[None, :, None, None] * dist[:, None]  # (B, H, Tq, Tk)


def t5_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of a distance (key - query): exact buckets for small distances, then
    logarithmically wider ones up to max_distance; the sign gets half the buckets when
    bidirectional, and a causal stack sees only the past."""
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class T5RelativeBias(nn.Module):
    """Learned per-head scalar bias of the bucketed distance (Raffel et al. 2020), one table
    per stack shared by all its self-attention layers."""

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, num_heads))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rel = k_pos[:, None, :] - q_pos[:, :, None]  # (B, Tq, Tk)
        buckets = t5_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        return self.weight[buckets].permute(0, 3, 1, 2)  # (B, H, Tq, Tk)


# ---- the registry -----------------------------------------------------------------------------


class Sizes(NamedTuple):
    """What a scheme's module is sized by: the model's width, heads, head size, and whether the
    stack is causal (a decoder's)."""

    d_model: int
    num_heads: int
    head_dim: int
    causal: bool = False


@dataclass(frozen=True)
class PositionScheme:
    """How a position scheme plugs in.

    Attributes:
        where: `embeddings` (added to the token embeddings, one module per stack), `rotary` or
            `relative` (the MultiHeadAttention argument of that name, one module per
            self-attention layer), `bias` (scores added in every self-attention layer, one
            module per stack), or None (no positions).
        build: (position options, Sizes) -> the module; the options are the config's `position`
            section (any object with the scheme's fields).
        score_bias: adds a (query, key) bias to the scores (a kernel must support one).
        value_option: the option that switches on a term on the values, if the scheme has one.
    """

    where: str | None = None
    build: Callable[[Any, Sizes], nn.Module] | None = None
    score_bias: bool = False
    value_option: str | None = None

    def value_term(self, options: Any) -> bool:
        """Whether the scheme, with these options, adds a term on the values."""
        return self.value_option is not None and bool(getattr(options, self.value_option))


POSITION_SCHEMES: dict[str, PositionScheme] = {
    "none": PositionScheme(),
    "sinusoidal": PositionScheme("embeddings", lambda p, s: SinusoidalPositions(s.d_model, layout=p.sinusoidal_layout)),
    "learned": PositionScheme("embeddings", lambda p, s: LearnedPositions(p.max_len, s.d_model, p.learned_offset)),
    "binary": PositionScheme("embeddings", lambda p, s: BinaryPositions(s.d_model, p.max_len)),
    "relative": PositionScheme(
        "relative", lambda p, s: RelativePositions(s.head_dim, p.relative_max_distance, values=p.relative_values),
        score_bias=True, value_option="relative_values"),
    "rotary": PositionScheme("rotary", lambda p, s: RotaryEmbedding(s.head_dim, p.rotary_dim, p.rotary_base,
                                                                    getattr(p, "rotary_scaling", None))),
    "alibi": PositionScheme("bias", lambda p, s: ALiBi(s.num_heads), score_bias=True),
    "t5_bias": PositionScheme(
        "bias", lambda p, s: T5RelativeBias(s.num_heads, p.t5_num_buckets, p.t5_max_distance,
                                            bidirectional=not s.causal), score_bias=True),
}
