"""The typed configuration of models (and, through the same validators, of runs).

    cfg = ModelConfig(arch="decoder", vocab_size=1000, d_model=128, num_heads=4)
"""

from attnlab.config.model import *  # noqa: F401,F403
from attnlab.config.model import AttentionConfig, ModelConfig, PositionConfig, RNNConfig

__all__ = ["AttentionConfig", "ModelConfig", "PositionConfig", "RNNConfig"]
