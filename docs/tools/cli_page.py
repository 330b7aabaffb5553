"""The command-line reference (docs/reference/cli.md), written from the real argparse parsers.

`attnlab.cli.main.build_parser()` builds every subcommand's full parser; this walks it (and the
sub-subcommands of `data`, `inspect`, `model`, `parallel`, `tokenizer`) and writes, for each
command, what `--help` says: usage, description, example (epilog), and a table of every argument
with its help, default and choices. Generated at build time (docs/tools/hooks.py), so a flag
added to the code is on the page the next time the site is built.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from markdown_cells import cell, code, text_block


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("attnlab",)
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """(command path, its parser, its one-line help) for `parser` and every parser below it, in
    the order `--help` lists them."""
    yield path, parser, None
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias: the same parser under another name
                    continue
                seen.add(id(sub))
                for sub_path, sub_parser, sub_help in commands(sub, path + (name,)):
                    yield sub_path, sub_parser, sub_help if sub_path != path + (name,) else helps.get(name)


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's arguments as `--help` shows them (no subcommand selector, no hidden ones)."""
    return [a for a in parser._actions
            if not isinstance(a, argparse._SubParsersAction) and a.help != argparse.SUPPRESS]


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The action's help with `%(default)s`-style fields filled in, as argparse prints it."""
    if not action.help:
        return ""
    return parser._get_formatter()._expand_help(action)


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.default == argparse.SUPPRESS:
        return ""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return code(action.default)  # a switch: the value without it
    if action.default is None:
        return ""
    return code(repr(action.default) if isinstance(action.default, str) else action.default)


def _name(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """`--top-k K` / `-k K` for an option, `CONFIG` for a positional (as usage writes them)."""
    formatter = parser._get_formatter()
    if not action.option_strings:
        return formatter._get_default_metavar_for_positional(action) if action.metavar is None else \
            formatter._metavar_formatter(action, action.dest)(1)[0]
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    args = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
    return ", ".join(f"{option} {args}" for option in action.option_strings)


def command_section(path: tuple[str, ...], parser: argparse.ArgumentParser, summary: str | None) -> str:
    """One command's section: heading, summary, usage, description, example, arguments."""
    level = "#" * min(len(path) + 1, 4)  # attnlab: ##, attnlab train: ###, attnlab data fetch: ####
    out = [f"{level} {' '.join(path)}", ""]
    if summary:
        out += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    out += [text_block(parser.format_usage().strip()), ""]
    for text in (parser.description, parser.epilog):  # verbatim, wrapped (docs/assets/stylesheets/extra.css)
        if text:
            out += ['<div class="cli-help" markdown>', "", text_block(text), "", "</div>", ""]
    rows = [(_name(parser, a), _help(parser, a), _default(a),
             ", ".join(code(c) for c in a.choices) if a.choices else "") for a in arguments(parser)]
    if rows:
        out += ["| argument | what it does | default | choices |", "|---|---|---|---|"]
        out += [f"| {code(n)} | {cell(h)} | {d} | {c} |" for n, h, d, c in rows]
        out.append("")
    return "\n".join(out)


def cli_markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page body (below the page's own title and intro)."""
    if parser is None:
        from attnlab.cli.main import build_parser

        parser = build_parser()  # every subcommand's full parser
    found = list(commands(parser))
    index = [f"- [`{' '.join(p)}`](#{'-'.join(p)}){': ' + h if h else ''}" for p, _, h in found[1:]]
    return "\n".join(["## Commands", "", *index, "", *(command_section(*c) for c in found)])
