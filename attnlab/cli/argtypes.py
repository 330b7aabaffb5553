"""argparse types shared by the command line and the example scripts: a bad value is refused
with a message naming the flag (argparse adds it), never silently read as a default."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1 (0 or a negative would silently mean "the default" in many places)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
