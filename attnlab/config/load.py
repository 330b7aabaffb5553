"""The one config loader: files (JSON/YAML), dotted overrides, and plain data <-> config dataclasses.

    cfg = load_config(TrainConfig, "examples/shakespeare_char.yaml", ["optim.lr=3e-4", "model.num_layers=4"])
    cfg = from_dict(ModelConfig, to_dict(cfg.model))        # every config dataclass round-trips

Unknown keys anywhere are errors naming their dotted path (`optim.lrr: unknown optim field;
allowed: ...`); wrong types and values out of range likewise (see attnlab.config.validate).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import json.decoder
import json.scanner
import os
from typing import Any, Iterable, TypeVar

from attnlab.config.validate import sub_config

T = TypeVar("T")


def from_dict(cls: type[T], data: Any) -> T:
    """A validated `cls` from plain data (nested mappings for sub-configs).

    Raises:
        ConfigError (a ValueError): an unknown key or a value out of range, naming the dotted field.
        ConfigTypeError (a TypeError and a ConfigError): a value of the wrong type, named likewise.
    """
    return sub_config(cls, "", data)


def to_dict(config: Any) -> dict[str, Any]:
    """Plain data (dicts, lists, numbers, strings) of a config dataclass, as JSON writes it."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `changes` applied; nested mappings are merged key by key."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ---------------------------------------------------------------- files
def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML (`.yaml`/`.yml`, needs pyyaml) or JSON config file into plain data.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unparseable content, a key given twice in one mapping (the file and line named),
            not a mapping at the top level, or a YAML file without pyyaml.
    """
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: reading YAML needs pyyaml (pip install pyyaml), or write the config as JSON") from None
        try:
            data = yaml.load(text, Loader=_unique_key_yaml_loader(yaml, path))
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not valid YAML ({err})") from None
    else:
        try:
            data = _UniqueKeyJSONDecoder(path).decode(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    if data is None:
        raise ValueError(f"{path}: the file is empty; expected a run config (sections such as model:, data:, train:)")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _duplicate_key(path: str, key: Any, line: int, first: int) -> ValueError:
    return ValueError(f"{path}, line {line}: key {key!r} is given twice in the same mapping (first at line {first}); "
                      "the second would silently replace the first: keep one")


def _unique_key_yaml_loader(yaml: Any, path: str) -> type:
    """PyYAML's safe loader, refusing a key given twice in one mapping (it keeps the last silently).
    A merge key (`<<: *defaults`) may still be overridden by the mapping's own keys."""

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: the base class says so
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _duplicate_key(path, key, key_node.start_mark.line + 1, first)
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


class _UniqueKeyJSONDecoder(json.JSONDecoder):
    """json's decoder, refusing a key given twice in one object (json keeps the last silently).
    It runs json's pure-Python scanner, whose object parser can be wrapped (config files are small)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.parse_object = self._object
        self.scan_once = json.scanner.py_make_scanner(self)

    def _object(self, s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        pairs, end = json.decoder.JSONObject(s_and_end, strict, scan_once, None, list, memo)
        keys = [key for key, _ in pairs]
        if len(set(keys)) < len(keys):
            text, start = s_and_end
            lines = self._key_lines(text, start, scan_once)
            seen: dict[str, int] = {}
            for key, line in zip(keys, lines):
                if key in seen:
                    raise _duplicate_key(self.path, key, line, seen[key])
                seen[key] = line
        return dict(pairs), end

    @staticmethod
    def _key_lines(text: str, pos: int, scan_once) -> list[int]:
        """The line of each key of the object that opens just before `pos` (already known to parse)."""
        lines, ws = [], " \t\n\r"
        while True:
            while text[pos] in ws:
                pos += 1
            if text[pos] == "}":
                return lines
            lines.append(text.count("\n", 0, pos) + 1)
            _, pos = json.decoder.scanstring(text, pos + 1, True)
            while text[pos] in ws + ":":
                pos += 1
            _, pos = scan_once(text, pos)
            while text[pos] in ws + ",":
                pos += 1


# ---------------------------------------------------------------- overrides
def parse_value(raw: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false/null, lists), else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_override(item: str) -> tuple[str, Any]:
    """`"optim.lr=3e-4"` -> `("optim.lr", 0.0003)` (the value parsed by `parse_value`).

    Raises:
        ValueError: no `=`, or an empty key.
    """
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {item!r}: expected KEY=VALUE with a dotted key, e.g. optim.lr=3e-4")
    return key.strip(), parse_value(raw)


def apply_overrides(data: dict[str, Any], overrides: Iterable[tuple[str, Any] | str]) -> dict[str, Any]:
    """Set dotted keys (`model.num_layers`, `optim.lr`) in a copy of plain config data.

    Each override is a `(key, value)` pair or a `"key=value"` string. A missing section is created;
    whether a key exists is the config class's check (`from_dict`), which names its dotted path.

    Raises:
        ValueError: an empty part in a key, or a key that goes through a value that is not a section.
    """
    out = copy.deepcopy(data)
    for override in overrides:
        key, value = parse_override(override) if isinstance(override, str) else override
        parts = key.split(".")
        if not all(parts):
            raise ValueError(f"override {key!r}: expected a dotted key such as optim.lr or model.position.scheme")
        target = out
        for i, part in enumerate(parts[:-1]):
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"override {key!r}: {'.'.join(parts[:i + 1])} is a value "
                                 f"({nxt!r}), not a section with fields")
            target = nxt
        target[parts[-1]] = value
    return out


def load_config(cls: type[T], path: str | os.PathLike, overrides: Iterable[tuple[str, Any] | str] = ()) -> T:
    """Read `path`, apply dotted `overrides`, build and validate a `cls` (see `from_dict`)."""
    return from_dict(cls, apply_overrides(load_config_file(path), overrides))
