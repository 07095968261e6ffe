"""The operator on the real API server: expiry, TTL, Events, no stray writes (none at creation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from joblease import Phase
from joblease.controller.runtime import Operator
from joblease.controller.settings import OperatorSettings
from joblease.domain.lease import Observed
from joblease.kube.api import MERGE_PATCH, NotFoundError
from joblease.kube.leases import lease_path
from joblease.sdk.client import LeaseClient
from support.waiting import wait_for


def raw(leases: LeaseClient, name: str) -> dict[str, Any]:
    return leases.api.request("GET", lease_path(leases.namespace, name)).body


def test_operator_marks_expired_within_a_second_and_writes_nothing_at_creation(
        leases: LeaseClient, start_operator: Callable[..., Any]) -> None:
    op = start_operator()
    created = leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 2})
    obs = leases.get("job")  # born initialised (issue 28): nobody wrote it
    assert obs.status.phase is Phase.AVAILABLE and obs.status.generation == 0
    assert obs.resource_version == created.resource_version
    wait_for(lambda: op.metrics().get('joblease_leases{phase="Available"}', 0.0) >= 1, 10,
             "the operator to have seen the new JobLease", poll=0.05)
    assert leases.get("job").resource_version == created.resource_version  # and wrote nothing
    lease = leases.claim("job", holder="a")
    assert lease.lease_until is not None
    expired: Observed = wait_for(
        lambda: (o := leases.get("job")).status.phase is Phase.EXPIRED and o, 6, "Expired",
        poll=0.05)  # the lag below includes the polling interval
    lag = leases.api.server_now().latest - lease.lease_until
    assert lag.total_seconds() < 1.5, f"marked Expired {lag} after leaseUntil"
    assert (expired.status.holder, expired.status.generation, expired.status.attempts) == (
        "a", 1, 1)
    conditions = {c["type"]: c for c in expired.status.conditions}
    assert conditions["Held"]["status"] == "False" and conditions["Held"]["reason"] == "Expired"
    nxt = leases.claim("job", holder="b")
    assert nxt.generation == 2
    metrics = op.metrics()
    assert metrics['joblease_operator_writes_total{kind="expired"}'] >= 1


def test_operator_writes_nothing_while_a_holder_renews(
        leases: LeaseClient, start_operator: Callable[..., Any]) -> None:
    # Scoped to this test's namespace: the operator's counters are process-wide, and a
    # cluster-wide operator would (rightly) expire leases that earlier tests left Held.
    op = start_operator(namespaces=[leases.namespace])
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 3})
    wait_for(lambda: op.metrics().get("joblease_leases{phase=\"Available\"}", 0.0) >= 1, 10,
             "the operator to see the lease")
    before = op.metrics()
    lease = leases.claim("job", holder="a")
    versions = [lease._observed.resource_version]  # type: ignore[union-attr]
    for _ in range(20):
        time.sleep(0.1)
        lease.renew()  # a write from our cached version: any foreign write would 409 first
        versions.append(lease._observed.resource_version)  # type: ignore[union-attr]
    after = op.metrics()
    writes = {k: after[k] - before.get(k, 0.0) for k in after
              if k.startswith("joblease_operator_writes_total")}
    assert all(v == 0 for v in writes.values()), writes
    assert after.get("joblease_operator_conflicts_total", 0) == before.get(
        "joblease_operator_conflicts_total", 0)
    # every renewal's write was the very next version after our previous one: nobody else wrote
    obj = raw(leases, "job")
    assert obj["metadata"].get("annotations", {}) == {}
    assert obj["metadata"].get("finalizers", []) == []
    managers = {m["manager"] for m in obj["metadata"].get("managedFields", [])}
    assert not any("kopf" in m for m in managers), managers
    assert len(set(versions)) == 21
    assert after['joblease_transitions_total{kind="renewed"}'] >= 15


def test_ttl_deletes_finished_lease_and_events_tell_the_story(
        leases: LeaseClient, start_operator: Callable[..., Any], cluster: Any) -> None:
    # this namespace only: a cluster-wide operator would first expire what earlier tests
    # left Held, and its Events are rate-limited (issue 24)
    op = start_operator(namespaces=[leases.namespace])
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 5,
                                                  "ttlSecondsAfterFinished": 2})
    # Events name transitions between versions the operator saw: let it see the new one.
    wait_for(lambda: op.metrics().get('joblease_leases{phase="Available"}', 0.0) >= 1, 10,
             "the operator to see the lease")
    leases.claim("job", holder="a").complete("ok")

    def gone() -> bool:
        try:
            leases.get("job")
        except Exception as err:  # LeaseNotFoundError
            return "not found" in str(err)
        return False

    wait_for(gone, 10, "TTL deletion")
    events = cluster.kubectl("get", "events", "-n", leases.namespace, "-o",
                             "jsonpath={range .items[*]}{.reason}{'\\n'}{end}", check=True)
    reasons = set(events.stdout.split())
    assert {"Claimed", "Completed"} <= reasons, reasons
    assert "Created" not in reasons  # no Event per creation (issue 28): it was a write


def test_two_operator_replicas_stay_correct(leases: LeaseClient,
                                            start_operator: Callable[..., Any]) -> None:
    ops = [start_operator(), start_operator()]
    for i in range(5):
        leases.store.create(leases.namespace, f"job-{i}", {"leaseDurationSeconds": 1})
    held = [leases.claim(f"job-{i}", holder="a") for i in range(5)]
    wait_for(lambda: all(o.status.phase is Phase.EXPIRED
                         for o in leases.store.list(leases.namespace)), 8, "all Expired")
    for obs in leases.store.list(leases.namespace):
        assert obs.status.attempts == 1, "an expiry was counted twice"
        assert obs.status.generation == 1
    total = sum(op.metrics().get('joblease_operator_writes_total{kind="expired"}', 0.0)
                for op in ops)
    assert total == 5, f"{total} expiry writes for 5 leases: a duplicate slipped past CAS"
    nxt = [leases.claim(f"job-{i}", holder="b") for i in range(5)]
    assert [n.generation for n in nxt] == [2] * 5
    assert held and all(n.token > h.token for n, h in zip(nxt, held, strict=True))


def test_deleting_while_operator_runs_leaves_no_error(
        leases: LeaseClient, start_operator: Callable[..., Any]) -> None:
    op = start_operator()
    leases.store.create(leases.namespace, "job", {})
    wait_for(lambda: op.metrics().get("joblease_leases{phase=\"Available\"}", 0.0) >= 1, 10,
             "the operator to see the lease")
    leases.api.request("DELETE", lease_path(leases.namespace, "job"))
    with pytest.raises(NotFoundError):
        leases.api.request("GET", lease_path(leases.namespace, "job"))
    assert op.proc.poll() is None
    time.sleep(1.0)  # a pass of the reconcile loop over the deleted lease
    assert "Traceback" not in op.log.read_text()


def conflicts() -> float:
    return REGISTRY.get_sample_value("joblease_operator_conflicts_total") or 0.0


def deletions() -> float:
    return REGISTRY.get_sample_value("joblease_operator_writes_total", {"kind": "deleted"}) or 0.0


def test_every_conflict_the_operator_meets_is_counted(
        leases: LeaseClient, cluster: Any) -> None:
    """A real 409 from the real API server moves ``joblease_operator_conflicts_total``.

    The operator runs in this process with its JobLease feed left unstarted (its view fed by
    hand), so the test controls what it knows. Twice its conditional write meets a 409 from
    a foreign write (a label): first an expiry, whose fresh read is followed by the foreign
    write before its compare-and-swap (the read of the operator's own store is wrapped, so
    the count still comes through the store ``runtime`` built), then a TTL deletion from a
    version the foreign write has replaced (a DELETE with resourceVersion preconditions).
    Issue 31: the counter was defined, documented and plotted, and nothing incremented it.
    """
    ns = leases.namespace

    def touch() -> dict[str, Any]:
        """A write the operator's view never hears of: the object's next version."""
        return leases.api.request("PATCH", lease_path(ns, "job"),
                                  {"metadata": {"labels": {"touched": str(time.time_ns())}}},
                                  content_type=MERGE_PATCH).body

    async def wait(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    def touch_after_the_first_held_read(op: Operator) -> list[str]:
        """Wrap the operator's own store: a foreign write right after it reads a Held lease."""
        store = op.reconciler.store  # type: ignore[union-attr]
        real_get, touched = store.get, []

        def get(namespace: str, name: str, *args: Any, **kwargs: Any) -> Observed:
            obs = real_get(namespace, name, *args, **kwargs)
            if not touched and obs.status.phase == Phase.HELD:
                touched.append(touch()["metadata"]["resourceVersion"])
            return obs

        store.get = get  # type: ignore[method-assign]
        return touched

    async def scenario() -> tuple[float, float, float, list[str]]:
        settings = OperatorSettings(namespaces=(ns,), writers=1, metrics_port=0,
                                    kubeconfig=str(cluster.kubeconfig_for("admin")))
        op = Operator(settings)
        op._start_feeds = lambda api: None  # type: ignore[method-assign]  # fed by hand
        await op.start()
        try:
            touched = touch_after_the_first_held_read(op)
            leases.store.create(ns, "job", {"leaseDurationSeconds": 1,
                                            "ttlSecondsAfterFinished": 1})
            leases.claim("job", holder="a")
            before = conflicts()
            op.observe_lease({"type": "ADDED", "object": raw(leases, "job")})
            await wait(lambda: leases.get("job").status.phase == Phase.EXPIRED,
                       "the expiry", timeout=15)
            expiry = conflicts() - before
            leases.claim("job", holder="b").complete("done")
            finished = raw(leases, "job")
            touch()
            before = conflicts()
            op.observe_lease({"type": "MODIFIED", "object": finished})
            await wait(lambda: conflicts() > before, "the refused TTL deletion", timeout=15)
            deletion = conflicts() - before
            deleted = deletions()
            op.observe_lease({"type": "MODIFIED", "object": raw(leases, "job")})
            await wait(lambda: op.view.snapshot() == [], "the TTL deletion from the fresh view")
            deleted = deletions() - deleted
        finally:
            await op.stop()
        return expiry, deletion, deleted, touched

    expiry, deletion, deleted, touched = asyncio.run(scenario())
    assert len(touched) == 1  # the foreign write did land between the read and the write
    assert expiry == 1  # one 409, then a fresh read and the expiry that succeeded
    assert deleted == 1  # joblease_operator_writes_total{kind="deleted"}
    assert deletion >= 1  # one per pass until the view is fresh
    with pytest.raises(NotFoundError):
        raw(leases, "job")
