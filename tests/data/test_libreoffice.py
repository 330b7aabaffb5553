"""The `libreoffice-<lang>` corpora: built from a package's .mo catalogues, verified, cached."""

import shutil
import subprocess

import pytest

from attnlab.data import corpora
from attnlab.data.mofile import Message, write_mo

CATALOGUE = [
    Message("~Open", "Ö~ffnen"), Message("_Insert Rows", "Zeilen _einfügen"),
    Message("Date", "Datum", context="FLD_DATE_STD"), Message("Untranslated", ""),
    Message("Two\nlines", "Zwei\nZeilen"),
] + [Message(f"Message number {i}", f"Meldung Nummer {i}") for i in range(60)]


def _fake_deb(tmp_path, lang="de"):
    root = tmp_path / "pkg"
    mo = root / "usr/lib/libreoffice/program/resource" / lang / "LC_MESSAGES"
    mo.mkdir(parents=True)
    (mo / "sw.mo").write_bytes(write_mo(CATALOGUE))
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(f"Package: libreoffice-l10n-{lang}\nVersion: 1.0\nArchitecture: all\n"
                                         "Maintainer: test <t@example.org>\nDescription: test\n", encoding="utf-8")
    deb = tmp_path / f"libreoffice-l10n-{lang}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)], check=True, capture_output=True)
    return deb


def test_clean_ui_string_drops_mnemonics_and_joins_lines():
    assert corpora.clean_ui_string("Ö~ffnen") == "Öffnen"
    assert corpora.clean_ui_string("Zeilen _einfügen\n") == "Zeilen einfügen"
    assert corpora.clean_ui_string("A_ccept\tall\n\n%FILE_NAME") == "Accept all %FILE_NAME"


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb (Debian/Ubuntu) is not installed")
def test_libreoffice_corpus_is_built_from_the_catalogues_and_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    deb = _fake_deb(tmp_path)
    monkeypatch.setattr(corpora, "_download",
                        lambda corpus, spec, into: shutil.copy(deb, into / deb.name) and into / deb.name)
    with pytest.raises(corpora.CorpusVerificationError, match="not in the known list"):  # the real package's hashes
        corpora.fetch("libreoffice-de")
    assert not corpora.corpus_path("libreoffice-de").exists()
    with pytest.warns(UserWarning, match="unverified"):
        folder = corpora.fetch("libreoffice-de", verify=False)
    rows = [line.split("\t") for split in ("train", "valid")
            for line in (folder / f"{split}.tsv").read_text(encoding="utf-8").splitlines()]
    pairs = {en: tr for en, tr in rows}
    assert pairs["Open"] == "Öffnen" and pairs["Insert Rows"] == "Zeilen einfügen" and pairs["Date"] == "Datum"
    assert pairs["Two lines"] == "Zwei Zeilen" and "Untranslated" not in pairs
    assert len(rows) == len(pairs) == len(CATALOGUE) - 1
    valid = (folder / "valid.tsv").read_text(encoding="utf-8").splitlines()
    assert 0 < len(valid) < len(rows) // 4
    meta = corpora.info("libreoffice-de")["meta"]
    assert meta["catalogues"] == 1 and meta["train_pairs"] + meta["valid_pairs"] == len(rows)


def test_libreoffice_corpus_off_debian_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpora.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="Debian or Ubuntu"):
        corpora.fetch("libreoffice-fr")
