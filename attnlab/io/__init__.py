"""attnlab's own files: safetensors, atomic writes, checkpoints' layout, downloads and the
cache, the run folder's lock, and the progress line of long jobs.

    attnlab.io.atomic_write_json("out/summary.json", {"accuracy": 0.91})
    with attnlab.io.atomic_folder("out/export") as tmp: ...

Layers: `lock`, `cache`, `progress` import nothing from attnlab; `files` asks `lock` whether the
writer of a leftover temporary still runs; `weights`, `checkpoints` and `downloads` build on
them. `io` is the bottom of the package (beside `config`): saving and loading a model folder
(`attnlab.save` / `attnlab.load`) builds models and reads Hugging Face folders, so it lives
above them, in `attnlab.interop.serialization`, and uses these files.
"""

from attnlab.io.cache import cache_dir, sha256_file, verify_sha256
from attnlab.io.checkpoints import CheckpointError
from attnlab.io.downloads import DownloadError, PackageFiles, fetch
from attnlab.io.files import (atomic_file, atomic_folder, atomic_write_bytes, atomic_write_json, atomic_write_text,
                              read_json)
from attnlab.io.progress import Progress
from attnlab.io.weights import load_state, read_safetensors, unique_state, write_safetensors

__all__ = ["CheckpointError", "DownloadError", "PackageFiles", "Progress", "atomic_file", "atomic_folder",
           "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "cache_dir", "fetch", "load_state",
           "read_json", "read_safetensors", "sha256_file", "unique_state", "verify_sha256", "write_safetensors"]
