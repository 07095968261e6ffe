"""The Grafana dashboard is well formed and every panel query is valid PromQL.

Which metrics the queries name is checked against a live operator in
``tests/cluster/test_observability.py``; here promtool parses each query (wrapped as a
recording rule, since promtool parses PromQL only inside rule files) so a typo in a panel
fails a test instead of showing "no data" in Grafana.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "joblease-operator" / "files" / "dashboard.json"


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "joblease-operator"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]


def test_every_panel_query_parses(promtool: Path, tmp_path: Path) -> None:
    rules = [{"record": f"panel_{p['id']}_{t['refId']}",
              "expr": t["expr"].replace("$__rate_interval", "5m")}
             for p in panels() for t in p["targets"]]
    assert len(rules) >= 15
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    out = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout, out.stdout
