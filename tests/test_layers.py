"""The package's layers (DESIGN.md section 1; `pagedattn/__init__.py`): each module imports only
its own layer and the layers below it, and no chain of imports comes back to where it started.

Every import statement counts, wherever it stands: module level, inside a function (lazy), or
under `if TYPE_CHECKING:`, and so does `importlib.import_module("pagedattn...")` with a literal.
Importing a submodule also runs its parent packages' `__init__`; that implicit step is not an
edge here (a package's `__init__` importing its own children is how packages work), but an
explicit import of a package (`from ..cache import X`) is an edge to its `__init__`.

Layers: 0 `errors`, `env`, `fp8`; 1 `cache`; 2 `operands`; 3 `ops`; 4 `compat`, `demo`, `cli`,
`__main__`, `models`, `engine`, `testing` and the package's namespace (`pagedattn/__init__.py`).
`testing` (assert_close and random paged caches for the tests, benchmarks and the demo) sits in
layer 4: it builds caches (layer 1) and nothing below layer 4 may depend on test utilities.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = "pagedattn"

LAYERS = {
    "errors": 0,
    "env": 0,
    "fp8": 0,
    "cache": 1,
    "operands": 2,
    "ops": 3,
    "compat": 4,
    "demo": 4,
    "cli": 4,
    "__main__": 4,
    "testing": 4,
    "models": 4,
    "engine": 4,
}
NAMESPACE_LAYER = 4  # pagedattn/__init__.py


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    out = {}
    for path in sorted((SRC / PKG).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def is_package(name: str, mods: dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def layer(name: str) -> int:
    parts = name.split(".")
    if len(parts) == 1:
        return NAMESPACE_LAYER
    assert parts[1] in LAYERS, f"{name}: no layer assigned (add it to LAYERS and the docstring)"
    return LAYERS[parts[1]]


def resolve(base: str, name: str | None, mods: dict[str, Path]) -> str | None:
    """The package module that `base` (+ `.name`) names, or None outside the package."""
    if name is not None and f"{base}.{name}" in mods:
        return f"{base}.{name}"
    while base and base not in mods:
        base = base.rpartition(".")[0]  # `import a.b.c`'s object lives in a.b.c; else a parent
    return base or None


def imports(name: str, mods: dict[str, Path]) -> set[str]:
    """The package modules that module `name` imports, anywhere in its file."""
    tree = ast.parse(mods[name].read_text(), str(mods[name]))
    here = name if is_package(name, mods) else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [resolve(a.name, None, mods) for a in node.names if a.name.startswith(PKG)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = here.split(".")
                base = ".".join(up[: len(up) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            elif node.module and node.module.split(".")[0] == PKG:
                base = node.module
            else:
                continue
            targets = [resolve(base, a.name, mods) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith(PKG)
        ):
            targets = [resolve(node.args[0].value, None, mods)]
        out.update(t for t in targets if t is not None and t != name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, mods) for m in mods}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return comps


def test_every_module_has_a_layer():
    for m in modules():
        layer(m)


def test_no_module_imports_a_higher_layer():
    g = graph()
    bad = [
        f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
        for m in sorted(g)
        for t in sorted(g[m])
        if layer(t) > layer(m)
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_lazy_and_type_checking_imports(tmp_path, monkeypatch):
    """The walk counts a function's lazy import and a TYPE_CHECKING import (so it can fail)."""
    pkg = tmp_path / PKG
    (pkg / "fp8").mkdir(parents=True)
    (pkg / "cache").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fp8" / "__init__.py").write_text("")
    (pkg / "cache" / "__init__.py").write_text("")
    (pkg / "fp8" / "rows.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..cache.params import P\n"
    )
    (pkg / "cache" / "params.py").write_text("def f():\n    from ..fp8 import rows\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    g = graph()
    assert g[f"{PKG}.fp8.rows"] == {f"{PKG}.cache.params"}
    assert g[f"{PKG}.cache.params"] == {f"{PKG}.fp8.rows"}
    assert cycles(g) == [[f"{PKG}.cache.params", f"{PKG}.fp8.rows"]]
