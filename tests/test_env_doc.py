"""docs/env.md lists every `PAGEDATTN_*` variable the project names (src/, tests/, scripts/,
the Makefile and dev/), and names none that nothing reads any more."""

from __future__ import annotations

import re
from pathlib import Path

from pagedattn import env

ROOT = Path(__file__).resolve().parent.parent
WHERE = ("src", "tests", "scripts", "Makefile", "dev")
NAME = re.compile(r"PAGEDATTN_[A-Z_]+")


def _files():
    for top in WHERE:
        path = ROOT / top
        for f in [path] if path.is_file() else sorted(path.rglob("*")):
            skip = any(p == "__pycache__" or p.endswith(".egg-info") for p in f.parts)
            if f.is_file() and not skip and not f.name.endswith(".pyc"):
                yield f


def _names(text: str) -> set[str]:
    return {n.rstrip("_") for n in NAME.findall(text)}


def used() -> dict[str, list[str]]:
    """Each PAGEDATTN_* name found in the tree -> the files naming it."""
    out: dict[str, list[str]] = {}
    for f in _files():
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        for n in _names(text):
            out.setdefault(n, []).append(str(f.relative_to(ROOT)))
    return out


def documented() -> set[str]:
    return _names((ROOT / "docs" / "env.md").read_text())


def test_every_variable_is_documented():
    missing = {n: fs for n, fs in used().items() if n not in documented()}
    assert not missing, f"not in docs/env.md: {missing}"


def test_every_documented_variable_is_used():
    assert documented() <= set(used()), documented() - set(used())


def test_the_package_variables_are_documented():
    assert {env.PREFIX + v for v in env.VARIABLES} <= documented()
