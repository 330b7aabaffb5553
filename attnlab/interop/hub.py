"""`hf:NAME`: a model on the Hugging Face Hub, read through `huggingface_hub`'s cache.

    hf:gpt2                       the repository `gpt2`, branch main
    hf:openai-community/gpt2      ORG/NAME
    hf:gpt2@v1.0                  a branch, a tag or a commit hash (refs/pr/1 too)

`hub_folder("hf:gpt2")` is the local folder of that snapshot, `snapshots/<commit>/` inside the
cache, holding only the files attnlab reads: config.json, the safetensors weights (one file, or
the shards an index lists) and the tokenizer's files. Whatever takes a model folder takes such a
name: `attnlab.load`, `attnlab.from_hf`, `model.init_from`, `attnlab convert`, `generate`, ...

Where the files come from is `huggingface_hub`'s choice, as with `transformers`:

    online                         the Hub is asked which commit the revision is, the files missing
                                   from the cache are downloaded, the snapshot is returned
    HF_HUB_OFFLINE=1               the cache alone (refs/<revision> names the commit); nothing is
    (or TRANSFORMERS_OFFLINE=1)    sent over the network
    the Hub unreachable            the cache, as if offline

The cache is `huggingface_hub`'s: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
(read when a name is resolved, not when the library was imported), shared with `transformers`.

attnlab never loads pickled weights from the Hub: a repository with pytorch_model.bin and no
safetensors file is refused (a local folder's pytorch_model.bin is read through the weights-only
unpickler, `attnlab.interop.files`; the Hub is where files of strangers come from). config.json is
fetched first and its architecture checked, so that an unsupported model costs no weights download.

`huggingface_hub` is optional (it comes with `transformers`): it is imported only here, when a
name is resolved, and a missing one is a `HubError` that says how to install it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from attnlab.interop.files import SAFETENSORS_INDEX as INDEX
from attnlab.io.files import read_json
from attnlab.io.weights import SAFETENSORS

PREFIX = "hf:"
CONFIG_FILES = ["config.json"]
WEIGHT_FILES = [SAFETENSORS, INDEX, "model-*-of-*.safetensors"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "vocab.txt"]
MODEL_FILES = CONFIG_FILES + WEIGHT_FILES + TOKENIZER_FILES
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
INSTALL = "pip install huggingface_hub"

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_TRUE = {"1", "ON", "YES", "TRUE"}  # how huggingface_hub reads a boolean environment variable


class HubError(RuntimeError):
    """A Hub model that cannot be had: not in the cache while offline, no such model or revision,
    gated, without safetensors weights; the message names the model and what to do."""


class HubNotInstalled(HubError, ImportError):
    """`hf:NAME` was asked for without `huggingface_hub` installed."""


def is_hub_name(value: Any) -> bool:
    """Whether `value` names a Hub model (`hf:...`) rather than a folder (`./hf:x` is a folder)."""
    return isinstance(value, str) and value.startswith(PREFIX)


def parse_hub_name(name: str) -> tuple[str, str | None]:
    """(repository id, revision or None) of `hf:ORG/NAME@REVISION`.

        parse_hub_name("hf:gpt2")                     # ("gpt2", None)
        parse_hub_name("hf:openai-community/gpt2@v2")  # ("openai-community/gpt2", "v2")

    Raises:
        ValueError: not `hf:NAME`, `hf:ORG/NAME`, optionally with `@REVISION`.
    """
    if not is_hub_name(name):
        raise ValueError(f"{name!r} is not a Hugging Face Hub name: expected hf:NAME or hf:ORG/NAME[@REVISION]")
    repo_id, at, revision = name[len(PREFIX):].partition("@")
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id or (at and not revision.strip()):
        raise ValueError(f"{name!r}: expected hf:NAME or hf:ORG/NAME, optionally @REVISION (a branch, tag or commit), "
                         "with letters, digits, '-', '_' and '.' in the names")
    return repo_id, (revision if at else None)


def hub_cache_dir() -> Path:
    """`huggingface_hub`'s cache folder by its rules, read from the environment now:
    $HF_HUB_CACHE (or the older $HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expanduser(os.path.expandvars(cache)))


def offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) says to stay off the network."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def resolve_model_path(path: str | os.PathLike) -> Path:
    """`path` as a folder: itself, or the snapshot folder of an `hf:` name (`hub_folder`)."""
    return hub_folder(path) if is_hub_name(path) else Path(path)


