"""A student's attention, written from the stub's docstring alone."""

import torch
import torch.nn.functional as F


def attention(q, k, v, *, scale, mask=None, bias=None, dropout_p=0.0):
    scores = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = torch.where(mask.any(-1, keepdim=True), weights, torch.zeros_like(weights))
    return F.dropout(weights, dropout_p) @ v, weights
