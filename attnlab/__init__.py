"""attnlab: the Transformer family and its recurrent ancestors, to build, train, decode and inspect.

    import attnlab
    cfg = attnlab.presets.get("tiny-decoder")
    model = attnlab.build_model(cfg)
    logits = model(input_ids)            # (B, T, V)

`import attnlab` loads the configs and presets only (no torch: the `attnlab` command answers
`--help` at once); every other name — the models, save/load and generate as much as training,
data, fine-tuning, tokenizers, interop, inspect and parallel — is imported on first use, so
`attnlab.build_model` loads the model code and `attnlab.Trainer` the training code when touched.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnlab import presets
from attnlab._version import __version__  # noqa: F401 (attnlab.__version__)
from attnlab.config import AttentionConfig, ModelConfig, PositionConfig, RNNConfig

# name -> (module, attribute in it; None for the module itself), imported on first use
_LAZY: dict[str, tuple[str, str | None]] = {
    **{name: ("attnlab.models", name) for name in ("Decoder", "Encoder", "EncoderDecoder", "RNNEncoderDecoder",
                                                   "build_model")},
    "GenerateOutput": ("attnlab.decoding", "GenerateOutput"),
    "generate": ("attnlab.decoding", "generate"),
    "load": ("attnlab.interop.serialization", "load"),
    "save": ("attnlab.interop.serialization", "save"),
    "data": ("attnlab.data", None),
    "finetune": ("attnlab.finetune", None),
    "inspect": ("attnlab.inspect", None),
    "parallel": ("attnlab.parallel", None),
    "training": ("attnlab.training", None),
    "FewShotPrompt": ("attnlab.decoding.prompts", "FewShotPrompt"),
    "Tokenizer": ("attnlab.tokenizers", "Tokenizer"),
    "TrainConfig": ("attnlab.training", "TrainConfig"),
    "Trainer": ("attnlab.training", "Trainer"),
    "embed": ("attnlab.interop.sentence", "embed"),
    "fill_mask": ("attnlab.decoding.fill_mask", "fill_mask"),
    "from_hf": ("attnlab.interop", "from_hf"),
    "to_hf": ("attnlab.interop", "to_hf"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AttentionConfig", "Decoder", "Encoder", "EncoderDecoder", "FewShotPrompt", "GenerateOutput", "ModelConfig",
    "PositionConfig", "RNNConfig", "RNNEncoderDecoder", "Tokenizer", "TrainConfig", "Trainer", "build_model", "data",
    "embed", "fill_mask", "finetune", "from_hf", "generate", "inspect", "load", "parallel", "presets", "save", "to_hf",
    "training",
]
