"""docs/operations.md keeps up with the code: every metric, alert and panel is described."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import joblease.controller.metrics
import joblease.fencing.metrics  # (registers the fencing counters)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "operations.md").read_text()
FILES = REPO / "charts" / "joblease-operator" / "files"


def test_every_exported_joblease_metric_is_in_the_metrics_tables() -> None:
    assert joblease.controller.metrics.LEASES is not None
    families = [m for m in REGISTRY.collect() if m.name.startswith("joblease_")]
    names = {m.name for m in families}
    counters = {m.name for m in families if m.type == "counter"}
    assert len(names) >= 11, names  # 9 of the operator, 2 of the fencing helpers
    rows = set(re.findall(r"^\| `(joblease_[a-z0-9_]+)` \|", DOC, re.MULTILINE))
    # prometheus_client names a counter's family without "_total"; the doc uses the series.
    documented = {n.removesuffix("_total") if n.removesuffix("_total") in counters else n
                  for n in rows}
    assert names <= documented, f"undocumented metrics: {names - documented}"


def test_every_alert_has_a_runbook_section() -> None:
    doc = yaml.safe_load((FILES / "alerts.yaml").read_text())
    alerts = [r["alert"] for g in doc["groups"] for r in g["rules"]]
    headings = set(re.findall(r"^### (\w+)$", DOC, re.MULTILINE))
    assert set(alerts) <= headings, f"alerts without a runbook: {set(alerts) - headings}"


def test_every_dashboard_panel_is_listed() -> None:
    panels = json.loads((FILES / "dashboard.json").read_text())["panels"]
    titles = [p["title"] for p in panels if p["type"] != "row"]
    assert len(titles) >= 10
    missing = [t for t in titles if f"| {t} |" not in DOC]
    assert not missing, f"panels missing from docs/operations.md: {missing}"
