"""The chart's and the local cluster's CRDs are mechanical copies of the canonical one.

Helm installs ``charts/joblease-operator/crds/`` before the templates and never deletes
it; ``joblease_localcluster/data/`` ships the CRD the demo applies from an installed wheel;
``crds/`` is what the tests and ``kubectl apply`` use. Run ``make sync-crds`` to copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.paths import CHART as CHART_ROOT
from support.paths import CRDS as CANONICAL
from support.paths import REPO

CHART = CHART_ROOT / "crds"
PACKAGE_DATA = REPO / "localcluster" / "src" / "joblease_localcluster" / "data"
COPIES = {"chart": CHART, "package data": PACKAGE_DATA}


def _yaml_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.yaml"))


@pytest.mark.parametrize("where", COPIES)
def test_each_copy_has_exactly_the_canonical_crds(where: str) -> None:
    assert _yaml_files(COPIES[where]) == _yaml_files(CANONICAL), "run `make sync-crds`"


@pytest.mark.parametrize("where", COPIES)
@pytest.mark.parametrize("name", _yaml_files(CANONICAL))
def test_each_copied_crd_is_byte_identical(where: str, name: str) -> None:
    folder = COPIES[where]
    canonical, copy = (CANONICAL / name).read_bytes(), (folder / name).read_bytes()
    assert copy == canonical, (f"{folder.relative_to(REPO)}/{name} drifted: "
                               f"run `make sync-crds`")


def test_the_demo_applies_the_packaged_crd() -> None:
    from joblease_localcluster.crd import crd_path

    assert crd_path().resolve() == (PACKAGE_DATA / "joblease.dev_jobleases.yaml").resolve()
