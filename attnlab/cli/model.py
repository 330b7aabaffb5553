"""`attnlab model`: look at model configurations without training anything."""

from __future__ import annotations

import argparse
import json
import os

from attnlab import ModelConfig, presets
from attnlab.inspect.cost import parameter_counts


def resolve_config(name_or_path: str, overrides: list[str]) -> ModelConfig:
    """A preset name or a config.json path, with `key=value` overrides (values parsed as JSON;
    dotted keys reach sub-configs, e.g. position.scheme=rotary)."""
    if os.path.exists(name_or_path):
        data = ModelConfig.from_json(name_or_path).to_dict()
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
                                   description="Inspect model configurations and presets.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="print a resolved config and its parameter count",
                          epilog="example: attnlab model info gpt2-small --set position.scheme=rotary")
    info.add_argument("config", help="a preset name or a config.json path")
    info.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a field (repeatable; dotted keys for sub-configs)")
    info.set_defaults(func=_info)
    listing = sub.add_parser("presets", help="list the named presets with their sizes",
                             epilog="example: attnlab model presets")
    listing.set_defaults(func=_presets)
