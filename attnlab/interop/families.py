"""The Hugging Face families attnlab converts, by class name: which module converts an
architecture, and which architecture a config.json describes. Read by the converters
(attnlab.interop.api), the Hub names (attnlab.interop.hub) and a run's init_from
(attnlab.training.setup.start) without importing the converters' entry points.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from attnlab.interop import bart, bert, gpt2, llama, marian, t5

# modules, or objects with a module's names (Llama, Mistral and Qwen2 share one converter class);
# `to_hf` asks them in this order which one expresses a config: the Llama layouts before GPT-2
FAMILIES: tuple[ModuleType | Any, ...] = (*llama.CONVERTERS, gpt2, bert, t5, marian, bart)
_BY_ARCHITECTURE = {name: fam for fam in FAMILIES for name in fam.ARCHITECTURES}
_DEFAULT_ARCHITECTURE = {fam.MODEL_TYPE: next(iter(fam.ARCHITECTURES)) for fam in FAMILIES}


def supported_architectures() -> list[str]:
    """Hugging Face class names `from_hf` converts."""
    return list(_BY_ARCHITECTURE)


def family_of(architecture: str) -> ModuleType | Any:
    """The module that converts `architecture` (a Hugging Face class name)."""
    if architecture not in _BY_ARCHITECTURE:
        raise ValueError(f"unsupported architecture {architecture!r}; attnlab converts "
                         f"{', '.join(_BY_ARCHITECTURE)}")
    return _BY_ARCHITECTURE[architecture]


def folder_architecture(hf_config: dict[str, Any], source: str) -> str:
    """The class a Hugging Face config.json describes (`architectures`, else `model_type`)."""
    names = hf_config.get("architectures") or []
    if names:
        return names[0]
    model_type = hf_config.get("model_type")
    if model_type in _DEFAULT_ARCHITECTURE:
        return _DEFAULT_ARCHITECTURE[model_type]
    raise ValueError(f"{source}: unsupported model_type {model_type!r}; attnlab converts "
                     f"{', '.join(_DEFAULT_ARCHITECTURE)}")
