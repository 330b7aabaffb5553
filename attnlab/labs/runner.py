"""Start, check and use labs in a student's folder.

    start("sdpa", "labs")        writes labs/sdpa.py, the stub (never over an edited file unless force)
    check("sdpa", "labs")        imports labs/sdpa.py and runs the lab's checks: a `Report`
    use("labs")                  registers every passing piece that has a seam (`lab-sdpa`, ...)

The student's file is imported from its path under a private module name, so a folder called
`labs` never shadows anything, and a second `check` after an edit sees the edit.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from attnlab.io.files import atomic_write_text
from attnlab.labs.base import CheckFailed, Lab, LabError
from attnlab.labs.registry import LABS, get_lab

DEFAULT_DIR = "labs"


@dataclass(frozen=True)
class Result:
    """One check's outcome: `detail` says what was expected and what came (empty on a pass)."""

    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        return f"  {'PASS' if self.passed else 'FAIL'}  {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Report:
    """The checks of one lab on one file."""

    lab: Lab
    path: Path
    results: tuple[Result, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def text(self) -> str:
        """One line per check, then a summary line."""
        n = sum(r.passed for r in self.results)
        verdict = "all pass" if self.passed else f"{len(self.results) - n} failing"
        return "\n".join([f"lab {self.lab.name} ({self.path}):", *(r.line() for r in self.results),
                          f"{n}/{len(self.results)} checks pass: {verdict}"])


def lab_path(lab: Lab, folder: str | Path = DEFAULT_DIR) -> Path:
    return Path(folder) / lab.filename


def start(name: str, folder: str | Path = DEFAULT_DIR, *, force: bool = False) -> Path:
    """Write the stub of lab `name` into `folder` (created if needed); returns its path.

    Raises:
        LabError: an unknown lab, or a file already there that differs from the stub (the
            student's work) without `force`.
    """
    lab = get_lab(name)
    path = lab_path(lab, folder)
    if path.exists() and not force and path.read_text(encoding="utf-8") != lab.stub:
        raise LabError(f"{path} is already started (it differs from the stub); pass --force to overwrite it "
                       "with a fresh stub")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, lab.stub)
    return path


def load_module(path: Path) -> ModuleType:
    """Import the student's file from its path.

    Raises:
        LabError: no such file (run `attnlab lab start` first), a syntax error (file and line),
            or an error while importing it (the error, and where in the file).
    """
    if not path.is_file():
        lab = next((lab.name for lab in LABS.values() if lab.filename == path.name), "NAME")
        raise LabError(f"{path} does not exist; run `attnlab lab start {lab} --dir {path.parent}` first")
    name = f"_attnlab_lab_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        source = path.read_text(encoding="utf-8")
        code = compile(source, str(path), "exec")
    except SyntaxError as err:
        raise LabError(f"{path}:{err.lineno}: syntax error: {err.msg}") from None
    sys.modules[name] = module  # dataclasses and pickling look their module up
    try:
        exec(code, module.__dict__)
    except Exception as err:
        sys.modules.pop(name, None)
        raise LabError(f"{path}: importing it raised {_describe(err, path)}") from None
    return module


def _describe(err: BaseException, path: Path) -> str:
    """`Type: message (at FILE:LINE)`, the line being the last one of the student's file in the
    traceback (none when the error arose before reaching it)."""
    lines = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path]
    where = f" (at {path.name}:{lines[-1].lineno}: {lines[-1].line})" if lines else ""
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}{': ' + message if message else ''}{where}"


def run_checks(lab: Lab, module: ModuleType, path: Path) -> tuple[Result, ...]:
    """Each of the lab's checks on the student's module; a failure never stops the others."""
    results, unwritten = [], set()
    for check in lab.checks:
        try:
            check.run(module)
        except CheckFailed as err:
            results.append(Result(check.name, False, str(err)))
        except NotImplementedError as err:
            where = _where(err, path)
            detail = (f"not written yet: raised NotImplementedError{where} (replace the stub's "
                      "`raise NotImplementedError`)" if where not in unwritten else "not written yet (as above)")
            unwritten.add(where)
            results.append(Result(check.name, False, detail))
        except Exception as err:
            results.append(Result(check.name, False, f"raised {_describe(err, path)}"))
        else:
            results.append(Result(check.name, True))
    return tuple(results)


def _where(err: BaseException, path: Path) -> str:
    lines = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path]
    return f" in {lines[-1].name}() at {path.name}:{lines[-1].lineno}" if lines else ""


def check(name: str, folder: str | Path = DEFAULT_DIR, *, path: str | Path | None = None) -> Report:
    """Run lab `name`'s checks on the student's file (`folder`/its filename, or `path`).

    Raises:
        LabError: unknown lab, missing file, a file that does not import.
    """
    lab = get_lab(name)
    file = Path(path) if path is not None else lab_path(lab, folder)
    return Report(lab, file, run_checks(lab, load_module(file), file))


def state(lab: Lab, folder: str | Path = DEFAULT_DIR) -> str:
    """`not started` (no file), `started` (the stub, edited or not, not passing yet) or `passing`."""
    path = lab_path(lab, folder)
    if not path.is_file():
        return "not started"
    if path.read_text(encoding="utf-8") == lab.stub:
        return "started"
    try:
        return "passing" if check(lab.name, folder).passed else "started"
    except LabError:
        return "started (does not import)"


# ---- plugging passing pieces into attnlab's registries ----------------------------------------

def use(folder: str | Path = DEFAULT_DIR) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Register every passing lab piece of `folder` that has a seam, under its lab name
    (`lab-sdpa` as `attention.kernel`, `lab-rotary` as `position.scheme`), so a config can pick
    it and a model saved with it loads again.

    Returns:
        (registered: lab name -> the config settings it made available,
         skipped: lab name -> why it was not registered (its file fails a check or does not
         import)). Labs without a file in the folder are neither.

    Raises:
        LabError: `folder` is not a folder.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise LabError(f"lab folder {folder} does not exist (expected the folder `attnlab lab start` wrote to)")
    registered, skipped = {}, {}
    for lab in LABS.values():
        if lab.plug is None or not lab_path(lab, folder).is_file():
            continue
        path = lab_path(lab, folder)
        try:
            module = load_module(path)
        except LabError as err:
            skipped[lab.name] = str(err)
            continue
        failing = [r.name for r in run_checks(lab, module, path) if not r.passed]
        if failing:
            skipped[lab.name] = (f"{len(failing)} check(s) fail ({', '.join(failing)}); "
                                 f"see `attnlab lab check {lab.name}`")
            continue
        registered[lab.name] = lab.plug(module)
    return registered, skipped


def forget() -> None:
    """Unregister every lab piece (those `use` registered, and any plugged by hand)."""
    for lab in LABS.values():
        if lab.unplug is not None:
            lab.unplug()
