"""`hf:NAME`: resolved through huggingface_hub's cache (laid out as the library lays it out and
checked with its own readers), offline from the cache alone, online through `snapshot_download`
(replaced here by a stand-in that records what it is asked for: there is no network), and one-line
errors naming the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import huggingface_hub
import pytest
import torch
from huggingface_hub import errors as hub_errors

from attnlab.interop import from_hf
from attnlab.interop.files import read_weights
from attnlab.interop.hub import (CONFIG_FILES, MODEL_FILES, HubError, HubNotInstalled, hub_cache_dir, hub_folder,
                                 offline, parse_hub_name)
from attnlab.io.weights import write_safetensors
from tests.interop.helpers import TOL, real_max_diff, tiny_gpt2_folder
from tests.interop.hub_cache import cache_files, cache_folder, etag, repo_folder

REPO = "attnlab-tests/tiny-gpt2"


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """An empty Hub cache under tmp_path ($HF_HUB_CACHE), online unless a test says otherwise."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return tmp_path / "hf-cache"


@pytest.fixture
def gpt2_repo(tmp_path):
    """(transformers model, its save_pretrained folder): a random tiny GPT-2."""
    return tiny_gpt2_folder(tmp_path / "saved"), tmp_path / "saved"


def _no_download(*args, **kwargs):
    raise AssertionError(f"snapshot_download called online: {args} {kwargs}")


@pytest.mark.parametrize("name, want", [
    ("hf:gpt2", ("gpt2", None)),
    ("hf:openai-community/gpt2", ("openai-community/gpt2", None)),
    ("hf:org/name.v2@main", ("org/name.v2", "main")),
    ("hf:org/name@refs/pr/1", ("org/name", "refs/pr/1")),
])
def test_names_parse_into_repository_and_revision(name, want):
    assert parse_hub_name(name) == want


@pytest.mark.parametrize("name", ["hf:", "hf:a/b/c", "hf:gpt2@", "hf:/gpt2", "hf:org/", "hf:../x", "gpt2", "hf:a b"])
def test_malformed_names_are_refused_naming_them(name):
    with pytest.raises(ValueError, match="hf:NAME") as info:
        parse_hub_name(name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("env", [
    {"HF_HUB_CACHE": "/x/hub-cache"},
    {"HF_HOME": "/y/hf-home"},
    {"HF_HOME": "/y/hf-home", "HF_HUB_CACHE": "/x/wins"},
    {"XDG_CACHE_HOME": "/z/xdg", "HF_HUB_OFFLINE": "yes"},
    {"HUGGINGFACE_HUB_CACHE": "/old/name", "TRANSFORMERS_OFFLINE": "1"},
])
def test_cache_folder_and_offline_follow_huggingface_hub(monkeypatch, env):
    """huggingface_hub itself, imported with `env`, is the reference (it reads them at import)."""
    names = ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE",
             "TRANSFORMERS_OFFLINE")
    clean = {k: v for k, v in os.environ.items() if k not in names}
    script = ("import json; from huggingface_hub import constants as c; "
              "print(json.dumps([c.HF_HUB_CACHE, c.HF_HUB_OFFLINE]))")
    out = subprocess.run([sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    for name in names:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert [str(hub_cache_dir()), offline()] == json.loads(out.stdout)


def test_the_hand_made_cache_is_read_by_huggingface_hub_itself(hub_env, gpt2_repo, monkeypatch):
    _, saved = gpt2_repo
    snapshot = cache_folder(hub_env, REPO, saved, revisions=("main", "v1"))
    assert (snapshot / "config.json").readlink().as_posix().startswith("../../blobs/")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a corrupted entry is reported as a warning
        info = huggingface_hub.scan_cache_dir(hub_env)
    assert not info.warnings
    (repo,) = info.repos
    (revision,) = repo.revisions
    assert (repo.repo_id, repo.repo_type, revision.commit_hash) == (REPO, "model", snapshot.name)
    assert revision.refs == {"main", "v1"}
    assert {f.file_name for f in revision.files} == {p.name for p in saved.iterdir()}
    weights = (saved / "model.safetensors").read_bytes()
    assert {f.blob_path.name for f in revision.files if f.file_name == "model.safetensors"} == {
        etag("model.safetensors", weights)}
    found = huggingface_hub.snapshot_download(REPO, cache_dir=hub_env, local_files_only=True)
    assert found == str(snapshot)
    assert huggingface_hub.try_to_load_from_cache(REPO, "config.json", cache_dir=hub_env, revision="v1") == str(
        snapshot / "config.json")


def test_offline_a_name_is_its_cached_snapshot_by_branch_tag_or_commit(hub_env, gpt2_repo, monkeypatch):
    hf, saved = gpt2_repo
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _offline_only(huggingface_hub.snapshot_download))
    # as if huggingface_hub had been imported under another environment: the cache is read from it now
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_env.parent / "not-this-one"))
    snapshot = cache_folder(hub_env, REPO, saved, revisions=("main", "v1"))
    for name in (f"hf:{REPO}", f"hf:{REPO}@v1", f"hf:{REPO}@{snapshot.name}"):
        assert hub_folder(name) == snapshot
    ids = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        assert real_max_diff(from_hf(f"hf:{REPO}")(ids), hf(input_ids=ids).logits) <= TOL


