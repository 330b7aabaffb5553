"""What a lab is: a stub the student fills in, the checks that grade it, and (for a piece that
has a seam) how a passing piece plugs into attnlab's registries.

A check is a function of the student's module that returns quietly when the property holds and
raises `CheckFailed` with what was expected and what came otherwise. The runner
(`attnlab.labs.runner`) turns any other exception into one readable line: NotImplementedError
(the untouched stub), a missing function, or the error with the student's file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import torch
from torch import Tensor


class LabError(ValueError):
    """A user's mistake with the labs (unknown name, no file yet, a file that does not import)."""


class CheckFailed(Exception):
    """A property of the student's piece that does not hold; the message says what was expected
    and what came."""


@dataclass(frozen=True)
class Check:
    """One property: `name` (what is checked, a few words) and `run(module)`."""

    name: str
    run: Callable[[ModuleType], None]


@dataclass(frozen=True)
class Lab:
    """One exercise.

    Attributes:
        name: what `attnlab lab start NAME` takes.
        filename: the student's file in their labs folder.
        writes: what the student writes (a phrase).
        lecture: the lecture it belongs to (LECTURES.md's sections).
        stub: the file `start` writes: signature, contract, hints, `raise NotImplementedError`.
        solution: a file that passes, wrapping attnlab's own implementation (the tests check it).
        checks: the properties `check` runs, in order.
        plug: registers a passing piece (the student's module) where attnlab picks variants by
            name and returns the names it registered; None for a lab without a seam.
        unplug: undoes `plug`.
    """

    name: str
    filename: str
    writes: str
    lecture: str
    stub: str
    solution: str
    checks: tuple[Check, ...]
    plug: Callable[[ModuleType], list[str]] | None = None
    unplug: Callable[[], None] | None = None


def need(module: ModuleType, name: str) -> Callable[..., Any]:
    """The function (or class) `name` of the student's module, or CheckFailed naming it."""
    fn = getattr(module, name, None)
    if not callable(fn):
        raise CheckFailed(f"the file defines no `{name}` (keep the name and signature of the stub)")
    return fn


def close(got: Any, expected: Tensor, what: str, *, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """CheckFailed unless `got` is a tensor of `expected`'s shape and values (within tolerance)."""
    if not isinstance(got, Tensor):
        raise CheckFailed(f"{what}: expected a tensor of shape {tuple(expected.shape)}, got {type(got).__name__}")
    if got.shape != expected.shape:
        raise CheckFailed(f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}")
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        raise CheckFailed(f"{what}: NaN at {_first(torch.isnan(got))}, expected finite numbers")
    diff = (got.detach().float() - expected.detach().float()).abs()
    bad = diff > atol + rtol * expected.detach().float().abs()
    if bad.any():
        at = _first(bad)
        raise CheckFailed(f"{what}: at index {at} expected {expected[at].item():.6g}, got {got[at].item():.6g} "
                          f"(largest difference {diff.max().item():.3g})")


def _first(flags: Tensor) -> tuple[int, ...]:
    """The index of the first True of a bool tensor."""
    return tuple(int(i) for i in flags.nonzero()[0])
