"""Weights to and from Hugging Face `transformers` (GPT-2, BERT, BART, Marian, T5), and model
folders on disk: attnlab's own (`attnlab.save` / `attnlab.load`) and Hugging Face's.

    model = attnlab.interop.from_hf(hf_model_or_folder)
    hf_model = attnlab.interop.to_hf(model)
    attnlab.interop.save_hf(model, "folder/")       # config.json + model.safetensors
    model = attnlab.load("folder/")                 # attnlab's, a run's or Hugging Face's folder

One module per family (`gpt2`, `bert`, `bart`, `marian`, `t5`) maps config fields and renames
or reshapes tensors; `common` holds the rules; `files` reads weights without unpickling
objects (writing and atomic folders are attnlab's own I/O: `attnlab.io`); `serialization` is
`attnlab.save` / `attnlab.load` of model folders (attnlab's own, `attnlab train` runs, and Hugging
Face's through `from_hf`); `sentence` reads sentence-transformers releases (all-MiniLM-L6-v2) for
`attnlab.embed`.
"""

from attnlab.interop.api import from_hf, hf_export, save_hf, supported_architectures, to_hf

__all__ = ["from_hf", "hf_export", "save_hf", "supported_architectures", "to_hf"]
