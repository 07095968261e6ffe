"""Both wheels, installed into a fresh virtual environment outside the source tree, work.

The environment gets the two wheels only (``--no-deps --no-index``); their third-party
dependencies (kopf, kubernetes, …) are borrowed from the development environment through
a ``.pth`` line, so the test needs no network and no registry. Everything runs with ``cwd``
in a temporary folder and without ``PYTHONPATH``, and checks that ``joblease`` and
``joblease_localcluster`` are imported from the fresh environment, not from the tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging_support import Wheels

from support.paths import CRD, REPO


@dataclass(frozen=True)
class FreshEnv:
    """A virtual environment with both wheels installed, and a folder to run in."""

    root: Path
    workdir: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(list(argv), cwd=self.workdir, env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "python"), "-c", code)


@pytest.fixture(scope="module")
def fresh(wheels: Wheels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshEnv]:
    root = tmp_path_factory.mktemp("fresh-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    python = root / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", str(wheels.product), str(wheels.localcluster)],
        capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Third-party dependencies only: a plain path line, so the development environment's
    # own .pth files (the editable installs of both packages) are never processed.
    Path(site, "zz-dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    workdir = tmp_path_factory.mktemp("elsewhere")
    yield FreshEnv(root, workdir)


def test_both_packages_come_from_the_fresh_environment(fresh: FreshEnv) -> None:
    out = fresh.python(
        "import sys, joblease, joblease_localcluster\n"
        "print(joblease.__file__); print(joblease_localcluster.__file__)\n"
        "print('\\n'.join(sys.path))")
    assert out.returncode == 0, out.stderr
    product, localcluster, *path = out.stdout.splitlines()
    assert Path(product).is_relative_to(fresh.root), product
    assert Path(localcluster).is_relative_to(fresh.root), localcluster
    tree_roots = {str(REPO / "operator"), str(REPO / "localcluster" / "src"), str(REPO)}
    assert not tree_roots & set(path), path


def test_joblease_help_without_the_cluster_builder(fresh: FreshEnv) -> None:
    out = fresh.run(str(fresh.bin / "joblease"), "--help")
    assert out.returncode == 0, out.stderr
    for command in ("claim", "renew", "complete", "release", "get", "run", "operator"):
        assert command in out.stdout
    assert "local-cluster" not in out.stdout and "demo" not in out.stdout


def test_python_m_joblease_help(fresh: FreshEnv) -> None:
    out = fresh.run(str(fresh.bin / "python"), "-m", "joblease", "--help")
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


def test_the_sdk_imports_without_loading_the_cluster_builder(fresh: FreshEnv) -> None:
    out = fresh.python(
        "import sys, joblease, joblease.cli\n"
        "assert callable(joblease.LeaseClient) and callable(joblease.Holding)\n"
        "joblease.cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if 'localcluster' in m))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_localcluster_finds_its_crd_without_the_source_tree(fresh: FreshEnv) -> None:
    out = fresh.python("from joblease_localcluster.crd import crd_path; print(crd_path())")
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path.is_relative_to(fresh.root) and not path.is_relative_to(REPO / "localcluster")
    assert path.read_bytes() == CRD.read_bytes()


def test_joblease_localcluster_help(fresh: FreshEnv) -> None:
    out = fresh.run(str(fresh.bin / "joblease-localcluster"), "--help")
    assert out.returncode == 0, out.stderr
    for command in ("build", "up", "down", "env", "demo"):
        assert command in out.stdout


def test_the_demo_passes_from_the_installed_wheels(fresh: FreshEnv,
                                                    cluster_binaries: None) -> None:
    """The README's demo, run by the installed command: CRD, operator and workers from wheels."""
    out = fresh.run(str(fresh.bin / "joblease-localcluster"), "demo", timeout=400)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "CRD jobleases.joblease.dev installed and Established" in out.stdout
    assert "RESULT: fencing held" in out.stdout, out.stdout[-4000:]
