"""The configuration reference (docs/reference/config.md), written from the config dataclasses.

Three files a user writes are typed dataclasses: the run config of `attnlab train`
(attnlab.training.config.TrainConfig and its sections), the model (attnlab.config.ModelConfig and
its nested sections, with each attention kernel's options) and the `attnlab finetune` job
(attnlab.finetune.job.FinetuneJobConfig, with its recipe attnlab.finetune.runner.Recipe). For
every field the page gives its type (as the validator words it), its default, what values are
allowed and its description (the field's comment, or its entry in the class docstring).

Allowed values are asked of the validators themselves, not restated: each field is set to a value
no rule accepts (a nonsense string, a huge negative and a huge positive number) and the error the
config raises for that very field says what it expects (`one of auto, eager, ...`, `an integer
> 0`). The page therefore says what the code refuses, including registry keys added later.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import io
import json
import re
import tokenize
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from markdown_cells import cell, code

MISSING = dataclasses.MISSING


@dataclass
class Section:
    """One table: `cls`'s fields, reached at dotted `path` under a root built by `build`."""

    title: str
    cls: type
    path: str  # "" for the root's own fields
    build: Callable[[str, Any], Any]  # (dotted field, value) -> the root, validated (raises ConfigError)
    intro: str = ""
    anchor: str = ""
    skip: tuple[str, ...] = ()  # fields documented in another section (a subclass's inherited ones)


def _nest(dotted: str, value: Any, base: dict | None = None) -> dict:
    """`{"a": {"b": value}}` for "a.b", merged into a copy of `base`."""
    data = copy.deepcopy(base or {})
    *sections, name = dotted.split(".")
    node = data
    for key in sections:
        node = node.setdefault(key, {})
    node[name] = value
    return data


def _unwrap(tp: Any) -> Any:
    """`X` from `X | None`; anything else as it is."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1
    return args[0] if optional else tp


def _sentinels(tp: Any) -> list[Any]:
    """Values that no range or choice accepts, of the field's own type (so the type check passes
    and the value check speaks)."""
    tp = _unwrap(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is str:
        return ["\u2047not-a-value"]
    if tp is int:
        return [-10 ** 12, 10 ** 12]
    if tp is float:
        return [-1e300, 1e300]
    if origin is list and args and args[0] in (str, int):
        return [[v] for v in _sentinels(args[0])]
    if origin is tuple and args and args[0] is float:
        return [[-1e300] * len(args), [1e300] * len(args)]
    return []


def allowed(section: Section, name: str, tp: Any) -> str:
    """What the validators say field `name` accepts, or "" when they accept any value of its type."""
    from attnlab.config.validate import ConfigError

    path = f"{section.path}.{name}" if section.path else name
    said = []
    for value in _sentinels(tp):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                section.build(path, value)
        except ConfigError as err:
            # this field's own rule (or its items'), not a rule between fields that the value tripped
            own = re.fullmatch(re.escape(path) + r"(\[\d+\])?", err.path)
            rule = re.match(r"expected |.* is not one of ", err.problem)
            if own and rule:
                said.append(("each item: " if own.group(1) else "") + _expected(err.problem))
    return "; ".join(dict.fromkeys(s for s in said if s))


def _expected(problem: str) -> str:
    """The rule out of an error message: `'x' is not one of a, b` -> `one of a, b`;
    `expected an integer > 0, got -1` -> `an integer > 0`."""
    problem = re.sub(r",? got .*$", "", problem)
    m = re.match(r".*? is not one of (.*)$", problem)
    if m:
        return "one of " + ", ".join(code(v) for v in m.group(1).split(", "))
    return re.sub(r"^expected ", "", problem)


def describe_type(cls: type, name: str) -> str:
    from attnlab.config.validate import describe

    hint = typing.get_type_hints(cls)[name]
    return "a mapping" if hint is Any else describe(hint)  # kernel_options: the kernel's own, listed below


def default(f: dataclasses.Field) -> str:
    """The default as a config file would write it (JSON-like), or `required`."""
    if f.default is MISSING and f.default_factory is MISSING:
        return "required"
    value = f.default if f.default is not MISSING else f.default_factory()
    if dataclasses.is_dataclass(value):
        return "its section's defaults"
    if isinstance(value, tuple):
        value = list(value)
    return code(json.dumps(value))


def field_comments(cls: type) -> dict[str, str]:
    """`{field: comment}` from the class source: the comment lines right above a field (at the
    body's indentation) and the comment at the end of its line."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    trailing = {}  # line number (from 1) -> the comment ending it; tokenize skips `#` inside strings
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("class "))
    body = next((len(line) - len(line.lstrip()) for line in lines[first + 1:] if line.strip()), 4)
    names = {f.name for f in dataclasses.fields(cls)}
    comments: dict[str, str] = {}
    above: list[str] = []
    for number, line in enumerate(lines, 1):
        indent, text = len(line) - len(line.lstrip()), line.strip()
        field = re.match(r"(\w+)\s*:", text)
        if indent == body and text.startswith("#"):
            above.append(trailing.get(number, ""))
        elif indent == body and field and field.group(1) in names:
            own = trailing.get(number) if "#" in line else None
            comments[field.group(1)] = " ".join([*above, *([own] if own else [])])
            above = []
        elif text:
            above = []
    return {name: text for name, text in comments.items() if text}


