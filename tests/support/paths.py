"""Repository paths the suites use (the one place that knows where the repository is)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
CRDS = REPO / "crds"
CRD = CRDS / "joblease.dev_jobleases.yaml"
CHART = REPO / "charts" / "joblease-operator"
ARTIFACTS = REPO / "artifacts"
