"""Small configs shared by the model tests."""

import torch

from attnlab import ModelConfig, build_model

SCHEMES = ["none", "sinusoidal", "learned", "binary", "relative", "rotary", "alibi", "t5_bias"]
V = 50


def tiny(arch: str, scheme: str = "learned", **kw) -> torch.nn.Module:
    position = {"scheme": scheme, "max_len": 64, "relative_max_distance": 4}
    cfg = ModelConfig(arch=arch, vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0,
                      norm_placement=kw.pop("norm_placement", "pre"), position=position, **kw)
    return build_model(cfg).eval()


def ids(B: int, T: int, low: int = 1) -> torch.Tensor:
    return torch.randint(low, V, (B, T))