def docstring_entries(cls: type) -> dict[str, str]:
    """`{field: text}` from the class docstring's `name: text` entries (`lr: the head's rate;`,
    `a / b: ...` for two fields, `pack (causal_lm): ...`): each runs to the next entry, a blank
    line or the end."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    names = [f.name for f in dataclasses.fields(cls)]
    one = r"(?:%s)" % "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    # an entry starts a line or follows `; `, `. `, `, ` (`, or `): names, an optional (note), a colon
    start = r"(?:^|(?<=[;.,]\s)|(?<=[;.,]\sor\s)|(?<=\n)\s*)"
    head = re.compile(start + r"`?(%s`?(?:\s*(?:/|,|and)\s*`?%s`?)*)(?:\s*\([^)]*\))?:\s" % (one, one))
    starts = [m for m in head.finditer(doc) if re.match(r"\s|$", doc[m.end() - 1:])]
    entries: dict[str, str] = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(doc)
        text = doc[m.end():end].split("\n\n")[0]
        text = " ".join(text.split()).rstrip(";")
        for name in re.findall(r"\w+", m.group(1)):
            if name in names and name not in entries:
                entries[name] = text
    return entries


def section_markdown(section: Section, linked: dict[type, str]) -> str:
    """The section's heading, intro, class docstring summary and field table."""
    cls = section.cls
    out = [f"### {section.title} {{#{section.anchor}}}", ""]
    if section.intro:
        out += [section.intro, ""]
    summary = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
    out += [f"`{cls.__module__}.{cls.__qualname__}`: " + cell(summary), ""]
    comments, entries = field_comments(cls), docstring_entries(cls)
    hints = typing.get_type_hints(cls)
    out += ["| field | type | default | allowed | description |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if not f.init or f.name in section.skip:
            continue
        dotted = f"{section.path}.{f.name}" if section.path else f.name
        sub = _unwrap(hints[f.name])
        if dataclasses.is_dataclass(sub) and sub in linked:
            default_text, rule = default(f), f"see [{sub.__name__}](#{linked[sub]})"
        else:
            default_text, rule = default(f), allowed(section, f.name, hints[f.name])
        text = " ".join(t for t in (entries.get(f.name, ""), comments.get(f.name, "")) if t)
        out.append(f"| {code(dotted)} | {cell(describe_type(cls, f.name))} | {default_text} | {rule} | {cell(text)} |")
    return "\n".join(out + [""])


def sections() -> list[tuple[str, str, list[Section]]]:
    """(heading, intro, sections) of the three config files, in the page's order."""
    from attnlab.config import ModelConfig
    from attnlab.config.model import AttentionConfig, MoEConfig, PositionConfig, RNNConfig
    from attnlab.finetune.job import FinetuneDataConfig, FinetuneJobConfig
    from attnlab.finetune.runner import Recipe
    from attnlab.nn.kernels import KERNELS
    from attnlab.training import config as tc

    def train(path: str, value: Any) -> Any:
        return tc.TrainConfig.from_dict(_nest(path, value))

    def model(path: str, value: Any, base: dict | None = None) -> Any:
        return ModelConfig.from_dict(_nest(path, value, base))

    job_base = {"model": "MODEL", "data": {"train": "train.csv", "valid": "valid.csv"}, "out_dir": "OUT"}

    def job(path: str, value: Any) -> Any:
        return FinetuneJobConfig.from_dict(_nest(path, value, job_base))

    model_fields = tuple(f.name for f in dataclasses.fields(ModelConfig))
    run = [Section("Run config", tc.TrainConfig, "", train, anchor="run"),
           Section("model", tc.TrainModelConfig, "model", train, anchor="run-model", skip=model_fields,
                   intro="Besides `preset` (a name from `attnlab model presets`, whose fields the others "
                         "override), every [model config](#model) field, written under `model.`; and these:"),
           Section("data", tc.DataConfig, "data", train, anchor="run-data"),
           Section("data.tokenizer", tc.TokenizerConfig, "data.tokenizer", train, anchor="run-data-tokenizer"),
           Section("optim", tc.OptimConfig, "optim", train, anchor="run-optim"),
           Section("schedule", tc.ScheduleConfig, "schedule", train, anchor="run-schedule"),
           Section("train", tc.RunConfig, "train", train, anchor="run-train"),
           Section("lora", tc.LoraConfig, "lora", train, anchor="run-lora",
                   intro="Optional; also `recipe.lora` of a fine-tuning job."),
           Section("parallel", tc.ParallelConfig, "parallel", train, anchor="run-parallel")]
    kernels = [Section(f"attention.kernel_options of `{name}`", kernel.Options, "attention.kernel_options",
                       lambda p, v, name=name: model(p, v, {"arch": "encoder", "attention": {"kernel": name}}),
                       anchor=f"kernel-{name.replace('_', '-')}")
               for name, kernel in KERNELS.items() if dataclasses.fields(kernel.Options)]
    models = [Section("Model config", ModelConfig, "", model, anchor="model"),
              Section("attention", AttentionConfig, "attention", model, anchor="model-attention"),
              *kernels,
              Section("position", PositionConfig, "position", model, anchor="model-position"),
              Section("rnn", RNNConfig, "rnn", model, anchor="model-rnn"),
              Section("moe", MoEConfig, "moe", model, anchor="model-moe")]
    jobs = [Section("Fine-tuning job", FinetuneJobConfig, "", job, anchor="finetune"),
            Section("data", FinetuneDataConfig, "data", job, anchor="finetune-data"),
            Section("recipe", Recipe, "recipe", job, anchor="finetune-recipe")]
    return [("The run config of `attnlab train`", "A YAML or JSON file, `attnlab train CONFIG`; any field can be "
             "overridden on the command line as `--SECTION.FIELD VALUE` (`--optim.lr 3e-4`).", run),
            ("The model config", "The `model` section of a run config, `attnlab.ModelConfig(...)` in Python and a "
             "saved model's `config.json`. Paths below are from the model's root: in a run config they sit under "
             "`model.` (`model.attention.kernel`).", models),
            ("The fine-tuning job of `attnlab finetune`", "A YAML or JSON file, `attnlab finetune CONFIG`.", jobs)]


def config_markdown() -> str:
    """The whole page body (below the page's own title and intro)."""
    groups = sections()
    linked = {s.cls: s.anchor for _, _, group in groups for s in group if s.path}
    out = []
    for heading, intro, group in groups:
        out += [f"## {heading}", "", intro, ""]
        out += [section_markdown(s, linked) for s in group]
    return "\n".join(out)
