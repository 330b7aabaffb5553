"""The data cache: where fetched corpora and tokenised files live, and how they get there
without ever leaving half a file behind.

The cache folder is `$ATTNLAB_CACHE`, else `~/.cache/attnlab`. Every entry is built in a
temporary sibling folder and renamed into place when complete, so an interrupted download or
tokenisation leaves nothing that looks finished.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from attnlab.downloads import cache_dir, sha256_file

__all__ = ["atomic_folder", "cache_dir", "run_tool", "sha256_file", "verify_sha256"]


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


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside `target`; rename it to `target` when the block ends
    without an error, delete it otherwise. An existing `target` is replaced."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".tmp-{target.name}-"))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def run_tool(cmd: list[str], cwd: str | os.PathLike, what: str) -> None:
    """Run a download tool (pip, apt-get) with its own progress shown on stderr.

    Raises:
        FileNotFoundError: the tool is not installed.
        ValueError: it failed (the message names the command and its exit code).
    """
    if shutil.which(cmd[0]) is None and not os.path.isabs(cmd[0]):
        raise FileNotFoundError(f"{what} needs `{cmd[0]}`, which is not on PATH")
    print(f"[attnlab data] {what}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        sys.stderr.fileno()
        out = sys.stderr
    except (AttributeError, OSError, ValueError):  # a captured stream: collect and echo
        out = subprocess.PIPE
    proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)
    if out is subprocess.PIPE and proc.stdout:
        sys.stderr.write(proc.stdout[-2000:])
    if proc.returncode != 0:
        raise ValueError(f"{what}: `{' '.join(cmd)}` failed with exit code {proc.returncode}")
