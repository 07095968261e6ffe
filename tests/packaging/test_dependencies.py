"""``joblease`` declares exactly the distributions its modules import (pykube-ng is the tests').

Every ``import`` in ``operator/joblease`` is read with ``ast``; the third-party top-level
names are mapped to their distributions; the runtime ones must equal the runtime
``dependencies`` in ``pyproject.toml``, and each extra's must be in that extra.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions

from support.paths import REPO

PRODUCT = REPO / "operator" / "joblease"
# Imported only by modules that need an extra (`joblease.fencing.postgres`).
EXTRAS = {"psycopg": "postgres"}


def _imported_top_levels() -> dict[str, set[str]]:
    """Top-level module name → the product modules importing it."""
    found: dict[str, set[str]] = {}
    for path in PRODUCT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(
                    str(path.relative_to(REPO)))
    return found


def _name(requirement: str) -> str:
    for sep in ("==", ">=", "<=", "~=", "[", ";", " "):
        requirement = requirement.split(sep)[0]
    return requirement.strip().lower().replace("_", "-")


def test_runtime_dependencies_are_exactly_what_the_product_imports() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    dists = packages_distributions()
    third_party = {name: mods for name, mods in _imported_top_levels().items()
                   if name not in sys.stdlib_module_names and name != "joblease"}
    unknown = {name for name in third_party if name not in dists}
    assert not unknown, f"imported but installed by no distribution: {unknown}"
    runtime = {_name(dists[name][0]) for name in third_party if name not in EXTRAS}
    assert runtime == declared, (f"imported: {sorted(runtime)}; declared: {sorted(declared)}")
    for name, extra in EXTRAS.items():
        assert _name(dists[name][0]) in {_name(r) for r in
                                         project["optional-dependencies"][extra]}


def test_pykube_is_the_tests_client_only() -> None:
    assert "pykube" not in _imported_top_levels()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "pykube-ng" not in {_name(r) for r in project["dependencies"]}
    assert "pykube-ng" in {_name(r) for r in project["optional-dependencies"]["dev"]}
