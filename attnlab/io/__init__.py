"""attnlab's own files: save/load of model folders, safetensors, atomic writes, checkpoints'
layout, downloads and the cache, and the progress line of long jobs.

    attnlab.io.save(model, "run/model", tokenizer=tok)     # also attnlab.save / attnlab.load
    attnlab.io.atomic_write_json("out/summary.json", {"accuracy": 0.91})
    with attnlab.io.atomic_folder("out/export") as tmp: ...

Layers: `files`, `cache`, `progress` import nothing from attnlab; `weights`, `checkpoints` and
`downloads` build on them; `serialization` (save/load) sits on top, since loading builds a
model (and reads Hugging Face folders through `attnlab.interop` on demand).
"""

from attnlab.io.cache import cache_dir, sha256_file, verify_sha256
from attnlab.io.checkpoints import CheckpointError
from attnlab.io.downloads import DownloadError, PackageFiles, fetch
from attnlab.io.files import (atomic_file, atomic_folder, atomic_write_bytes, atomic_write_json, atomic_write_text,
                              read_json)
from attnlab.io.progress import Progress
from attnlab.io.serialization import load, save
from attnlab.io.weights import load_state, read_safetensors, unique_state, write_safetensors

__all__ = ["CheckpointError", "DownloadError", "PackageFiles", "Progress", "atomic_file", "atomic_folder",
           "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "cache_dir", "fetch", "load",
           "load_state", "read_json", "read_safetensors", "save", "sha256_file", "unique_state", "verify_sha256",
           "write_safetensors"]
