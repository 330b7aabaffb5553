"""Small random models and left-padded prompt batches shared by the decoding tests."""

import torch

from attnlab import ModelConfig, build_model

V = 50


def tiny(arch: str, scheme: str = "learned", *, vocab_size: int = V, init_std: float = 0.3, **kw) -> torch.nn.Module:
    """A 2-layer random model; init_std 0.3 (not 0.02) makes its next-token distributions
    peaked enough that decoding choices are far from ties."""
    position = {"scheme": scheme, "max_len": 64, "relative_max_distance": 4}
    cfg = ModelConfig(arch=arch, vocab_size=vocab_size, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm_placement="pre", position=position, init_std=init_std, **kw)
    return build_model(cfg).eval()


def left_padded(lengths: list[int], seed: int = 0, low: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of the given lengths, left-padded with 0, and their (B, T) mask."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, T - n:] = torch.randint(low, V, (n,), generator=g)
        mask[b, T - n:] = 1
    return ids, mask
