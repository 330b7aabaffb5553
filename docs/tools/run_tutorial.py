"""Execute one tutorial: docs/tutorials/NN-name.py (jupytext percent format) -> NN-name.ipynb.

    python docs/tools/run_tutorial.py docs/tutorials/02-attention.py docs/tutorials/02-attention.ipynb

(`make tutorials` runs it for every tutorial whose .py is newer than its .ipynb.) The notebook
runs top to bottom in a fresh Jupyter kernel (`--kernel`, default `attnlab`: the kernel `make
docs` registers in .venv) with the repository root as its working folder. The site shows the
executed notebook as it was saved (mkdocs-jupyter, execute: false).

Fails (exit 1, nothing written, an earlier run's notebook removed) when a cell raises (naming
the notebook, the cell and the error) or when the whole notebook takes longer than `--timeout`
seconds (600). On success it prints the
wall time and records it, with /proc/loadavg, in `--timings` (docs/tutorials/timings.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class NotebookError(Exception):
    """A tutorial that failed: its message names the notebook, the cell and the error."""


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:  # not Linux
        return "unknown"


def _atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _failed_cell(nb) -> tuple[int, str, str]:
    """(number among the code cells, from 1; its source; `ename: evalue`) of the cell whose output
    holds the error."""
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code_cells, 1):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return i, cell.source, f"{out.get('ename')}: {out.get('evalue')}"
    return 0, "", ""


def execute(source: Path, kernel: str, timeout: float):
    """The executed notebook of `source`. Raises NotebookError on a cell error or the timeout."""
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = jupytext.read(source)
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    deadline = time.monotonic() + timeout
    # nbclient's timeout is per cell: give each cell what is left of the notebook's budget
    client = NotebookClient(nb, kernel_name=kernel, resources={"metadata": {"path": str(ROOT)}},
                            timeout_func=lambda cell: max(1, int(deadline - time.monotonic())))
    name = source.name
    try:
        client.execute()
    except CellTimeoutError as err:  # its message quotes the cell that was running
        raise NotebookError(f"{name}: over the {timeout:g} s limit for a notebook; make it faster (smaller data, "
                            f"fewer steps)\n{err}") from None
    except CellExecutionError:
        number, cell_source, error = _failed_cell(nb)
        raise NotebookError(f"{name}: code cell {number} failed with {error}\n--- the cell:\n{cell_source}") from None
    return nb


def record(timings: Path, name: str, seconds: float) -> None:
    """Add `name`'s wall time (and the machine's load) to the timings file, atomically."""
    data = {}
    if timings.exists():
        try:
            data = json.loads(timings.read_text())
        except ValueError:
            data = {}  # a damaged file is rebuilt from this run on
    data[name] = {"seconds": round(seconds, 1), "loadavg": _loadavg(),
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _atomic_write(timings, json.dumps(data, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="docs/tutorials/NN-name.py")
    parser.add_argument("output", type=Path, help="the executed notebook, NN-name.ipynb")
    parser.add_argument("--kernel", default="attnlab", help="Jupyter kernel name (default: attnlab)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the whole notebook (600)")
    parser.add_argument("--timings", type=Path, default=None, help="JSON file of wall times to update")
    args = parser.parse_args(argv)
    import nbformat

    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend puts the plots in the notebook
    start = time.monotonic()
    try:
        nb = execute(args.source, args.kernel, args.timeout)
    except NotebookError as err:
        print(f"tutorial failed: {err}", file=sys.stderr)
        args.output.unlink(missing_ok=True)  # an earlier run's notebook no longer shows this source
        return 1
    seconds = time.monotonic() - start
    _atomic_write(args.output, nbformat.writes(nb))
    if args.timings is not None:
        record(args.timings, args.source.stem, seconds)
    print(f"tutorial {args.source.stem}: {seconds:.1f} s (load {_loadavg()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
