"""The `debian-descriptions-de` corpus: Translation index files (the archive's format, written
here) parsed, paired by Description-md5, split by description with no valid sentence in train."""

import json
import zlib
from pathlib import Path

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


def _fetch_from(monkeypatch, tmp_path, name: str, english: str, lang: str = "en"):
    """Corpus `name` built from `english` as the Translation-<lang> index file (download faked)."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))

    def download(package, spec, into):
        path = into / f"Translation-{lang}_{corpora.DEBIAN_RELEASE}_bookworm-main.index"
        path.write_text(english, encoding="utf-8")
        return path

    monkeypatch.setattr(corpora, "_download", download)
    with pytest.warns(UserWarning, match="unverified"):
        return corpora.fetch(name, verify=False)


LONG = "It reads a list of items from standard input and prints the one the user picks to standard output."
SUMMARIES = f"""Package: bemenu
Description-md5: {TRAIN_MD5}
Description-en: dynamic menu library
 {LONG}
 .
 Entering text narrows the list.

Package: dmenu
Description-md5: {VALID_MD5}
Description-en: dynamic menu for X
 {LONG} Typing narrows it.

Package: rofi
Description-md5: {OTHER_MD5}
Description-en: dynamic menu for X
 Rofi is a window switcher, run dialog and dmenu replacement: it reads items, the user picks one
 and it prints it; modes are added by scripts.

Package: zip-dev
Description-md5: {_md5_in(False, 7000)}
Description-en: development files for zip
 See zip.
"""


def test_summaries_pair_long_descriptions_with_their_synopsis(tmp_path, monkeypatch):
    from attnlab.data.debian import summary_pairs

    pairs = {(document, summary) for _, document, summary in summary_pairs(parse_descriptions(SUMMARIES))}
    assert (LONG + " Entering text narrows the list.", "dynamic menu library") in pairs  # paragraphs joined
    assert not any(summary == "development files for zip" for _, summary in pairs)  # "See zip.": too short
    assert {summary for _, _, summary in summary_pairs(parse_descriptions(SUMMARIES), min_words=2)} >= {
        "development files for zip"}
    cut = summary_pairs(parse_descriptions(SUMMARIES), max_words=5)
    assert all(len(document.split()) <= 5 for _, document, _ in cut)

    folder = _fetch_from(monkeypatch, tmp_path, "debian-summaries", SUMMARIES)
    read = {split: [line.split("\t") for line in (folder / f"{split}.tsv").read_text(encoding="utf-8").splitlines()]
            for split in ("train", "valid")}
    assert [summary for _, summary in read["valid"]] == ["dynamic menu for X"]
    # rofi shares dmenu's synopsis (held out): its pair is not trained on
    assert [summary for _, summary in read["train"]] == ["dynamic menu library"]


def test_debian_text_holds_out_what_debian_sections_holds_out(tmp_path, monkeypatch):
    held_in_sections = {md5 for md5 in (TRAIN_MD5, OTHER_MD5, VALID_MD5) if zlib.crc32(md5.encode()) % 10 == 0}
    assert held_in_sections == {VALID_MD5}  # the fixture's md5s fall as the test assumes
    folder = _fetch_from(monkeypatch, tmp_path, "debian-text", ENGLISH)
    train, valid = ((folder / f"{split}.txt").read_text(encoding="utf-8").strip().split(corpora.DOC_SEPARATOR)
                    for split in ("train", "valid"))
    assert valid == ["Archiver for .zip files\nThis package includes the shared library."]
    assert train[0].splitlines() == ["compression library - runtime",
                                     "zlib is a library implementing the deflate compression method found in gzip "
                                     "and PKZIP.", "This package includes the shared library."]
    assert not any("Archiver" in document for document in train)


def test_debian_text_drops_a_training_copy_of_a_held_out_headline(tmp_path, monkeypatch):
    copy = "\n".join(["Package: zip-copy", f"Description-md5: {_md5_in(False, 9000)}",
                      "Description-en: Archiver for .zip files", " This package includes the shared library.",
                      " .", " A second paragraph makes the document differ.", ""])
    folder = _fetch_from(monkeypatch, tmp_path, "debian-text", ENGLISH + "\n" + copy)
    train = (folder / "train.txt").read_text(encoding="utf-8")
    assert "Archiver" not in train and "zlib" in train


def test_a_language_with_an_underscore_is_found_under_apt_escaped_name(tmp_path, monkeypatch):
    """apt stores Translation-zh_CN as `..._i18n_Translation-zh%5fCN` (its URI with "_" escaped):
    the index is found under that name and handed back as Translation-zh_CN."""
    from attnlab.io import downloads

    def fake_apt(cmd, into, what, **kwargs):  # what `apt-get update` leaves in Dir::State::Lists
        lists = Path(next(c for c in cmd if c.startswith("Dir::State::Lists=")).partition("=")[2])
        (lists / "deb.debian.org_debian_dists_bookworm_InRelease").write_text("Version: 12.15\n", encoding="utf-8")
        (lists / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-zh%5fCN").write_text(
            "Package: 0ad\nDescription-md5: d943033bedada21853d2ae54a2578a7b\nDescription-zh_CN: 古代战争\n",
            encoding="utf-8")

    monkeypatch.setattr(downloads, "run_tool", fake_apt)
    path = download_apt_index("bookworm/main/Translation-zh_CN=12.15", tmp_path, "test")
    assert path.name == "Translation-zh_CN_12.15_bookworm-main.index"
    assert "古代战争" in path.read_text(encoding="utf-8")


JAPANESE = f"""Package: zlib1g
Description-md5: {TRAIN_MD5}
Description-ja: 圧縮ライブラリ - ランタイム
 zlib は gzip や PKZIP で使われている deflate 圧縮方式を実装し
 たライブラリです。
 .
 このパッケージには共有ライブラリが含まれます。

Package: zip
Description-md5: {VALID_MD5}
Description-ja: .zip ファイル用アーカイバ
 Info-ZIP の zip です。
"""


def test_debian_text_ja_joins_wrapped_japanese_without_a_space_and_holds_out_by_the_english_md5(tmp_path,
                                                                                              monkeypatch):
    """Japanese wraps inside words: two full-width characters across a line break meet without a
    space; a break after Latin text is a space as in English. The description held out is the one
    whose (English) md5 debian-text and debian-sections hold out."""
    folder = _fetch_from(monkeypatch, tmp_path, "debian-text-ja", JAPANESE, lang="ja")
    train, valid = ((folder / f"{split}.txt").read_text(encoding="utf-8").strip().split(corpora.DOC_SEPARATOR)
                    for split in ("train", "valid"))
    assert train == ["圧縮ライブラリ - ランタイム\nzlib は gzip や PKZIP で使われている deflate 圧縮方式を実装し"
                     "たライブラリです。\nこのパッケージには共有ライブラリが含まれます。"]
    assert valid == [".zip ファイル用アーカイバ\nInfo-ZIP の zip です。"]
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    assert meta["language"] == "ja" and meta["train_documents"] == 1
