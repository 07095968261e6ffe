"""The one rule that marks every test: by its folder, and by the servers it asks for.

Every test folder has an entry in ``FOLDERS`` (a folder without one is a collection error, so
a new folder cannot silently go unmarked); a test that requests a server fixture also gets
that server's marker, whatever its folder (``FIXTURES``). So ``-m unit`` is every pure
test, ``-m cluster`` every test that needs the control plane, ``-m postgres`` every test
that needs PostgreSQL. Loaded as a plugin by ``tests/conftest.py`` and
``localcluster/tests/conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .paths import REPO

# folder (relative to the repository) → the markers of every test in it
FOLDERS: dict[str, tuple[str, ...]] = {
    "tests/unit": ("unit",),
    "tests/support": ("unit", "harness"),
    "localcluster/tests": ("unit", "harness"),
    "tests/packaging": ("packaging",),
    "tests/cluster": ("cluster",),
    "tests/fencing": ("fencing",),
    "tests/faults": ("faults",),
    "tests/ha": ("ha",),
    "tests/node": ("node",),
    "tests/ops": ("ops",),
    "tests/sim": ("unit", "sim"),
}
# fixture → the marker of the server it needs (requested directly or through other fixtures)
FIXTURES: dict[str, str] = {
    "cluster": "cluster",
    "cluster_binaries": "cluster",
    "kwok_cluster": "cluster",
    "ha_cluster": "cluster",
    "postgres_server": "postgres",
    "faults_postgres": "postgres",
}


def folder_of(path: Path) -> str | None:
    """The ``FOLDERS`` key that holds ``path``, if any."""
    try:
        relative = path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return None
    return next((folder for folder in FOLDERS if relative.startswith(folder + "/")), None)


def markers_for(path: Path, fixturenames: list[str]) -> list[str]:
    """The markers of a test in ``path`` that requests ``fixturenames``.

    Raises:
        pytest.UsageError: the test lives in a folder ``FOLDERS`` does not know.
    """
    folder = folder_of(path)
    if folder is None:
        raise pytest.UsageError(f"{path}: its folder has no entry in tests/support/markers.py "
                                f"FOLDERS; add one so its tests are marked like every other")
    found = list(FOLDERS[folder])
    for fixture in fixturenames:
        marker = FIXTURES.get(fixture)
        if marker and marker not in found:
            found.append(marker)
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every collected test by ``markers_for``."""
    for item in items:
        names = list(getattr(item, "fixturenames", ()))
        present = {mark.name for mark in item.iter_markers()}
        for marker in markers_for(item.path, names):
            if marker not in present:
                item.add_marker(getattr(pytest.mark, marker))
