"""`python -m bench --quick` still runs end to end (its own control plane; about a minute).

A smoke test, not a measurement: it proves every section, the table and the JSON still
work, so the benchmark cannot rot silently. The numbers are in docs/benchmarks.md. Section
"pool" runs in a test of its own (it needs PostgreSQL too, and can be run alone), and so does
"scale" (``-k scale``: its phases restart the operator and kube-apiserver).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.paths import REPO

SECTIONS = ("latency", "contention", "throughput", "handover", "cli")


def _quick(out: Path, sections: tuple[str, ...],
           timeout: float) -> subprocess.CompletedProcess[str]:
    only = [arg for section in sections for arg in ("--only", section)]
    return subprocess.run([sys.executable, "-m", "bench", "--quick", *only, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_bench_quick_runs(tmp_path: Path) -> None:
    proc = _quick(tmp_path, SECTIONS, timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| measurement | joblease |" in proc.stdout
    assert "load average at start" in proc.stderr and "load average at end" in proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    for section in SECTIONS:
        assert section in results, section
    assert results["latency"]["floor"]["n"] > 0
    assert results["contention"]["errors"] == 0
    assert results["cli"]["verbs"]["get"]["wall_s"]["n"] == 3
    assert "`joblease claim`" in proc.stdout
    assert (tmp_path / "latest.md").read_text().startswith("| measurement |")


def test_bench_quick_scale_runs(tmp_path: Path) -> None:
    """Issue 28's phases ran and measured something, whichever operator is under test."""
    proc = _quick(tmp_path, ("scale",), timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    scale: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())["scale"]
    assert scale["renewals"]["writes_per_renewal"] == 0
    assert scale["expiry"]["expired"] == scale["expiry"]["leases"]
    start, restart, relist = scale["start"], scale["restart"], scale["relist"]
    assert start["caught_up"] and start["known"] >= scale["leases"], start
    assert start["cpu_s"] > 0 and start["requests_per_creation"] >= 0
    visible = start["visible"]
    assert visible["samples"] > 0 and visible["unseen"] == 0, visible
    assert scale["idle"]["seconds"] > 0 and scale["idle"]["cpu_ms_per_s"] >= 0
    # the operator's own histogram moved: passes ran in the window, and cost some CPU
    assert scale["idle"]["passes"] >= 1 and scale["idle"]["pass_cpu_ms"] > 0
    # a restart over initialized JobLeases writes none of them
    assert restart["settle"]["idle"] and restart["jobleases_writes"] == 0, restart
    assert restart["rss_mb_peak"] > 0 and restart["cpu_s"] > 0
    # after kube-apiserver's restart over a compacted etcd the operator listed all again
    assert relist["relisted_seconds"] is not None and relist["settle"]["idle"], relist
    assert relist["rss_mb_peak"] > 0
    bursts = scale["expiry_due_at_once"]
    assert [b["leases"] for b in bursts] == [20, 50], bursts
    for burst in bursts:
        assert burst["expired"] == burst["leases"] and burst["due_together"] > 0, burst
        assert burst["bound_s"] > 0
    for row in ("| start during the creation of 200 JobLeases: operator peak RSS",
                "| restart over 200 initialized JobLeases: operator peak RSS",
                "| forced relist (410): operator peak RSS", "| operator CPU per creation",
                "| expiry lag, 50 due at once"):
        assert row in proc.stdout, row


