"""The package source root is ``operator/``; it must never shadow the stdlib ``operator``."""

import operator
import sysconfig
from pathlib import Path

from support.paths import REPO


def test_operator_is_still_the_stdlib_module() -> None:
    assert operator.add(2, 3) == 5
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    # `operator` may be built in (no __file__) or a file in the stdlib folder; never ours.
    location = getattr(operator, "__file__", None)
    if location is not None:
        assert Path(location).resolve().is_relative_to(stdlib), location
        assert not Path(location).resolve().is_relative_to(REPO)


def test_source_root_is_not_a_package() -> None:
    assert (REPO / "operator" / "joblease" / "__init__.py").is_file()
    assert not (REPO / "operator" / "__init__.py").exists(), (
        "operator/__init__.py would shadow the stdlib `operator` module for everything "
        "that runs with the repository root on sys.path"
    )


def test_no_two_test_modules_share_a_name() -> None:
    """pytest imports test modules by basename (no ``__init__.py`` in the test folders).

    Two files named alike (``tests/unit/test_dispatch.py`` beside
    ``tests/cluster/test_dispatch.py`` did, at a merge) make the whole run stop at
    collection with "import file mismatch", before any test runs.
    """
    seen: dict[str, list[str]] = {}
    for folder in ("tests", "localcluster/tests", "e2e"):
        for path in (REPO / folder).rglob("test_*.py"):
            if "__pycache__" not in path.parts:
                seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}
