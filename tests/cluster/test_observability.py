"""Alert rules and dashboard against what a live operator (and the fencing helpers) expose.

The rules and panels name metrics by string; nothing but a live scrape shows that those
strings are what the operator serves. This starts a real operator, drives a lease through
expiry and one through Failed, scrapes ``/metrics`` and

* checks every ``joblease_*`` metric the rules or the dashboard reference is exposed (by
  the operator, or for ``joblease_fencing_*`` by the fencing helpers);
* replays the scrape as constant series into ``promtool test rules`` and evaluates every
  alert: a healthy operator fires none, and bumping only the live ``kind="failed"``
  series fires exactly the Failed-jobs alert (the live labels match the rules' selectors).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from joblease import Phase
from joblease.domain.errors import LeaseFinishedError
from joblease.domain.token import FencingToken
from joblease.fencing import StaleTokenError, TokenGate
from joblease.sdk.client import LeaseClient

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "charts" / "joblease-operator" / "files"
RULES = FILES / "alerts.yaml"
DASHBOARD = FILES / "dashboard.json"
METRIC = re.compile(r"\bjoblease_[a-z0-9_]+")
# Metrics allowed to be missing only while no code under operator/ names them (none now).
PENDING: set[str] = set()
LIVE = {"job": "joblease-operator", "instance": "live:8080", "namespace": "joblease-system"}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def scrape(port: int) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def fencing_samples() -> list[Sample]:
    """What a worker using the fencing helpers publishes (after one accept and one refusal)."""
    gate = TokenGate()
    gate.accept("observability", FencingToken(1, 2))
    with pytest.raises(StaleTokenError):
        gate.accept("observability", FencingToken(1, 1))
    text = generate_latest(REGISTRY).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("joblease_fencing_")]


def expressions(path: Path) -> list[str]:
    """The PromQL of every alert (``expr``) or every panel target (``targets[].expr``)."""
    if path.suffix == ".json":
        return [t["expr"] for p in json.loads(path.read_text())["panels"]
                for t in p.get("targets", [])]
    doc = yaml.safe_load(path.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def referenced(path: Path) -> set[str]:
    names = {n for e in expressions(path) for n in METRIC.findall(e)}
    assert names, f"no joblease_* metric found in {path.name}"
    return names


def defined_in_code(name: str) -> bool:
    family = name.removesuffix("_total")
    return any(family in p.read_text() for p in (REPO / "operator").rglob("*.py"))


def series(sample: Sample, extra: dict[str, str]) -> str:
    labels = {**sample.labels, **extra}
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{sample.name}{{{inner}}}"


def replay(samples: list[Sample], fencing: list[Sample], bump_failed: bool) -> list[dict[str, str]]:
    """The scrape as promtool input series: one sample a minute for 30 minutes."""
    out = [{"series": series(Sample("up", {}, 1.0), LIVE), "values": "1+0x30"}]
    for s in samples:
        if s.name.endswith("_created"):
            continue
        if s.name == "joblease_operator_last_pass_timestamp_seconds":
            values = "0+60x30"  # "a pass just finished" on promtool's clock (checked live below)
        elif bump_failed and s.labels.get("kind") == "failed":
            values = f"{s.value}+0x3 {s.value + 1}+0x27"
        else:
            values = f"{s.value}+0x30"
        out.append({"series": series(s, LIVE), "values": values})
    worker = {"job": "report-worker", "namespace": "payments", "instance": "w:9100"}
    out += [{"series": series(s, worker), "values": f"{s.value}+0x30"}
            for s in fencing if not s.name.endswith("_created")]
    return out


def evaluate(promtool: Path, tmp_path: Path, inputs: list[dict[str, str]],
             firing: set[str]) -> subprocess.CompletedProcess[str]:
    doc = yaml.safe_load(RULES.read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    checks = [{"eval_time": "10m", "alertname": name, "exp_alerts": (
        [{"exp_labels": dict(rule["labels"]), "exp_annotations": rule["annotations"]}]
        if name in firing else [])} for name, rule in rules.items()]
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": checks}]}
    path = tmp_path / f"live-{'-'.join(sorted(firing)) or 'healthy'}.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)


def test_rules_and_dashboard_match_a_live_operator(
        leases: LeaseClient, start_operator: Callable[..., Any], promtool: Path,
        tmp_path: Path) -> None:
    op = start_operator(namespaces=[leases.namespace])
    before = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in scrape(op.metrics_port)}
    leases.store.create(leases.namespace, "expires", {"leaseDurationSeconds": 1})
    leases.store.create(leases.namespace, "fails", {"leaseDurationSeconds": 30,
                                                    "maxAttempts": 1})
    # The Failed transition is counted only for a lease the operator saw before it failed.
    wait_for(lambda: op.metrics().get('joblease_leases{phase="Available"}', 0.0) >= 2, 10,
             "the operator to see both leases")
    leases.claim("expires", holder="a")
    with pytest.raises(LeaseFinishedError):  # the last attempt: the release writes Failed
        leases.claim("fails", holder="a").release(failed=True)
    wait_for(lambda: leases.get("expires").status.phase is Phase.EXPIRED, 8, "Expired")
    assert leases.get("fails").status.phase is Phase.FAILED

    def settled() -> list[Sample] | None:
        samples = scrape(op.metrics_port)
        values = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
        failed = ("joblease_transitions_total", (("kind", "failed"),))
        lag = ("joblease_expiry_lag_seconds_count", ())
        return samples if values[failed] > before[failed] and values[lag] > before.get(
            lag, 0) else None

    samples = wait_for(settled, 5, "the Failed transition and the expiry lag on /metrics")
    exposed = {s.name for s in samples}
    fencing = fencing_samples()

    # 1. Every referenced metric is exposed by whoever is meant to expose it.
    for source in (RULES, DASHBOARD):
        for name in sorted(referenced(source)):
            if name.startswith("joblease_fencing_"):
                assert name in {s.name for s in fencing}, f"{source.name}: {name} not exposed"
            elif name in PENDING and not defined_in_code(name):
                assert name not in exposed
            else:
                assert name in exposed, f"{source.name}: the live operator does not expose {name}"
    assert referenced(DASHBOARD) >= {"joblease_leases", "joblease_fencing_refused_total",
                                     "joblease_expiry_lag_seconds_bucket"}

    # 2. The live values behind "not reconciling" and "overdue" are what the rules assume.
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
    age = time.time() - values[("joblease_operator_last_pass_timestamp_seconds", ())]
    assert 0 <= age < 5, f"last pass {age:.1f}s ago"
    assert values[("joblease_lease_overdue_max_seconds", ())] < 5

    # 3. Every alert evaluated on the replayed scrape: none fires for a healthy operator,
    #    and the live kind="failed" series (bumped by one) fire the Failed-jobs alert.
    healthy = evaluate(promtool, tmp_path, replay(samples, fencing, False), set())
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    failed = evaluate(promtool, tmp_path, replay(samples, fencing, True), {"JobleaseJobsFailed"})
    assert failed.returncode == 0, failed.stdout + failed.stderr
