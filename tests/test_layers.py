"""No module imports a layer above its own (docs/concepts/architecture.md: dependencies flow one way).

Every module under attnlab/ is parsed with `ast`; each `attnlab.*` import it makes — at module
level or inside a function, absolute or relative — is checked against the table below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attnlab

PACKAGE = Path(attnlab.__file__).parent

# Bottom to top: a module may import its own layer and those below it, never one above.
# A top-level module (presets.py) is named by its stem, a package (nn/) by its folder.
LAYERS: list[set[str]] = [
    {"config", "io", "evaluation", "_version"},  # plain-data configs, attnlab's files, metrics, the version
    {"nn", "data", "tokenizers", "presets"},     # the parts, the corpora, the tokenizers, named configs
    {"models"},                                  # the parts composed; the builder
    {"decoding", "inspect", "interop"},          # what is done with a model (interop: save/load of folders too)
    {"training"},                                # the one loop
    {"parallel", "finetune", "labs"},            # on the loop; labs: exercises graded against all of the above
    {"cli"},                                     # the command line over the library
    {"__init__"},                                # attnlab/__init__.py, the public surface: may import everything
]
LAYER = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def _module_name(path: Path) -> str:
    """`attnlab/io/files.py` -> `attnlab.io.files`; a package's `__init__.py` -> the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    """Whether `attnlab.x.y` names a module or package of the source tree."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _layer(module: str) -> int:
    """The layer of `attnlab.x...`: the layer of its part `x`; `attnlab` itself is the top."""
    parts = module.split(".")
    return LAYER["__init__"] if len(parts) == 1 else LAYER[parts[1]]


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """The attnlab modules that `source`, a module of `package`, imports, with their line numbers.

    `from attnlab.io import files` and `from . import files` (in attnlab/io/) both give
    `attnlab.io.files`; `from attnlab import X` gives `attnlab.X` when that is a module and
    `attnlab` (the public surface) otherwise.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb level - 1 packages from this one
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if _exists(sub) else base))
    return sorted((line, module) for line, module in found if module.split(".")[0] == "attnlab")


def upward_imports() -> list[str]:
    """`file:line: module (layer a) imports target (layer b)` for every import with b > a."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        own = _layer(name)
        for line, target in imported_modules(path.read_text(), package):
            if _layer(target) > own:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} (layer {own}) "
                             f"imports {target} (layer {_layer(target)})")
    return wrong


def test_every_part_of_the_package_has_a_layer():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_file() and p.suffix == ".py") or (p / "__init__.py").is_file()}
    assert parts == set(LAYER)


def test_imports_are_found_and_resolved():
    source = ("import torch\n"
              "from attnlab.io import files\n"
              "from . import lock\n"
              "from .. import presets\n"
              "from ..models import build_model\n"
              "from attnlab import ModelConfig\n"
              "def later():\n"
              "    import attnlab.cli.main\n")
    assert imported_modules(source, "attnlab.io") == [
        (2, "attnlab.io.files"), (3, "attnlab.io.lock"), (4, "attnlab.presets"), (5, "attnlab.models"),
        (6, "attnlab"), (8, "attnlab.cli.main")]
    assert _module_name(PACKAGE / "io" / "files.py") == "attnlab.io.files"
    assert _module_name(PACKAGE / "io" / "__init__.py") == "attnlab.io"
    assert [_layer(m) for m in ("attnlab.io.files", "attnlab.models", "attnlab.cli.main", "attnlab")] == [0, 2, 6, 7]


def test_no_module_imports_a_layer_above_its_own():
    wrong = upward_imports()
    assert not wrong, "imports that run up the layers:\n" + "\n".join(wrong)
