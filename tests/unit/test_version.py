"""The version is written once (issue 31): in ``joblease.__version__``, read by the build.

``pyproject.toml`` and ``operator/joblease/__init__.py`` both wrote "0.1.0"; a release that
bumped one would have shipped a wheel whose ``joblease.__version__`` disagreed with its
metadata.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from setuptools.config.expand import read_attr

import joblease

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_build_reads_the_version_from_the_package_and_nowhere_else() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    package_dir = project["tool"]["setuptools"]["package-dir"]
    assert read_attr(attr, package_dir, REPO) == joblease.__version__
    assert joblease.__version__.count(".") == 2
