"""The one set of config validators: every error names its dotted field and what is allowed.

    choice("attention.kernel", "flash", ("auto", "eager"))
    -> ConfigError: attention.kernel: 'flash' is not one of auto, eager

A config dataclass starts its `__post_init__` with `check_types(self, section)`: every field is
checked against its annotation (ints accepted for floats, lists for tuples, mappings built into
sub-configs with unknown keys refused), so no field needs a hand-written type check. The range
and choice checks below say what a type cannot (`positive`, `probability`, `choice`, ...); cross-
field rules raise `ConfigError(path, problem)` naming the field a user would change.

Paths are dotted from the class's own root: ModelConfig's fields are `vocab_size`,
`attention.kernel`; a class that sits at a fixed place writes it (`optim.lr`). A class built at
another place (ModelConfig as TrainConfig's `model`) declares `SECTION` (its own root, "" for
ModelConfig) and `sub_config` moves its errors there (`model.attention.kernel`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import types
import typing
from typing import Any, Iterable, Iterator


class ConfigError(ValueError):
    """A config value that is not allowed; `path` is its dotted field, `problem` what was wrong."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}" if path else problem)

    def __reduce__(self):  # two arguments: without this an unpickled error (a worker process's) fails
        return type(self), (self.path, self.problem)

    def moved(self, old_root: str, new_root: str) -> "ConfigError":
        """The same error with the leading `old_root` of its path replaced by `new_root`."""
        rest = self.path
        if old_root and (rest == old_root or rest.startswith(old_root + ".")):
            rest = rest[len(old_root):].lstrip(".")
        return type(self)(join(new_root, rest), self.problem)


class ConfigTypeError(ConfigError, TypeError):
    """A config value of the wrong type (a TypeError, and a ConfigError like every config error)."""


def join(section: str, name: str) -> str:
    """`join("optim", "lr") == "optim.lr"`; an empty side is left out."""
    return f"{section}.{name}" if section and name else section or name


# ---------------------------------------------------------------- values
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    """False for NaN, +-inf and an integer too large for a float (JSON reads 1e999 as inf, YAML
    `.nan`/`.inf`, and `--optim.lr NaN` parses to nan: each would train into a nan loss or fail
    late inside torch, so they are refused where the config is read)."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond a float's range
        return False


def choice(path: str, value: Any, allowed: Iterable[Any]) -> None:
    """Raises ConfigError unless `value` is one of `allowed`."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(path, f"{value!r} is not one of {', '.join(map(str, allowed))}")


def in_range(path: str, value: Any, low: float | None = None, high: float | None = None, *,
             low_open: bool = False, high_open: bool = False, integer: bool = False, optional: bool = False,
             what: str | None = None) -> None:
    """Raises ConfigError unless `value` is a number (an integer when `integer`) in the range.

    `low_open`/`high_open` exclude that end; None leaves a side unbounded; `optional` admits None.
    """
    if value is None and optional:
        return
    kind = what or ("an integer" if integer else "a number")
    if low is not None and high is not None:
        bound = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        bound = f"{'>' if low_open else '>='} {low}"
    elif high is not None:
        bound = f"{'<' if high_open else '<='} {high}"
    else:
        bound = ""
    expected = f"expected {kind}{' ' + bound if bound else ''}{' or null' if optional else ''}, got {value!r}"
    if not (_is_int(value) if integer else _is_number(value)):
        raise ConfigError(path, expected)
    if not integer and not _is_finite(value):  # NaN passes every comparison below
        raise ConfigError(path, f"expected a finite number, got {value!r}")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        raise ConfigError(path, expected)


def positive(path: str, value: Any, *, integer: bool = False, optional: bool = False) -> None:
    """A number (integer when `integer`) > 0; None too when `optional`."""
    in_range(path, value, 0, low_open=True, integer=integer, optional=optional)


def non_negative(path: str, value: Any, *, integer: bool = False, optional: bool = False) -> None:
    """A number (integer when `integer`) >= 0; None too when `optional`."""
    in_range(path, value, 0, integer=integer, optional=optional)


def probability(path: str, value: Any) -> None:
    """A number in [0, 1) (a dropout rate: 1 would drop everything)."""
    in_range(path, value, 0, 1, high_open=True, what="a probability")


