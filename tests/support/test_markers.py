"""The one marker rule: by folder, plus the servers a test requests; unknown folders fail."""

from __future__ import annotations

import pytest

from support.markers import FOLDERS, markers_for
from support.paths import REPO


def test_a_folder_gives_its_markers() -> None:
    assert markers_for(REPO / "tests" / "unit" / "test_x.py", []) == ["unit"]
    assert markers_for(REPO / "localcluster" / "tests" / "test_x.py", []) == ["unit", "harness"]


def test_server_fixtures_add_their_markers_in_any_folder() -> None:
    path = REPO / "tests" / "faults" / "test_x.py"
    assert markers_for(path, ["fault_env", "cluster", "faults_postgres", "tmp_path"]) == [
        "faults", "cluster", "postgres"]
    assert markers_for(path, ["tmp_path"]) == ["faults"]


def test_a_folder_without_an_entry_is_a_usage_error() -> None:
    with pytest.raises(pytest.UsageError, match="no entry"):
        markers_for(REPO / "tests" / "newsuite" / "test_x.py", [])


def test_every_test_folder_in_the_repository_has_an_entry() -> None:
    folders = {p.parent.relative_to(REPO).as_posix()
               for root in (REPO / "tests", REPO / "localcluster" / "tests")
               for p in root.rglob("test_*.py")}
    unknown = {f for f in folders if not any(f == k or f.startswith(k + "/") for k in FOLDERS)}
    assert not unknown, f"test folders with no marker entry: {sorted(unknown)}"


def test_every_marker_the_rule_gives_is_registered(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    given = {m for markers in FOLDERS.values() for m in markers}
    assert given <= registered, given - registered
