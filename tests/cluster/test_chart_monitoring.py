"""The chart's monitoring objects on a real API server with the Prometheus Operator's CRDs.

``helm template`` proves the objects render; only the API server proves the CRDs accept
them. CRD validation prunes unknown fields silently, so each object is also read back and
must still contain everything that was sent: a field the CRD does not know would be
missing. (The server may add defaults, e.g. ``action: replace`` on a relabeling.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kwok_support import CHART, helm

PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
CRDS = Path(__file__).parent / "data" / f"prometheus-operator-{PROMETHEUS_OPERATOR_VERSION}"
CRD_NAMES = ("servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")
MONITORING = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true",
              "prometheusRule.alertLabels.team=payments", "grafana.dashboard.enabled=true",
              "replicaCount=2", "serviceMonitor.labels.release=kps",
              "serviceMonitor.relabelings[0].targetLabel=cluster",
              "serviceMonitor.relabelings[0].replacement=local")


@pytest.fixture(scope="session")
def monitoring_crds(cluster: Any) -> tuple[str, ...]:
    """The pinned ServiceMonitor and PrometheusRule CRDs, applied once and Established."""
    for path in sorted(CRDS.glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path),
                        check=True, timeout=120)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    *(f"crd/{name}" for name in CRD_NAMES), check=True)
    return CRD_NAMES


def contains(stored: Any, sent: Any) -> bool:
    """Whether ``stored`` holds every field and value of ``sent`` (extra defaults allowed)."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            k in stored and contains(stored[k], v) for k, v in sent.items())
    if isinstance(sent, list):
        return (isinstance(stored, list) and len(stored) == len(sent)
                and all(contains(a, b) for a, b in zip(stored, sent, strict=True)))
    return bool(stored == sent)


def rendered(namespace: str) -> list[dict[str, Any]]:
    sets = [arg for s in MONITORING for arg in ("--set", s)]
    shown = [arg for t in ("servicemonitor", "prometheusrule", "dashboard",
                           "poddisruptionbudget") for arg in ("--show-only", f"templates/{t}.yaml")]
    out = helm(None, "template", "jl", str(CHART), "-n", namespace, *sets, *shown)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_rendered_monitoring_objects_are_created_unchanged(
        cluster: Any, monitoring_crds: tuple[str, ...], namespace: str, tmp_path: Path) -> None:
    objects = rendered(namespace)
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap", "PodDisruptionBudget", "PrometheusRule", "ServiceMonitor"]
    manifest = tmp_path / "monitoring.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    out = cluster.kubectl("create", "-n", namespace, "-f", str(manifest))
    assert out.returncode == 0, out.stderr
    for sent in objects:
        kind, name = sent["kind"].lower(), sent["metadata"]["name"]
        stored = json.loads(cluster.kubectl("get", "-n", namespace, kind, name, "-o", "json",
                                            check=True).stdout)
        field = "data" if sent["kind"] == "ConfigMap" else "spec"
        assert contains(stored[field], sent[field]), (
            f"{kind}/{name}: the API server dropped or changed part of {field}: "
            f"sent {sent[field]}, stored {stored[field]}")
        assert stored["metadata"]["labels"] == sent["metadata"]["labels"]


def test_contains_sees_a_pruned_field() -> None:
    sent = {"endpoints": [{"port": "metrics", "relabelings": [{"targetLabel": "job"}]}]}
    assert contains({"endpoints": [{"port": "metrics", "relabelings": [
        {"targetLabel": "job", "action": "replace"}]}]}, sent)
    assert not contains({"endpoints": [{"port": "metrics", "relabelings": [{}]}]}, sent)
    assert not contains({"endpoints": [{"port": "metrics"}]}, sent)


def test_the_crds_do_validate_what_they_accept(cluster: Any, monitoring_crds: tuple[str, ...],
                                               namespace: str, tmp_path: Path) -> None:
    """Not vacuous: the same ServiceMonitor with a malformed interval is refused."""
    monitor = next(o for o in rendered(namespace) if o["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(monitor))
    out = cluster.kubectl("create", "-n", namespace, "-f", str(manifest))
    assert out.returncode != 0
    assert "interval" in out.stderr and "Invalid" in out.stderr, out.stderr