def _offline_only(download):
    def wrapped(*args, **kwargs):
        assert kwargs["local_files_only"] is True, "offline resolution must not ask the network"
        return download(*args, **kwargs)
    return wrapped


def test_offline_a_name_not_in_the_cache_is_one_line_naming_it(hub_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as info:
        hub_folder("hf:nobody/nothing")
    message = str(info.value)
    assert message.startswith("hf:nobody/nothing is not in the Hugging Face cache") and str(hub_env) in message
    assert "HF_HUB_OFFLINE" in message and "\n" not in message


def test_offline_a_revision_not_in_the_cache_names_it_and_the_cached_ones(hub_env, gpt2_repo, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache_folder(hub_env, REPO, gpt2_repo[1], revisions=("main", "v1"))
    with pytest.raises(HubError, match=r"hf:.*@v2: revision 'v2' is not in the Hugging Face cache .*cached: main, v1"):
        hub_folder(f"hf:{REPO}@v2")


def test_pickle_only_repositories_are_refused(hub_env, gpt2_repo, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, saved = gpt2_repo
    state, _ = read_weights(saved)
    torch.save(state, saved / "pytorch_model.bin")
    (saved / "model.safetensors").unlink()
    cache_folder(hub_env, REPO, saved)
    with pytest.raises(HubError, match=r"no model\.safetensors \(the cached snapshot holds pytorch_model\.bin\).*never "
                                       r"from pickles"):
        hub_folder(f"hf:{REPO}")
    with pytest.raises(HubError, match="never from pickles"):
        from_hf(f"hf:{REPO}")


class RecordingHub:
    """A stand-in for `snapshot_download` online: records each call and answers as the Hub
    would, from a repository `files` at commit `commit` (written into the cache it is given)."""

    def __init__(self, files, commit="a" * 40):
        self.files, self.commit, self.calls = files, commit, []

    def __call__(self, repo_id, *, revision=None, cache_dir=None, allow_patterns=None, local_files_only=False):
        from huggingface_hub.utils import filter_repo_objects

        self.calls.append(dict(repo_id=repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=allow_patterns,
                               local_files_only=local_files_only))
        wanted = set(filter_repo_objects(self.files, allow_patterns=allow_patterns))
        revision = revision or "main"
        refs = () if revision == self.commit else (revision,)  # a commit hash gets no ref
        return str(cache_files(cache_dir, repo_id, {n: d for n, d in self.files.items() if n in wanted},
                               commit=self.commit, revisions=refs))


def _hub_repo(saved):
    """What the gpt2 repository on the Hub holds, with this model's config and weights: the
    files attnlab reads and the ones it must not download."""
    files = {p.name: p.read_bytes() for p in saved.iterdir()}
    files.update({name: b"not read" for name in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack",
                                                 "rust_model.ot", "64.tflite", "onnx/decoder_model.onnx",
                                                 "onnx/config.json", "README.md", "vocab.json", "merges.txt",
                                                 "tokenizer.json")})
    return files


def test_online_the_right_repository_revision_and_files_are_downloaded(hub_env, gpt2_repo, monkeypatch):
    hf, saved = gpt2_repo
    fake = RecordingHub(_hub_repo(saved))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    folder = hub_folder(f"hf:{REPO}@v1")
    assert folder == hub_env / f"models--attnlab-tests--tiny-gpt2/snapshots/{fake.commit}"
    first, second = fake.calls
    assert first == dict(repo_id=REPO, revision="v1", cache_dir=str(hub_env), allow_patterns=CONFIG_FILES,
                         local_files_only=False)
    assert second == {**first, "revision": fake.commit, "allow_patterns": MODEL_FILES}  # the commit the first found
    downloaded = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert downloaded == ["config.json", "merges.txt", "model.safetensors", "tokenizer.json", "vocab.json"]


def test_online_an_unsupported_architecture_is_refused_before_any_weights(hub_env, gpt2_repo, monkeypatch):
    files = _hub_repo(gpt2_repo[1])
    files["config.json"] = json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}).encode()
    fake = RecordingHub(files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(HubError, match=r"hf:.*: architecture 'GPTNeoXForCausalLM' is not one attnlab converts"):
        hub_folder(f"hf:{REPO}")
    assert [c["allow_patterns"] for c in fake.calls] == [CONFIG_FILES]


def test_shards_listed_by_an_index_are_downloaded_and_read(hub_env, gpt2_repo, monkeypatch):
    hf, saved = gpt2_repo
    state, _ = read_weights(saved)
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    files = {"config.json": (saved / "config.json").read_bytes()}
    for shard, keys in shards.items():
        write_safetensors({k: state[k] for k in keys}, saved / shard)
        files[shard] = (saved / shard).read_bytes()
    files["model.safetensors.index.json"] = json.dumps(
        {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}).encode()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", RecordingHub(files))
    ids = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        assert real_max_diff(from_hf(f"hf:{REPO}")(ids), hf(input_ids=ids).logits) <= TOL


def _hub_error(kind, message="from the Hub"):
    """One of huggingface_hub's errors, without an HTTP response behind it."""
    err = kind.__new__(kind)
    Exception.__init__(err, message)
    return err


@pytest.mark.parametrize("kind, message", [
    ("GatedRepoError", r"^hf:org/model@v1 is a gated model: accept its conditions on https://huggingface.co/org/model"),
    ("RepositoryNotFoundError", r"^hf:org/model@v1: no model 'org/model' on the Hugging Face Hub"),
    ("RevisionNotFoundError", r"^hf:org/model@v1: the Hub has no revision 'v1' of org/model"),
    ("HfHubHTTPError", r"^hf:org/model@v1: the Hugging Face Hub refused the request \(HfHubHTTPError: from the Hub\)"),
])
def test_hub_errors_become_one_line_naming_the_model(hub_env, monkeypatch, kind, message):
    def refuse(*args, **kwargs):
        raise _hub_error(getattr(hub_errors, kind))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(HubError, match=message) as info:
        hub_folder("hf:org/model@v1")
    assert "\n" not in str(info.value)


def test_a_network_failure_with_nothing_cached_says_the_hub_could_not_be_reached(hub_env, monkeypatch):
    def unreachable(*args, **kwargs):  # what snapshot_download raises when the request fails and the cache is empty
        raise _hub_error(hub_errors.LocalEntryNotFoundError, "cannot find the files") from ConnectionError("refused")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(HubError, match=r"^hf:gpt2 is not in the Hugging Face cache .* and the Hub could not be reached "
                                       r"\(ConnectionError: refused\)$"):
        hub_folder("hf:gpt2")


def test_without_huggingface_hub_the_error_names_the_pip_command(hub_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` raises ImportError
    with pytest.raises(HubNotInstalled, match=r"pip install huggingface_hub$"):
        hub_folder("hf:gpt2")


def test_hf_home_is_where_the_cache_is_without_hf_hub_cache(tmp_path, gpt2_repo, monkeypatch):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = cache_folder(tmp_path / "home" / "hub", REPO, gpt2_repo[1])
    assert hub_folder(f"hf:{REPO}") == snapshot
    assert repo_folder(tmp_path / "home" / "hub", REPO).is_dir()
