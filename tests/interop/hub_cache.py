"""A Hugging Face Hub cache laid out by hand, as huggingface_hub lays it out when it downloads:

    CACHE/models--ORG--NAME/
      blobs/<etag>                          each file's bytes once, named by the Hub's ETag: the
                                            sha256 of an LFS file (weights), the git blob sha1 of
                                            any other file (config.json, tokenizer files)
      snapshots/<commit>/<file>             -> ../../blobs/<etag>, a relative symlink
      refs/<revision>                       the commit hash, no newline (huggingface_hub reads the
                                            file whole, and so does its scan_cache_dir)

huggingface_hub has no public call that writes a cache entry from local files (its writers are
private helpers of the download path), so the tests write it themselves and check it with the
library's own readers: `scan_cache_dir`, `snapshot_download(local_files_only=True)` and
`try_to_load_from_cache` (tests/interop/test_hub.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack")  # stored with git LFS on the Hub


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's bytes: sha1 of `blob <size>\\0` + the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def etag(name: str, data: bytes) -> str:
    """The blob name huggingface_hub gives a downloaded file (the Hub's ETag for it)."""
    return hashlib.sha256(data).hexdigest() if name.endswith(LFS_SUFFIXES) else git_blob_sha1(data)


def repo_folder(cache: Path, repo_id: str) -> Path:
    return Path(cache) / ("models--" + repo_id.replace("/", "--"))


def cache_files(cache: Path, repo_id: str, files: dict[str, bytes], *, revisions: tuple[str, ...] = ("main",),
                commit: str | None = None) -> Path:
    """Lay out `files` (name in the repository -> bytes) as one commit of `repo_id` in `cache`,
    with refs/<revision> naming it for each of `revisions`; returns the snapshot folder."""
    if commit is None:  # a 40-hex-digit id that depends on the content, as a commit's does
        listing = "".join(f"{name} {etag(name, data)}\n" for name, data in sorted(files.items()))
        commit = hashlib.sha1(listing.encode()).hexdigest()
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    for name, data in files.items():
        blob = repo / "blobs" / etag(name, data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():  # downloaded before (a second call): replaced, as huggingface_hub does
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    for revision in revisions:
        ref = repo / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit, encoding="utf-8")  # no newline
    return snapshot


def cache_folder(cache: Path, repo_id: str, folder: Path, **kwargs) -> Path:
    """`cache_files` of every file of `folder` (a save_pretrained folder), by its relative path."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    return cache_files(cache, repo_id, files, **kwargs)
