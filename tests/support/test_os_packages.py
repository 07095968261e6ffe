"""``.ci/os-packages``: the one table of OS packages, run with fake commands on a fake PATH.

Both branches: as root it installs exactly what is missing; otherwise it prints one
``sudo apt-get install …`` line and fails before anything else runs. ``make test``,
``make demo`` and ``.ci/run`` all go through it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.paths import REPO

SCRIPT = REPO / ".ci" / "os-packages"
BASH = shutil.which("bash") or "/bin/bash"
TEST_COMMANDS = ("openssl", "make", "git", "initdb", "faketime", "runc", "busybox", "mmdebstrap")


def _fake_bin(tmp_path: Path, present: tuple[str, ...], uid: int) -> Path:
    """A PATH folder holding only ``present`` (as no-ops), ``id`` and a recording apt-get."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in present:
        (folder / name).write_text("#!/bin/sh\nexit 0\n")
    (folder / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (folder / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "apt.log"}\n')
    for path in folder.iterdir():
        path.chmod(0o755)
    return folder


def _run(tmp_path: Path, target: str, present: tuple[str, ...], uid: int
         ) -> subprocess.CompletedProcess[str]:
    folder = _fake_bin(tmp_path, present, uid)
    return subprocess.run([BASH, str(SCRIPT), target], capture_output=True, text=True,
                          env={"PATH": str(folder)}, cwd=tmp_path, timeout=30, check=False)


def _apt_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "apt.log"
    return log.read_text().splitlines() if log.exists() else []


def test_not_root_prints_one_sudo_line_and_fails_without_installing(tmp_path: Path) -> None:
    present = tuple(c for c in TEST_COMMANDS if c not in ("faketime", "runc"))
    out = _run(tmp_path, "test", present, uid=1000)
    assert out.returncode == 3, out
    sudo_lines = [line for line in out.stderr.splitlines() if line.startswith("sudo ")]
    assert sudo_lines == ["sudo apt-get install -y --no-install-recommends faketime runc"]
    assert _apt_calls(tmp_path) == []
    assert out.stdout == ""


def test_root_installs_exactly_what_is_missing(tmp_path: Path) -> None:
    present = tuple(c for c in TEST_COMMANDS if c not in ("busybox", "mmdebstrap"))
    out = _run(tmp_path, "test", present, uid=0)
    assert out.returncode == 0, out
    calls = _apt_calls(tmp_path)
    assert calls[0] == "update -q"
    assert calls[1].split()[-2:] == ["busybox-static", "mmdebstrap"]
    assert calls[1].startswith("install -y")
    assert len(calls) == 2


def test_nothing_missing_does_nothing(tmp_path: Path) -> None:
    out = _run(tmp_path, "test", TEST_COMMANDS, uid=1000)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert _apt_calls(tmp_path) == []


def test_the_demo_needs_only_its_own_packages(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _run(tmp_path / "a", "demo", ("openssl", "make"), uid=1000).returncode == 0
    missing = _run(tmp_path / "b", "demo", ("make",), uid=1000)
    assert missing.returncode == 3
    assert missing.stderr.splitlines()[-1] == (
        "sudo apt-get install -y --no-install-recommends openssl")


def test_kind_needs_the_container_engine_and_not_the_test_servers(tmp_path: Path) -> None:
    # kind's target: Debian's docker.io (dockerd) on top of the image tools; PostgreSQL,
    # faketime and runc are the test suite's, not kind's.
    present = ("make", "git", "busybox", "mmdebstrap")
    missing = _run(tmp_path, "kind", present, uid=1000)
    assert missing.returncode == 3, missing
    assert missing.stderr.splitlines()[-1] == (
        "sudo apt-get install -y --no-install-recommends docker.io")


def test_an_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    assert _run(tmp_path, "bench", TEST_COMMANDS, uid=0).returncode == 2


@pytest.mark.parametrize("target", ["demo", "test"])
def test_make_checks_os_packages_before_anything_else(target: str) -> None:
    dry = subprocess.run(["make", "-n", "-W", "pyproject.toml", target], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "MAKEFLAGS": ""})
    assert dry.returncode == 0, dry.stderr
    commands = [line for line in dry.stdout.splitlines() if line and not line.startswith("make")]
    assert commands[0] == f".ci/os-packages {target}", commands[:3]


def test_ci_run_has_no_table_of_its_own() -> None:
    run = (REPO / ".ci" / "run").read_text()
    assert ".ci/os-packages test" in run
    recipes = [line for line in (REPO / "Makefile").read_text().splitlines()
               if line.startswith("\t")]
    assert "apt-get" not in run
    assert not [line for line in recipes if "apt-get" in line]
