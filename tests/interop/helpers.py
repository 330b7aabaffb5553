"""Shared by the Hugging Face parity tests: random weights, padded batches, round trips."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.interop import from_hf, to_hf
from attnlab.interop.common import alias_groups

TOL = 1e-4  # max abs difference allowed between attnlab and transformers, fp32, eval mode


def randomize(model: nn.Module, seed: int = 0, skip: tuple[str, ...] = ()) -> nn.Module:
    """Overwrite every parameter (and BART/Marian's final_logits_bias) with random values, so
    that swapping two tensors of one shape (two norms, q and k) changes the outputs: norm
    gains near 1, everything else N(0, 0.1^2). Tied parameters stay tied."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(s in name for s in skip):
                continue
            noise = torch.randn(p.shape, generator=g) * 0.1
            is_gain = p.dim() == 1 and ("norm" in name.lower()) and name.endswith("weight")
            p.copy_(1 + noise if is_gain else noise)
        for name, b in model.named_buffers():
            if name.endswith("final_logits_bias"):
                b.copy_(torch.randn(b.shape, generator=g))
    return model.eval()


def right_padded(lengths: list[int], vocab: int, low: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, max(lengths)) with random tokens in [low, vocab), padded on the right with
    token 1 (any id works: padding is masked), and the (B, T) mask, 1 on real tokens."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(low, vocab, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 1), mask


def real_max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """max |a - b| over real positions (mask (B, T) == 1) of (B, T, ...) tensors."""
    diff = (a - b).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    return float(diff.max())


def assert_round_trip(ours: nn.Module) -> None:
    """attnlab -> transformers -> attnlab gives identical tensors and the same ties."""
    back = from_hf(to_hf(ours))
    assert back.config == ours.config
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert alias_groups(ours) == alias_groups(back)


@pytest.fixture(scope="module")
def single_thread():
    """Run a module's tests on one intra-op thread: on a shared, loaded machine, tiny models
    are ~100x slower with two spinning OpenMP threads than with one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_gpt2_folder(folder):
    """A random 2-layer GPT-2 (vocabulary 40, width 24) saved with save_pretrained into `folder`;
    returns the transformers model."""
    import transformers

    cfg = transformers.GPT2Config(vocab_size=40, n_embd=24, n_head=3, n_layer=2, n_positions=16, bos_token_id=0,
                                  eos_token_id=0)
    hf = randomize(transformers.GPT2LMHeadModel(cfg))
    hf.save_pretrained(folder)
    return hf
