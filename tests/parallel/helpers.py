"""Resume a saved full checkpoint in this (single) process and train it to step 10."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.parallel.checkpoint import load_full_checkpoint, load_optimizer_state
from tests.parallel.workers import VOCAB, batch


def resume_single(path, first_seed: int, rows: int, ignore_first: bool) -> dict[str, torch.Tensor]:
    """Load `path` (saved after 5 steps), take steps 5..9 with the same batches, return the state."""
    model = load_full_checkpoint(path)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    load_optimizer_state(path, model, opt)
    for step in range(5, 10):
        b = batch("decoder", first_seed + step, rows=rows)
        if ignore_first:
            b["labels"][0, :3] = -100
        opt.zero_grad()
        logits = model(b["ids"])
        F.cross_entropy(logits.reshape(-1, VOCAB), b["labels"].reshape(-1), ignore_index=-100).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