def boolean(path: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigTypeError(path, f"expected true or false, got {value!r}")


def int_list(path: str, value: Any, *, low: int | None = None) -> list[int]:
    """A list (or tuple) of integers, each >= `low` when given; returns it as a list."""
    at_least = f" >= {low}" if low is not None else ""
    if not isinstance(value, (list, tuple)) or not all(
            _is_int(v) and (low is None or v >= low) for v in value):
        raise ConfigError(path, f"expected a list of integers{at_least}, got {value!r}")
    return list(value)


# ---------------------------------------------------------------- types from annotations
@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def describe(tp: Any) -> str:
    """What a value of annotation `tp` looks like in a config file (`a number or null`)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [describe(a) for a in args if a is not type(None)]
        return " or ".join(parts + (["null"] if type(None) in args else []))
    if origin is tuple:
        return f"a list of {len(args)} {_plural(args[0])}" if args and ... not in args else \
            f"a list of {_plural(args[0])}" if args else "a list"
    if origin is list:
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping of {tp.__name__} fields"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _plural(tp: Any) -> str:
    return {int: "integers", float: "numbers", bool: "booleans", str: "strings"}.get(tp, "values")


def convert(tp: Any, value: Any, path: str) -> Any:
    """`value` checked against annotation `tp`: an int becomes a float for a float field, a list a
    tuple for a tuple field, a mapping a sub-config for a dataclass field.

    Raises:
        ConfigTypeError: a value of another type, naming `path` and the expected type.
        ConfigError: a sub-config's own error (moved to `path`).
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return convert(option, value, path)
            except ConfigTypeError:
                continue
        raise ConfigTypeError(path, f"expected {describe(tp)}, got {value!r}")
    if origin in (tuple, list):
        return _sequence(tp, value, path)
    if dataclasses.is_dataclass(tp):
        return sub_config(tp, path, value)
    if tp is float:
        if not _is_number(value):
            raise ConfigTypeError(path, f"expected a number, got {value!r}")
        if not _is_finite(value):  # a ConfigError, not a type error: a union does not try its next type
            raise ConfigError(path, f"expected a finite number, got {value!r}")
        return float(value)
    if tp is int and not _is_int(value) or tp in (bool, str) and not isinstance(value, tp) \
            or (tp is dict or origin is dict) and not isinstance(value, dict):
        raise ConfigTypeError(path, f"expected {describe(tp)}, got {value!r}")
    return value


def _sequence(tp: Any, value: Any, path: str) -> Any:
    """`list[X]`, `tuple[X, ...]` or `tuple[X, Y]` from a list or tuple, each item converted."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    fixed = origin is tuple and args and ... not in args
    if not isinstance(value, (list, tuple)) or (fixed and len(value) != len(args)):
        raise ConfigTypeError(path, f"expected {describe(tp)}, got {value!r}")
    item_types = args if fixed else [args[0] if args else Any] * len(value)
    items = [convert(t, v, f"{path}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))]
    return tuple(items) if origin is tuple else items


def check_types(obj: Any, section: str = "") -> None:
    """Check (and normalise, see `convert`) every field of dataclass `obj` against its annotation.

    Call it first in `__post_init__`, so range checks after it see values of the right type.
    """
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, convert(hints[f.name], getattr(obj, f.name), join(section, f.name)))


def sub_config(cls: type, path: str, value: Any) -> Any:
    """A `cls` from a `cls` (kept) or a mapping of its fields (built and validated).

    Errors name the dotted field under `path`: an unknown key (`attention.heads: unknown attention
    field; allowed: ...`), a wrong type, or the sub-config's own check (moved from `cls.SECTION`,
    when the class declares it, to `path`).

    Raises:
        ConfigTypeError: `value` is neither a `cls` nor a mapping, or a field has the wrong type.
        ConfigError: an unknown key or a value the sub-config refuses.
    """
    if isinstance(value, cls):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and issubclass(cls, type(value)):
        value = dataclasses.asdict(value)  # a base config where a richer one is wanted (ModelConfig as a run's model)
    if not isinstance(value, dict):
        raise ConfigTypeError(path, f"expected {describe(cls)}, got {type(value).__name__} {value!r}")
    expand = getattr(cls, "expand_dict", None)
    with _errors_at(cls, path):
        data = expand(value) if expand is not None else value
    fields = [f for f in dataclasses.fields(cls) if f.init]
    known = [f.name for f in fields]
    unknown = [k for k in data if k not in known]
    if unknown:
        section = path.rsplit(".", 1)[-1] or cls.__name__
        allowed = f"allowed: {', '.join(sorted(known))}"
        if len(unknown) == 1:
            raise ConfigError(join(path, str(unknown[0])), f"unknown {section} field; {allowed}")
        raise ConfigError(path, f"unknown {section} fields {', '.join(join(path, str(k)) for k in unknown)}; {allowed}")
    missing = [f.name for f in fields if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(join(path, missing[0]), f"required, not given ({describe(_hints(cls)[missing[0]])})")
    with _errors_at(cls, path):
        return cls(**data)


@contextlib.contextmanager
def _errors_at(cls: type, path: str) -> Iterator[None]:
    """Move the errors of a class that declares its own root (`SECTION`) to where it is built."""
    root = getattr(cls, "SECTION", None)
    if root is None or root == path:
        yield
        return
    try:
        yield
    except ConfigError as err:
        raise err.moved(root, path) from None
    except ValueError as err:  # a check that words its own message: keep it whole, under `path`
        raise ConfigError(path, str(err)) from None
