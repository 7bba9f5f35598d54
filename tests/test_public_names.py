"""Across a package boundary only public names: no ``_private`` module or name of ``perfmodel``,
``fitting``, ``optimize`` or ``servingmath`` is imported or reached as an attribute from another
of these packages, from ``benchmarks/*.py`` or from a notebook's code cells (a package may use its
own private modules; tests may import privately)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("perfmodel", "fitting", "optimize", "servingmath")


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def private_uses(source: str, own: str | None = None) -> list[str]:
    """Each import or attribute access in ``source`` that reaches a private part of a package
    other than ``own`` (the package the source belongs to)."""
    tree = ast.parse(source)
    found, aliases = [], {}  # aliases: a local name bound to a package module -> its dotted path
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PACKAGES or node.module.split(".")[0] == own:
                continue
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if _private(dotted):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                aliases[alias.asname or alias.name] = dotted
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in PACKAGES or alias.name.split(".")[0] == own:
                    continue
                if _private(alias.name):
                    found.append(f"line {node.lineno}: import {alias.name}")
                local = alias.asname or alias.name.split(".")[0]
                aliases[local] = alias.name if alias.asname else local
    for node in ast.walk(tree):  # ``perfmodel._serving.x`` or ``fitting._update`` as attributes
        if isinstance(node, ast.Attribute) and _private(node.attr) and not node.attr.endswith("__"):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                found.append(f"line {node.lineno}: {'.'.join([base.id, *reversed(chain)])}")
    return sorted(found, key=lambda use: int(use.split(":")[0].removeprefix("line ")))


def _sources() -> list[tuple[str, str, str | None]]:
    """(where, source, its own package or None) of every file the rule covers."""
    out = [
        (p.relative_to(ROOT).as_posix(), p.read_text(), None) for p in ROOT.glob("benchmarks/*.py")
    ]
    for package in PACKAGES:
        out += [
            (p.relative_to(ROOT).as_posix(), p.read_text(), package)
            for p in ROOT.glob(f"{package}/**/*.py")
        ]
    for nb in sorted(ROOT.glob("notebooks/*.ipynb")):
        cells = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
        for i, cell in enumerate(cells):
            out.append(
                (f"{nb.relative_to(ROOT).as_posix()}[cell {i}]", "".join(cell["source"]), None)
            )
    out += [
        (p.relative_to(ROOT).as_posix(), p.read_text(), None) for p in ROOT.glob("notebooks/*.py")
    ]
    return sorted(out)


def test_no_private_names_across_packages():
    found = {
        where: uses for where, source, own in _sources() if (uses := private_uses(source, own))
    }
    assert found == {}


def test_the_check_sees_each_kind_of_private_use():
    source = (
        "import perfmodel\nimport fitting._update as up\nfrom optimize._verify import x\n"
        "from perfmodel import _hidden\nperfmodel._serving.f()\nimport numpy\nnumpy._core\n"
        "import fitting as fit\nfit._rows\nperfmodel.__file__\nfrom perfmodel import dynamics\n"
    )
    assert private_uses(source) == [
        "line 2: import fitting._update",
        "line 3: from optimize._verify import x",
        "line 4: from perfmodel import _hidden",
        "line 5: perfmodel._serving",
        "line 9: fit._rows",
    ]
    # inside fitting, its own private modules are its own business; optimize's are not
    assert private_uses("import fitting._rows\nfrom optimize._grid import G\n", own="fitting") == [
        "line 2: from optimize._grid import G"
    ]
