"""The chart's alert rules under ``promtool test rules``, on synthetic series.

Each scenario is a set of series over time; at each evaluation time *every* alert in the
file is checked, so a scenario asserts both which alerts fire (with which labels) and that
all the others stay silent. The annotations promtool compares are copied from the rules
file: they are static text, and what the scenarios test is when and with what labels an
alert fires.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "joblease-operator" / "files" / "alerts.yaml"

OP = 'job="joblease-operator",namespace="joblease-system",instance="10.0.0.7:8080"'
OP_LABELS = {"job": "joblease-operator", "namespace": "joblease-system",
             "instance": "10.0.0.7:8080"}
WORKER = 'job="report-worker",namespace="payments"'


def healthy_operator(minutes: int = 40) -> dict[str, str]:
    """An operator that passes every second, expires fast and fails nothing."""
    return {
        f"up{{{OP}}}": f"1+0x{minutes}",
        # The pass timestamp follows promtool's clock (starts at 0, one sample a minute).
        f"joblease_operator_last_pass_timestamp_seconds{{{OP}}}": f"0+60x{minutes}",
        f'joblease_operator_object_errors_total{{{OP},stage="write"}}': f"0+0x{minutes}",
        f'joblease_expiry_lag_seconds_bucket{{{OP},le="0.5"}}': f"0+20x{minutes}",
        f'joblease_expiry_lag_seconds_bucket{{{OP},le="1"}}': f"0+20x{minutes}",
        f'joblease_expiry_lag_seconds_bucket{{{OP},le="2"}}': f"0+20x{minutes}",
        f'joblease_expiry_lag_seconds_bucket{{{OP},le="3"}}': f"0+20x{minutes}",
        f'joblease_expiry_lag_seconds_bucket{{{OP},le="+Inf"}}': f"0+20x{minutes}",
        f"joblease_lease_overdue_max_seconds{{{OP}}}": "0 0.4 0 0.8 0 " * (minutes // 5) + "0",
        f'joblease_operator_writes_total{{{OP},kind="failed"}}': f"0+0x{minutes}",
        f'joblease_transitions_total{{{OP},kind="failed"}}': f"0+0x{minutes}",
    }


def fencing(accepted_per_min: int, refused: str, minutes: int = 40) -> dict[str, str]:
    return {
        f'joblease_fencing_accepted_total{{{WORKER},helper="postgres",result="applied"}}':
            f"0+{accepted_per_min}x{minutes}",
        f'joblease_fencing_refused_total{{{WORKER},helper="postgres"}}': refused,
    }


@dataclass
class Scenario:
    """Series, and the alerts expected at each evaluation time (name → label sets)."""

    name: str
    series: dict[str, str]
    expect: dict[str, dict[str, list[dict[str, str]]]] = field(default_factory=dict)


def with_(base: dict[str, str], **changes: str) -> dict[str, str]:
    """``base`` with series replaced (keys given as python identifiers → see ``KEYS``)."""
    return {**base, **{KEYS[k]: v for k, v in changes.items()}}


KEYS = {
    "up": f"up{{{OP}}}",
    "last_pass": f"joblease_operator_last_pass_timestamp_seconds{{{OP}}}",
    "errors": f'joblease_operator_object_errors_total{{{OP},stage="write"}}',
    "overdue": f"joblease_lease_overdue_max_seconds{{{OP}}}",
    "failed_writes": f'joblease_operator_writes_total{{{OP},kind="failed"}}',
    "failed_seen": f'joblease_transitions_total{{{OP},kind="failed"}}',
}
SLOW_EXPIRY = {f'joblease_expiry_lag_seconds_bucket{{{OP},le="{le}"}}': values
               for le, values in (("0.5", "0+0x40"), ("1", "0+0x40"), ("2", "0+1x40"),
                                  ("3", "0+20x40"), ("+Inf", "0+20x40"))}

SCENARIOS = [
    Scenario("healthy operator and workers", {**healthy_operator(), **fencing(100, "0+1x40")},
             {"10m": {}, "39m": {}}),
    Scenario("operator down from minute 3",
             with_(healthy_operator(), up="1 1 1 " + "0 " * 37),
             {"6m": {}, "10m": {"JobleaseOperatorDown": [{}]}}),
    Scenario("operator never scraped (no up series at all)",
             {k: v for k, v in healthy_operator().items() if not k.startswith("up{")},
             {"4m": {}, "10m": {"JobleaseOperatorDown": [{}]}}),
    Scenario("reconcile loop stuck from minute 3",
             with_(healthy_operator(), last_pass="0+60x3 180+0x37"),
             {"7m": {}, "10m": {"JobleaseOperatorNotReconciling": [OP_LABELS]}}),
    Scenario("operator keeps failing on objects",
             with_(healthy_operator(), errors="0+3x40"),
             {"8m": {}, "20m": {"JobleaseOperatorFailingOnObjects": [
                 {"job": "joblease-operator", "namespace": "joblease-system"}]}}),
    Scenario("one transient object error stays quiet",
             with_(healthy_operator(), errors="0 0 1+0x38"),
             {"5m": {}, "12m": {}, "20m": {}}),
    Scenario("expiry bookkeeping lagging (p99 between 2 and 3 s)",
             {**healthy_operator(), **SLOW_EXPIRY},
             {"8m": {}, "25m": {"JobleaseExpiryLagHigh": [{}]}}),
    Scenario("a lease held past leaseUntil, never marked Expired",
             with_(healthy_operator(), overdue="0+60x40"),
             {"5m": {}, "10m": {"JobleaseLeasesOverdue": [{}]}}),
    Scenario("the operator's expiry exhausted maxAttempts at minute 3",
             with_(healthy_operator(), failed_writes="0 0 0 1+0x37"),
             {"5m": {"JobleaseJobsFailed": [{}]}, "25m": {}}),
    Scenario("a worker's failed release exhausted maxAttempts at minute 3",
             with_(healthy_operator(), failed_seen="0 0 0 1+0x37"),
             {"5m": {"JobleaseJobsFailed": [{}]}, "25m": {}}),
    Scenario("a tenth of fenced writes refused",
             {**healthy_operator(), **fencing(100, "0+10x40")},
             {"10m": {}, "35m": {"JobleaseFencingRefusalsRising": [
                 {"job": "report-worker", "namespace": "payments"}]}}),
    Scenario("few writes, few refusals (under 5 in 15 minutes) stay quiet",
             {**healthy_operator(), **fencing(0, "0 0 1 1 1 1 1 2 2 2 2 2 2 3+0x27")},
             {"20m": {}, "35m": {}}),
]


def rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def promtool_tests(scenarios: list[Scenario]) -> dict[str, Any]:
    """The promtool unit-test document for ``scenarios`` (every alert checked every time)."""
    by_name = rules()
    tests = []
    for sc in scenarios:
        checks = []
        for at, firing in sc.expect.items():
            for alert, rule in by_name.items():
                checks.append({"eval_time": at, "alertname": alert, "exp_alerts": [
                    {"exp_labels": {**rule.get("labels", {}), **labels},
                     "exp_annotations": rule.get("annotations", {})}
                    for labels in firing.get(alert, [])]})
        tests.append({"name": sc.name, "interval": "1m",
                      "input_series": [{"series": s, "values": v} for s, v in sc.series.items()],
                      "alert_rule_test": checks})
    return {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}


def run_promtool(promtool: Path, tmp_path: Path, doc: dict[str, Any]
                 ) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "alerts_test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)


def test_rules_file_passes_promtool_check(promtool: Path) -> None:
    out = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout, out.stdout


def test_every_alert_fires_in_some_scenario_and_is_quiet_in_the_healthy_one() -> None:
    fired = {alert for sc in SCENARIOS for firing in sc.expect.values() for alert in firing}
    assert fired == set(rules()), f"alerts without a firing scenario: {set(rules()) - fired}"
    healthy = SCENARIOS[0]
    assert all(not firing for firing in healthy.expect.values())


def test_every_alert_has_severity_summary_and_runbook() -> None:
    for name, rule in rules().items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule["annotations"]["runbook_url"].endswith(
            "docs/operations.md#" + name.lower()), name


def test_scenarios_pass_promtool(promtool: Path, tmp_path: Path) -> None:
    out = run_promtool(promtool, tmp_path, promtool_tests(SCENARIOS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout, out.stdout


@pytest.mark.parametrize("wrong", ["silence", "extra"])
def test_the_harness_fails_on_a_wrong_expectation(promtool: Path, tmp_path: Path,
                                                  wrong: str) -> None:
    """Not vacuous: expecting silence where an alert fires (or the reverse) fails promtool."""
    down = next(sc for sc in SCENARIOS if sc.name.startswith("operator down"))
    healthy = SCENARIOS[0]
    bad = (Scenario(down.name, down.series, {"10m": {}}) if wrong == "silence" else
           Scenario(healthy.name, healthy.series, {"10m": {"JobleaseOperatorDown": [{}]}}))
    out = run_promtool(promtool, tmp_path, promtool_tests([bad]))
    assert out.returncode != 0
    assert "JobleaseOperatorDown" in out.stdout + out.stderr
