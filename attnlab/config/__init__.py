"""The one typed-config toolkit and the model configuration.

    cfg = ModelConfig(arch="decoder", vocab_size=1000, d_model=128, num_heads=4)
    cfg = from_dict(ModelConfig, load_config_file("model.json"))    # any config dataclass

`validate` holds the validators (errors read `section.field: what was wrong, what is allowed`),
`load` the loader (JSON/YAML files, dotted overrides, plain data <-> dataclasses).
"""

from attnlab.config.load import apply_overrides, from_dict, load_config, load_config_file, parse_value, to_dict
from attnlab.config.model import *  # noqa: F401,F403  (the name tuples: ARCHS, HEADS, ...)
from attnlab.config.model import AttentionConfig, ModelConfig, PositionConfig, RNNConfig
from attnlab.config.validate import ConfigError, ConfigTypeError

__all__ = ["AttentionConfig", "ConfigError", "ConfigTypeError", "ModelConfig", "PositionConfig", "RNNConfig",
           "apply_overrides", "from_dict", "load_config", "load_config_file", "parse_value", "to_dict"]