@pytest.mark.postgres
def test_bench_quick_pool_runs(tmp_path: Path) -> None:
    proc = _quick(tmp_path, ("pool",), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    pool: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())["pool"]
    drain, latency = pool["drain"], pool["latency"]
    workers = [f"pool-w{i:02d}" for i in range(pool["workers"])]
    # every job done once, by one of our workers, each of which exited cleanly
    assert drain["completed"] == pool["jobs"] == sum(drain["per_worker"]["counts"].values())
    assert set(drain["per_worker"]["counts"]) <= set(workers)
    assert drain["exit_codes"] == [0] * pool["workers"]
    assert drain["status_writes_per_job"] >= 2 and drain["wasted_per_job"] >= 0
    assert 0 < pool["ratio"] < math.inf and pool["floor_writes_per_s"] > 0
    # idle workers started every paced job, and drained on SIGTERM
    assert latency["created"]["n"] == latency["jobs"] and latency["created"]["p99"] < 30
    assert latency["exit_codes_after_sigterm"] == [0] * pool["workers"]
    # an abandoned lease is taken only once leaseUntil + margin (0.25 s) has passed
    expired = latency["after_expiry"]["samples"]
    assert expired and min(expired) >= 0.2, expired
    # the floor with the pool's bodies: every job's two writes, seen by its one watcher
    for real in (pool["floor_real_before"], pool["floor_real_after"]):
        assert real["conflicts"] == 0 and real["watcher_events"] == 2 * real["jobs"], real
    assert pool["floor_real_jobs_per_s"] > 0 and 0 < pool["ratio_real"] < math.inf
    assert drain["events_per_job"] > 0 and latency["events_per_job"] > 0
    assert latency["claimed"]["n"] == latency["jobs"]
    # the order runs drained every job, by one worker and by all of them
    for order in pool["order"].values():
        assert order["exit_codes"] == [0] * order["workers"] and order["late"]["n"] == order["jobs"]
    assert pool["postgres"].get("jobs_per_s", 0) > 0, pool["postgres"]
    assert "| pool: drain" in proc.stdout and "`FOR UPDATE SKIP LOCKED`" in proc.stdout
    assert "| pool: order, one worker" in proc.stdout
    _dispatched_sections_ran(pool, proc.stdout)


def _dispatched_sections_ran(pool: dict[str, Any], table: str) -> None:
    """Issue 30's dispatched order, urgent job and trickle measured something, each."""
    dispatched, workers = pool["dispatched"], pool["workers"]
    for key in ("order", "urgent", "trickle"):
        assert "error" not in dispatched[key], dispatched[key]
    order, urgent, trickle = dispatched["order"], dispatched["urgent"], dispatched["trickle"]
    assert order["late"]["n"] == order["jobs"] and order["exit_codes"] == [0] * workers
    claims = order["dispatch"]
    assert claims["claimed_by_dispatcher"] + claims["claimed_by_workers"] == order["jobs"]
    assert claims["claimed_by_dispatcher"] > 0, claims
    # every urgent job was claimed, each round read from the server's records
    assert urgent["wait_s"]["n"] == urgent["rounds"] == len(urgent["samples"]) > 0
    assert all(s["busy"] <= workers for s in urgent["samples"]), urgent["samples"]
    # the dispatcher's own figures (once overwritten by the claims the rounds were read from)
    assert urgent["dispatch"]["claimed_by_dispatcher"] >= urgent["rounds"], urgent["dispatch"]
    assert trickle["claimed"]["n"] == trickle["jobs"] and trickle["events_per_job"] > 0
    assert trickle["exit_codes_after_sigterm"] == [0] * workers
    # the drain whose dispatcher is killed halfway (counted from its own view): the workers
    # fell back to turns and claimed the rest themselves
    killed = dispatched["killed_halfway"]["dispatch"]
    assert killed["claimed_by_workers"] > 0 and killed["fallback_s"] >= 0, killed
    # the host's CPU per job, floor and dispatched drain, read from /proc
    for phase in ("floor", "dispatched"):
        budget = pool["cpu_budget"][phase]
        assert budget["kube-apiserver"] > 0 and budget["etcd"] > 0, budget
        assert 0 < budget["busy_fraction"] <= 1 and budget["busy"] <= budget["capacity"], budget
    assert pool["dispatched"]["drain"]["requests_per_job"]["PATCH leases"] > 0  # the inboxes
    for row in ("| pool, dispatched: drain", "| pool, dispatched: order",
                "| pool, dispatched: an urgent job", "| pool, dispatched: trickle",
                "| pool, dispatched: the host's CPU per job"):
        assert row in table, row
