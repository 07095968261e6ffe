"""The chart's CRD is a mechanical copy of the canonical one: any drift fails here.

Helm installs ``charts/joblease-operator/crds/`` before the templates and never deletes
it; ``crds/`` is what the tests and ``kubectl apply`` use. Run ``make sync-crds`` to copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CANONICAL = REPO / "crds"
CHART = REPO / "charts" / "joblease-operator" / "crds"


def _yaml_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.yaml"))


def test_the_chart_has_exactly_the_canonical_crds() -> None:
    assert _yaml_files(CHART) == _yaml_files(CANONICAL), "run `make sync-crds`"


@pytest.mark.parametrize("name", _yaml_files(CANONICAL))
def test_each_chart_crd_is_byte_identical(name: str) -> None:
    canonical, copy = (CANONICAL / name).read_bytes(), (CHART / name).read_bytes()
    assert copy == canonical, f"charts/joblease-operator/crds/{name} drifted: run `make sync-crds`"
