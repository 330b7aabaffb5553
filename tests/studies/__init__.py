"""Tests of the studies under examples/studies/ (each a run.py script, loaded here as a module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

STUDIES = Path(__file__).resolve().parents[2] / "examples" / "studies"


def load_study(name: str) -> ModuleType:
    """examples/studies/<name>/run.py as a module (`name` also names its folder)."""
    spec = importlib.util.spec_from_file_location(f"{name}_study", STUDIES / name / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
