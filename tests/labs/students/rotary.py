"""A student's rotary embedding, written from the stub's docstring alone."""

import torch


def rotate(x, positions, *, base=10000.0):
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(0, 2 * half, 2).float() / (2 * half))
    angles = positions.float()[:, None, :, None] * inv_freq  # (B, 1, T, Dh/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
