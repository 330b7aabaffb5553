"""The API reference (docs/reference/api.md): mkdocstrings directives written from `attnlab.__all__`.

`import attnlab` exports its names lazily (attnlab/__init__.py `_LAZY`), which a static reader
such as griffe cannot follow; this resolves each exported name to the module that defines it and
writes one `::: module.name` directive per name, so a name added to `__all__` gets its entry.
An exported subpackage (`attnlab.training`, ...) gets its docstring and the members of its own
`__all__`; so do the other modules a user imports (MODULES).
"""

from __future__ import annotations

import importlib
import types

# modules users import besides the top level's exports (each documented with its `__all__`)
MODULES = ["attnlab.presets", "attnlab.tokenizers", "attnlab.evaluation"]


def _directive(path: str, members: list[str] | None = None, heading: int = 3) -> str:
    lines = [f"::: {path}", "    options:", f"      heading_level: {heading}"]
    if members is not None:
        lines += ["      members:", *(f"        - {m}" for m in members)]
    return "\n".join(lines)


def _module_members(module: types.ModuleType) -> list[str]:
    """The module's `__all__`, else its public functions and classes defined in it."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and isinstance(v, (type, types.FunctionType)) and v.__module__ == module.__name__]
    return sorted(names)


def api_markdown() -> str:
    """The whole page body (below the page's own title and intro)."""
    import attnlab

    objects, modules = [], []
    for name in sorted(attnlab.__all__, key=str.lower):
        value = getattr(attnlab, name)
        if isinstance(value, types.ModuleType):
            modules.append(value.__name__)
        else:
            objects.append(f"{value.__module__}.{value.__qualname__}")
    out = ["## `import attnlab`", "",
           "Every name below is reachable as `attnlab.NAME`; the heading shows where it is defined.", ""]
    out += [_directive(path) + "\n" for path in objects]
    for path in modules + [m for m in MODULES if m not in modules]:
        module = importlib.import_module(path)
        out += [f"## `{path}`", "", _directive(path, _module_members(module), heading=3), ""]
    return "\n".join(out)
