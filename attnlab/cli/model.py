"""`attnlab model`: look at model configurations without training anything."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from attnlab import presets
from attnlab.config import ModelConfig


def _file_config(path: Path) -> dict:
    """The model config (validated, as plain data) of a config.json, of a model folder or of an
    `attnlab train` run folder (its config.json's `model` section).

    Raises:
        ValueError: not a model config (the message names the file).
    """
    from attnlab.io.files import read_json

    file = path / "config.json" if path.is_dir() else path
    data = read_json(file)
    if "arch" not in data and isinstance(data.get("model"), dict):  # an `attnlab train` run's config.json
        data = data["model"]
    try:
        return ModelConfig.from_dict(data).to_dict()
    except ValueError as err:  # ConfigError and ConfigTypeError
        raise ValueError(f"{file}: not an attnlab model config: {err}") from None


def resolve_config(name_or_path: str, overrides: list[str]) -> ModelConfig:
    """A preset name, a config.json path, or a model or run folder, with `key=value` overrides
    (values parsed as JSON; dotted keys reach sub-configs, e.g. position.scheme=rotary)."""
    if os.path.exists(name_or_path):
        data = _file_config(Path(name_or_path))
    elif "/" in name_or_path or name_or_path.endswith(".json"):  # meant as a path, not a preset name
        raise FileNotFoundError(f"{name_or_path} does not exist (expected a preset name, a config.json, or a model "
                                "or run folder)")
    else:
        data = presets.get(name_or_path).to_dict()
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, leaf = key.split(".")
        target = data
        for p in parents:
            if not isinstance(target.get(p), dict):
                raise ValueError(f"--set {key}: {p!r} is not a sub-config")
            target = target[p]
        target[leaf] = value
    return ModelConfig.from_dict(data)


def parameter_table(config: ModelConfig) -> list[tuple[str, int]]:
    """(top-level module, parameters) rows, counted on the meta device; shared tensors once."""
    from attnlab.inspect.cost import parameter_counts

    rows: dict[str, int] = {}
    for name, n in parameter_counts(config).items():
        parts = name.split(".")
        group = ".".join(parts[:2]) if parts[0] in ("encoder", "decoder") else parts[0]
        rows[group] = rows.get(group, 0) + n
    return list(rows.items())


def _info(args: argparse.Namespace) -> int:
    cfg = resolve_config(args.config, args.set)
    print(cfg.to_json())
    rows = parameter_table(cfg)
    width = max(len(n) for n, _ in rows)
    for name, n in rows:
        print(f"{name:<{width}}  {n:>14,}")
    print(f"{'total':<{width}}  {sum(n for _, n in rows):>14,}")
    return 0


def _presets(args: argparse.Namespace) -> int:
    for name in presets.names():
        cfg = presets.get(name)
        total = sum(n for _, n in parameter_table(cfg))
        print(f"{name:<22} {cfg.arch:<16} L={cfg.num_layers:<3} d={cfg.d_model:<5} h={cfg.num_heads:<3} "
              f"{total:>14,} parameters")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="inspect model configurations and presets",
                                   description="Inspect model configurations and presets.",
                                   epilog="example: attnlab model info gpt2-small; attnlab model presets")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="print a resolved config and its parameter count",
                          epilog="example: attnlab model info gpt2-small --set position.scheme=rotary")
    info.add_argument("config", help="a preset name, a config.json path, or a model or run folder")
    info.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a field (repeatable; dotted keys for sub-configs)")
    info.set_defaults(func=_info)
    listing = sub.add_parser("presets", help="list the named presets with their sizes",
                             epilog="example: attnlab model presets")
    listing.set_defaults(func=_presets)
