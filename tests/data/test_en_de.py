"""The `en-de` corpus: `de-en` (Ding's sentence pairs, from the dict-de-en package) and
`debian-descriptions-de` (the Translation index files) built together from the same files give
the union of what each gives on its own, and no sentence of the joint valid side in training."""

import gzip
import shutil
import subprocess

import pytest

from attnlab.data import corpora
from tests.data.test_corpora import _dictd
from tests.data.test_debian_descriptions import ENGLISH, GERMAN

SHARED = ("This package includes the shared library.", "Dieses Paket enthält die gemeinsam genutzte Bibliothek.")
# 123 fillers: Ding's seeded 1-in-20 split then holds SHARED out, while the descriptions train on it
SENTENCES = [(f"The house number {i} is red.", f"Das Haus Nummer {i} ist rot.") for i in range(123)] + [SHARED]


def _fake_dict_de_en(tmp_path):
    """A dict-de-en .deb with Ding's dictd files (index + gzip data) holding SENTENCES."""
    index, data = _dictd([f"{en}\n\n   {de}\n" for en, de in SENTENCES])
    share = tmp_path / "pkg" / "usr" / "share" / "dictd"
    share.mkdir(parents=True)
    (share / "english-german.index").write_text(index, encoding="utf-8")
    (share / "english-german.dict.dz").write_bytes(gzip.compress(data))
    (tmp_path / "pkg" / "DEBIAN").mkdir()
    (tmp_path / "pkg" / "DEBIAN" / "control").write_text(
        "Package: dict-de-en\nVersion: 1.9-6\nArchitecture: all\nMaintainer: test <t@example.org>\n"
        "Description: test\n", encoding="utf-8")
    deb = tmp_path / "dict-de-en_1.9-6_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(tmp_path / "pkg"), str(deb)], check=True,
                   capture_output=True)
    return deb


def _read(folder):
    return {split: [tuple(line.split("\t")) for line in (folder / f"{split}.tsv").read_text(encoding="utf-8").splitlines()]
            for split in ("train", "valid")}


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb (Debian/Ubuntu) is not installed")
def test_en_de_is_de_en_and_the_descriptions_together(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    deb = _fake_dict_de_en(tmp_path)
    indices = {"Translation-en": ENGLISH, "Translation-de": GERMAN}

    def download(package, spec, into):
        if package.name == "apt:dict-de-en":
            return shutil.copy(deb, into / deb.name) and into / deb.name
        index = package.name.rpartition("/")[2]
        path = into / f"{index}_{corpora.DEBIAN_RELEASE}_bookworm-main.index"
        path.write_text(indices[index], encoding="utf-8")
        return path

    monkeypatch.setattr(corpora, "_download", download)
    with pytest.raises(corpora.CorpusVerificationError):  # the fixtures are not the recorded files
        corpora.fetch("en-de")
    with pytest.warns(UserWarning, match="unverified"):
        parts = [_read(corpora.fetch(name, verify=False)) for name in ("de-en", "debian-descriptions-de", "en-de")]
    ding, descriptions, both = parts
    assert ding["train"] and descriptions["train"]
    assert set(both["valid"]) == set(ding["valid"]) | set(descriptions["valid"])
    assert len(both["valid"]) == len(set(both["valid"]))
    assert both["valid"] != ding["valid"] + descriptions["valid"]  # shuffled: a prefix mixes the two parts
    held = {sentence for pair in both["valid"] for sentence in pair}
    assert not held & {sentence for pair in both["train"] for sentence in pair}
    expected = {pair for pair in ding["train"] + descriptions["train"] if not set(pair) & held}
    assert set(both["train"]) == expected and len(both["train"]) == len(expected)
    # held out by Ding's split, the shared-library pair trains nowhere, though the descriptions train on it
    assert SHARED in ding["valid"] and SHARED in descriptions["train"] and SHARED not in both["train"]
    meta = corpora.info("en-de")["meta"]
    assert meta["train_pairs"] == len(both["train"]) and meta["valid_pairs"] == len(both["valid"])
    assert [p["package"] for p in meta["packages"]] == [p.name for p in corpora.get_corpus("en-de").packages]
