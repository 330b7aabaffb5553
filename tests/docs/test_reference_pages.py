"""The generated reference pages (docs/tools/*_page.py) against the code they describe.

The walks here are the tests' own (over the real argparse parsers and the config dataclasses),
not the generators', so a command, flag or field the generator drops is missed on the page.
"""

import argparse
import dataclasses
import json
import re
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = str(ROOT / "docs" / "tools")
sys.path.insert(0, TOOLS)  # the generators import their sibling markdown_cells
try:
    import cli_page  # noqa: E402
    import config_page  # noqa: E402
finally:
    sys.path.remove(TOOLS)  # the rest of the suite must not import from docs/tools by accident


def _sections(page: str) -> dict[str, str]:
    """{heading text: the text up to the next heading}."""
    parts = re.split(r"^#{2,4} (.+)$", page, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("attnlab",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


@pytest.fixture(scope="module")
def cli():
    from attnlab.cli.main import build_parser

    parser = build_parser()
    return parser, _sections(cli_page.cli_markdown(parser))


def test_cli_page_has_every_subcommand_flag_default_and_choice(cli):
    parser, sections = cli
    walked = list(_parsers(parser))
    assert len(walked) > 20  # attnlab, its 16 commands and their actions
    for path, sub in walked:
        title = " ".join(path)
        assert title in sections, f"no section for `{title}`"
        text = sections[title]
        if sub.epilog:
            assert sub.epilog.strip() in text, f"`{title}`: its example is missing"
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            names = action.option_strings or [action.metavar or action.dest]
            rows = [line for line in text.splitlines() if line.startswith("| ") and any(
                re.search(rf"`{re.escape(n)}[ `,]", line) for n in names)]
            assert rows, f"`{title}`: no row for {names}"
            row = rows[0]
            if action.help:
                assert " ".join(action.help.split())[:30].replace("|", "\\|") in row.replace("&lt;", "<").replace(
                    "&gt;", ">").replace("&amp;", "&").replace("\\[", "[").replace("\\]", "]"), \
                    f"`{title}` {names}: help missing"
            if action.default not in (None, argparse.SUPPRESS, False) and action.nargs != 0:
                assert str(action.default) in row, f"`{title}` {names}: default {action.default!r} missing"
            for value in action.choices or ():
                assert f"`{value}`" in row, f"`{title}` {names}: choice {value!r} missing"


def _fields(cls, prefix="", skip=()):
    """(dotted path, field) of `cls` and of the dataclasses nested in it, except types in `skip`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        yield path, f
        inner = [t for t in (typing.get_args(hints[f.name]) or (hints[f.name],)) if dataclasses.is_dataclass(t)]
        if inner and inner[0] not in skip:
            yield from _fields(inner[0], path + ".", skip)


def _default(f) -> str | None:
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "required"
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if dataclasses.is_dataclass(value):
        return None  # a section: its fields carry the defaults
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def _rows(text: str) -> dict[str, list[str]]:
    """{dotted field: its table row's cells} of the config tables in `text`."""
    return {m.group(1): [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in text.splitlines() if (m := re.match(r"\| `([\w.]+)` \|", line))}


@pytest.fixture(scope="module")
def config_groups():
    page = config_page.config_markdown()
    groups = re.split(r"^## (.+)$", page, flags=re.M)
    return {groups[i].strip(): groups[i + 1] for i in range(1, len(groups), 2)}


def test_config_page_has_every_field_with_its_default(config_groups):
    from attnlab.config import ModelConfig
    from attnlab.finetune.job import FinetuneJobConfig
    from attnlab.nn.kernels import KERNELS
    from attnlab.training.config import LoraConfig, TrainConfig, TrainModelConfig

    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    expected = {  # group heading -> the fields it must list
        "The run config of `attnlab train`": [
            (p, f) for p, f in _fields(TrainConfig, skip=(TrainModelConfig,))] + [
            (f"model.{f.name}", f) for f in dataclasses.fields(TrainModelConfig) if f.name not in model_fields],
        "The model config": list(_fields(ModelConfig)),
        "The fine-tuning job of `attnlab finetune`": list(_fields(FinetuneJobConfig, skip=(LoraConfig,))),
    }
    for group, fields in expected.items():
        assert group in config_groups, f"no group {group!r}"
        rows = _rows(config_groups[group])
        assert len(fields) > 5
        for path, f in fields:
            assert path in rows, f"{group}: field {path} missing"
            default = _default(f)
            if default is not None:
                assert rows[path][2] in (f"`{default}`", default), f"{group}: {path}: default {default} != {rows[path]}"
    # each kernel's options in its own table
    kernels = _sections(config_groups["The model config"])
    for name, kernel in KERNELS.items():
        if not dataclasses.fields(kernel.Options):
            continue
        title = next((t for t in kernels if t.startswith(f"attention.kernel_options of `{name}`")), None)
        assert title, f"no table for kernel {name}'s options"
        rows = _rows(kernels[title])
        for f in dataclasses.fields(kernel.Options):
            assert rows[f"attention.kernel_options.{f.name}"][2] == f"`{_default(f)}`", f"{name}: {f.name}"


def test_config_page_states_allowed_values_from_the_validators(config_groups):
    from attnlab.nn.kernels import KERNELS

    rows = _rows(config_groups["The model config"])
    for name in KERNELS:  # every registry key, as the validator lists them
        assert f"`{name}`" in rows["attention.kernel"][3]
    assert rows["d_model"][3] == "an integer > 0"
    assert rows["dropout"][3] == "a probability in [0, 1)"
    run = _rows(config_groups["The run config of `attnlab train`"])
    assert run["optim.lr"][3] == "a number > 0" and "`cosine`" in run["schedule.name"][3]