def hub_folder(name: str, *, config_only: bool = False) -> Path:
    """The local snapshot folder of Hub model `name` (`hf:ORG/NAME[@REVISION]`): config.json,
    then (unless `config_only`) its safetensors weights and tokenizer files, from the cache or
    downloaded into it (module docstring).

    Raises:
        ValueError: a malformed name.
        HubError: huggingface_hub missing (HubNotInstalled); not in the cache while offline or the
            Hub unreachable; no such model or revision; a gated model; an architecture attnlab does
            not convert; no safetensors weights (pickle only). The message names the model.
    """
    repo_id, revision = parse_hub_name(name)
    folder = _snapshot(name, repo_id, revision, CONFIG_FILES)
    if not (folder / "config.json").is_file():
        raise HubError(f"{name}: the repository has no config.json at its top level; attnlab reads model repositories "
                       "with config.json and model.safetensors")
    _check_config(name, folder / "config.json")
    if config_only:
        return folder
    folder = _snapshot(name, repo_id, folder.name, MODEL_FILES)  # the same commit, however the branch moves
    if not (folder / SAFETENSORS).is_file() and not (folder / INDEX).is_file():
        pickled = [f for f in PICKLED if (folder / f).is_file()]
        found = f" (the cached snapshot holds {', '.join(pickled)})" if pickled else ""
        where = "" if offline() else " on the Hub"
        raise HubError(f"{name}: no {SAFETENSORS}{where}{found}; attnlab loads Hub weights from safetensors files "
                       "only, never from pickles (pytorch_model.bin): pick a repository or revision with safetensors "
                       "weights")
    return folder


def _check_config(name: str, config: Path) -> None:
    """An attnlab model (config.json with `arch`) or a Hugging Face architecture attnlab converts.

    Raises:
        HubError: neither, naming the model and the architectures attnlab converts.
    """
    from attnlab.interop.families import folder_architecture, supported_architectures

    data = read_json(config)
    if "arch" in data:  # saved by attnlab.save and uploaded
        return
    try:
        architecture = folder_architecture(data, f"{name} config.json")
    except ValueError as err:
        raise HubError(str(err)) from None
    if architecture not in supported_architectures():
        raise HubError(f"{name}: architecture {architecture!r} is not one attnlab converts "
                       f"({', '.join(supported_architectures())})")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as err:
        raise HubNotInstalled(f"Hub models (hf:NAME) are read through huggingface_hub, which is not installed: "
                              f"{INSTALL}") from err
    return huggingface_hub


def _snapshot(name: str, repo_id: str, revision: str | None, patterns: list[str]) -> Path:
    """`huggingface_hub.snapshot_download` of `patterns` into the cache (from it alone when
    offline), its errors told as one line naming `name` (`_explain`)."""
    hub = _hub()
    cache, local = hub_cache_dir(), offline()
    try:
        path = hub.snapshot_download(repo_id, revision=revision, cache_dir=str(cache), allow_patterns=patterns,
                                     local_files_only=local)
    except Exception as err:  # noqa: BLE001 -- huggingface_hub's classes are told apart in _explain
        message = _explain(name, repo_id, revision, err, cache, local)
        if message is None:
            raise
        raise HubError(message) from err
    return Path(path)


def _explain(name: str, repo_id: str, revision: str | None, err: Exception, cache: Path, local: bool) -> str | None:
    """The one-line message for one of huggingface_hub's errors, or None for any other error."""
    errors = _error_classes()
    kind = next((key for key, cls in errors.items() if cls is not None and isinstance(err, cls)), None)
    if kind == "gated":
        return (f"{name} is a gated model: accept its conditions on https://huggingface.co/{repo_id} and log in "
                "(`hf auth login`, or set HF_TOKEN)")
    if kind == "revision":
        return f"{name}: the Hub has no revision {revision!r} of {repo_id} (a branch, tag or commit hash)"
    if kind == "repository":
        return (f"{name}: no model {repo_id!r} on the Hugging Face Hub (a private one needs `hf auth login` or "
                "HF_TOKEN)")
    if kind == "local":
        return _not_cached(name, repo_id, revision, cache, local, err)
    if kind == "http":
        return f"{name}: the Hugging Face Hub refused the request ({_first_line(err)})"
    return None


def _not_cached(name: str, repo_id: str, revision: str | None, cache: Path, local: bool, err: Exception) -> str:
    """Why a name could not be found in the cache, and what to do: go online, or pick a cached revision."""
    why = ("HF_HUB_OFFLINE is set (unset it to download)" if local else
           f"the Hub could not be reached ({_first_line(err.__cause__ or err)})")
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    if not repo.is_dir():
        return f"{name} is not in the Hugging Face cache ({cache}) and {why}"
    refs = sorted(p.relative_to(repo / "refs").as_posix() for p in (repo / "refs").rglob("*") if p.is_file())
    cached = f"cached: {', '.join(refs)}" if refs else "no branch or tag cached"
    wanted = revision or "main"
    if not (repo / "refs" / wanted).is_file() and not (repo / "snapshots" / wanted).is_dir():
        return f"{name}: revision {wanted!r} is not in the Hugging Face cache ({repo}; {cached}) and {why}"
    return f"{name}: its cached snapshot in {repo} is missing files attnlab needs ({_first_line(err)}) and {why}"


def _error_classes() -> dict[str, type | None]:
    """huggingface_hub's error classes, most specific first (a gated repository is a
    RepositoryNotFoundError; an incomplete snapshot a LocalEntryNotFoundError)."""
    from huggingface_hub import errors

    return {name: getattr(errors, cls, None) for name, cls in (
        ("gated", "GatedRepoError"), ("revision", "RevisionNotFoundError"), ("repository", "RepositoryNotFoundError"),
        ("local", "LocalEntryNotFoundError"), ("http", "HfHubHTTPError"))}


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
