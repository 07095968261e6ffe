"""Fixtures of the packaging tests: both wheels, built once per session from a clean copy."""

from __future__ import annotations

import pytest
from packaging_support import Wheels, copy_tree, pip_wheel


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    """Build ``joblease`` and ``joblease-localcluster`` wheels from a clean copy."""
    tree = copy_tree(tmp_path_factory.mktemp("tree"))
    product, out1 = pip_wheel(tree, tmp_path_factory.mktemp("wheel-product"))
    localcluster, out2 = pip_wheel(tree / "localcluster", tmp_path_factory.mktemp("wheel-lc"))
    return Wheels(product, localcluster, out1 + out2)
