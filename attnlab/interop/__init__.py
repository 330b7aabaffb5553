"""Weights to and from Hugging Face `transformers`: GPT-2, BERT, BART, Marian, T5.

    model = attnlab.interop.from_hf(hf_model_or_folder)
    hf_model = attnlab.interop.to_hf(model)
    attnlab.interop.save_hf(model, "folder/")       # config.json + model.safetensors

One module per family (`gpt2`, `bert`, `bart`, `marian`, `t5`) maps config fields and renames
or reshapes tensors; `common` holds the rules; `files` reads weights without unpickling
objects (loading, writing and atomic folders are attnlab's own I/O: `attnlab.io`); `sentence`
reads sentence-transformers releases (all-MiniLM-L6-v2) for `attnlab.embed`.
"""

from attnlab.interop.api import from_hf, hf_export, save_hf, supported_architectures, to_hf

__all__ = ["from_hf", "hf_export", "save_hf", "supported_architectures", "to_hf"]
