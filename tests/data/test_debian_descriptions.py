"""The `debian-descriptions-de` corpus: Translation index files (the archive's format, written
here) parsed, paired by Description-md5, split by description with no valid sentence in train."""

import json
import zlib

import pytest

from attnlab.data import corpora
from attnlab.data.debian import description_pairs, parse_descriptions
from attnlab.io.downloads import download_apt_index, package_file_version


def _md5_in(valid: bool, start: int = 0) -> str:
    """A fake md5 that the 1-in-20 split puts in valid (or not)."""
    for i in range(start, start + 10_000):
        md5 = f"{i:032x}"
        if (zlib.crc32(md5.encode()) % 20 == 0) == valid:
            return md5
    raise AssertionError


TRAIN_MD5, OTHER_MD5, VALID_MD5 = _md5_in(False), _md5_in(False, 5000), _md5_in(True)
ENGLISH = f"""Package: zlib1g
Description-md5: {TRAIN_MD5}
Description-en: compression library - runtime
 zlib is a library implementing the deflate compression method
 found in gzip and PKZIP.
 .
 This package includes the shared library.

Package: zsh
Description-md5: {OTHER_MD5}
Description-en: shell with lots of features
 Zsh is a UNIX command interpreter.
 .
 It has many features.
 .
 make install

Package: zip
Description-md5: {VALID_MD5}
Description-en: Archiver for .zip files
 This package includes the shared library.

Package: nodesc
Description-md5: ffffffffffffffffffffffffffffffff
Description-en: only in English
"""
GERMAN = f"""Package: zlib1g
Description-md5: {TRAIN_MD5}
Description-de: Kompressionsbibliothek - Laufzeit
 zlib ist eine Bibliothek, die die
 Deflate-Kompressionsmethode umsetzt.
 .
 Dieses Paket enthält die gemeinsam genutzte Bibliothek.

Package: zsh
Description-md5: {OTHER_MD5}
Description-de: Shell mit vielen Funktionen
 Zsh ist ein UNIX-Befehlsinterpreter mit vielen Funktionen.

Package: zip
Description-md5: {VALID_MD5}
Description-de: Archivierer für .zip-Dateien
 Dieses Paket enthält die gemeinsam genutzte Bibliothek.
"""


def test_stanzas_parse_into_synopsis_and_paragraphs():
    english = parse_descriptions(ENGLISH)
    assert set(english) == {TRAIN_MD5, OTHER_MD5, VALID_MD5, "f" * 32}
    zlib_ = english[TRAIN_MD5]
    assert zlib_.package == "zlib1g" and zlib_.synopsis == "compression library - runtime"
    assert zlib_.paragraphs == ("zlib is a library implementing the deflate compression method found in gzip and PKZIP.",
                                "This package includes the shared library.")
    assert english["f" * 32].paragraphs == ()


def test_pairs_match_by_md5_and_paragraphs_only_when_the_counts_agree():
    pairs = description_pairs(parse_descriptions(ENGLISH), parse_descriptions(GERMAN))
    by_source = {s: (md5, t) for md5, s, t in pairs}
    assert by_source["compression library - runtime"] == (TRAIN_MD5, "Kompressionsbibliothek - Laufzeit")
    assert by_source["This package includes the shared library."][1] == \
        "Dieses Paket enthält die gemeinsam genutzte Bibliothek."
    assert by_source["shell with lots of features"][1] == "Shell mit vielen Funktionen"
    assert "Zsh is a UNIX command interpreter." not in by_source  # 3 paragraphs against 1: synopsis only
    assert "only in English" not in by_source
    # the same paragraph pair in two descriptions is kept once
    assert sum(s == "This package includes the shared library." for _, s, _ in pairs) == 1


def test_corpus_is_built_from_the_two_index_files(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    texts = {"Translation-en": ENGLISH, "Translation-de": GERMAN}
    asked = []

    def download(package, spec, into):
        asked.append(spec)
        index = package.name.rpartition("/")[2]
        path = into / f"{index}_{corpora.DEBIAN_RELEASE}_bookworm-main.index"
        path.write_text(texts[index], encoding="utf-8")
        return path

    monkeypatch.setattr(corpora, "_download", download)
    with pytest.raises(corpora.CorpusVerificationError, match="Translation-en"):
        corpora.fetch("debian-descriptions-de")
    with pytest.warns(UserWarning, match="unverified"):
        folder = corpora.fetch("debian-descriptions-de", verify=False)
    assert asked[-2:] == [f"bookworm/main/Translation-{lang}={corpora.DEBIAN_RELEASE}" for lang in ("en", "de")]
    read = {split: [line.split("\t") for line in (folder / f"{split}.tsv").read_text(encoding="utf-8").splitlines()]
            for split in ("train", "valid")}
    assert ["Archiver for .zip files", "Archivierer für .zip-Dateien"] in read["valid"]
    # the shared-library paragraph is in two descriptions (one train, one valid): kept once, in one split
    shared = ["This package includes the shared library.", "Dieses Paket enthält die gemeinsam genutzte Bibliothek."]
    assert (shared in read["train"]) + (shared in read["valid"]) == 1
    assert not {s for pair in read["valid"] for s in pair} & {s for pair in read["train"] for s in pair}
    assert ["compression library - runtime", "Kompressionsbibliothek - Laufzeit"] in read["train"]
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    assert meta["paired_descriptions"] == 3 and meta["train_pairs"] == len(read["train"])
    assert [p["version"] for p in meta["packages"]] == [corpora.DEBIAN_RELEASE] * 2


def test_index_file_names_carry_the_release_and_bad_specs_are_refused(tmp_path):
    assert package_file_version("Translation-de_12.15_bookworm-main.index") == "12.15"
    with pytest.raises(ValueError, match="SUITE/COMPONENT/Translation-LANG or SUITE/COMPONENT/Packages-ARCH"):
        download_apt_index("bookworm/main/Sources", tmp_path, "test")


PACKAGES = f"""Package: zlib1g
Section: libs
Description: compression library - runtime
Description-md5: {TRAIN_MD5}

Package: zlib1g-udeb
Section: debian-installer
Description-md5: {TRAIN_MD5}

Package: zsh
Section: contrib/shells
Description-md5: {OTHER_MD5}

Package: zip
Section: utils
Description-md5: {VALID_MD5}
"""


def test_sections_label_descriptions_and_ambiguous_ones_are_left_out(tmp_path):
    from attnlab.data.debian import read_sections, section_rows

    (tmp_path / "Packages").write_text(PACKAGES, encoding="utf-8")
    sections = read_sections(tmp_path / "Packages")
    assert sections == {TRAIN_MD5: "", OTHER_MD5: "shells", VALID_MD5: "utils"}  # zlib1g: two sections
    rows = {text: section for _, text, section in section_rows(parse_descriptions(ENGLISH), sections)}
    assert rows == {"shell with lots of features. Zsh is a UNIX command interpreter.": "shells",
                    "Archiver for .zip files. This package includes the shared library.": "utils"}
