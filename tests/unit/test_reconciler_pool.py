"""The operator's pass: due transitions written once each, on the writer pool when enabled."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from joblease.controller.reconciler import LeaseView, Reconciler
from joblease.domain.clock import ServerNow
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed, Phase

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


class FakeApi:
    """A fixed server time, 10 s after every lease below ended."""

    def server_now(self) -> ServerNow:
        at = T0 + timedelta(seconds=10)
        return ServerNow(at, at)

    def monotonic(self) -> float:
        return 0.0


class FakeStore:
    """Stores versions in memory with compare-and-swap on resourceVersion (unit test only)."""

    def __init__(self, leases: list[Observed]) -> None:
        self.api = FakeApi()
        self.objects = {o.name: o for o in leases}
        self.writers: list[str] = []
        self.lock = threading.Lock()

    def get(self, namespace: str, name: str, timeout: float = 10.0) -> Observed:
        return self.objects[name]

    def write_status(self, observed: Observed, status: LeaseStatus,
                     timeout: float = 10.0) -> Observed:
        with self.lock:
            current = self.objects[observed.name]
            assert current.resource_version == observed.resource_version
            new = replace(current, resource_version=str(int(current.resource_version) + 1),
                          status=status, has_status=True)
            self.objects[observed.name] = new
            self.writers.append(threading.current_thread().name)
            return new

    def delete_if_unchanged(self, obs: Observed, timeout: float = 10.0) -> None:
        with self.lock:
            assert self.objects[obs.name].resource_version == obs.resource_version
            del self.objects[obs.name]
            self.writers.append(threading.current_thread().name)


def held(name: str) -> Observed:
    status = LeaseStatus(phase=Phase.HELD, holder="a", generation=1, epoch=1,
                         acquire_time=T0, renew_time=T0, lease_until=T0 + timedelta(seconds=1))
    return Observed("ns", name, f"uid-{name}", "5", 1, LeaseSpec(), status)


@pytest.mark.parametrize("writers", [1, 4])
def test_every_due_expiry_is_written_once(writers: int) -> None:
    leases = [held(f"job-{i}") for i in range(12)]
    store = FakeStore(leases)
    view = LeaseView()
    for obs in leases:
        view.put(obs)
    reconciler = Reconciler(store, view, timedelta(milliseconds=250),  # type: ignore[arg-type]
                            writers=writers)
    try:
        reconciler.pass_once()
    finally:
        reconciler.close()
    assert len(store.writers) == 12
    assert all(o.status.phase is Phase.EXPIRED and o.resource_version == "6"
               for o in store.objects.values())
    assert {o.status.phase for o in view.snapshot()} == {Phase.EXPIRED}
    on_pool = {name.startswith("joblease-write") for name in store.writers}
    assert on_pool == {writers > 1}


def test_the_view_keeps_no_conditions_and_an_expiry_keeps_finisheds_transition_time() -> None:
    """Issue 24: the view drops conditions; a write decides from a fresh read that has them.

    Deciding from the view's copy would have moved ``Finished``'s ``lastTransitionTime``
    (False → False is no transition) to the expiry's time, and lost any other condition.
    """
    earlier = "2026-12-03T11:00:00.000000Z"
    conditions = (
        {"type": "Held", "status": "True", "reason": "Claimed", "message": "claimed by 'a'",
         "lastTransitionTime": earlier, "observedGeneration": 1},
        {"type": "Finished", "status": "False", "reason": "Claimed", "message": "claimed",
         "lastTransitionTime": earlier, "observedGeneration": 1},
        {"type": "Custom", "status": "True", "reason": "Mine", "message": "kept",
         "lastTransitionTime": earlier, "observedGeneration": 1})
    lease = held("job")
    lease = replace(lease, status=replace(lease.status, conditions=conditions))
    store = FakeStore([lease])
    view = LeaseView()
    view.put(lease)
    assert view.snapshot()[0].status.conditions == ()
    reconciler = Reconciler(store, view, timedelta(milliseconds=250))  # type: ignore[arg-type]
    reconciler.pass_once()
    written = {c["type"]: c for c in store.objects["job"].status.conditions}
    assert store.objects["job"].status.phase is Phase.EXPIRED
    assert written["Finished"]["lastTransitionTime"] == earlier
    assert written["Held"]["status"] == "False"
    assert written["Held"]["lastTransitionTime"] != earlier
    assert written["Custom"]["message"] == "kept"
    assert view.snapshot()[0].status.conditions == ()


def finished(name: str) -> Observed:
    """Completed at T0 with a TTL of one second: due for deletion."""
    status = LeaseStatus(phase=Phase.COMPLETED, holder="a", generation=1, epoch=1,
                         finish_time=T0)
    return Observed("ns", name, f"uid-{name}", "5", 1,
                    LeaseSpec(ttl_seconds_after_finished=1), status)


def test_a_pass_writes_a_bounded_number_most_urgent_first() -> None:
    """Issue 24: a pass full of other due work held every expiry back for minutes.

    (Then 100,000 initializations; since issue 28 nothing is written for a new JobLease,
    and TTL deletions are the work an expiry must not wait behind.)
    """
    old = [finished(f"old-{i:03d}") for i in range(10)]
    late = held("late")
    store = FakeStore([*old, late])
    view = LeaseView()
    for obs in [*old, late]:  # the expiry is visited last
        view.put(obs)
    reconciler = Reconciler(store, view, timedelta(milliseconds=250))  # type: ignore[arg-type]
    reconciler.max_writes_per_pass = 4
    first = reconciler.pass_once()
    assert store.objects["late"].status.phase is Phase.EXPIRED
    def written() -> int:  # a write moves the resourceVersion, a deletion removes it
        return 11 - len(store.objects) + sum(1 for o in store.objects.values()
                                             if o.resource_version != "5")

    assert written() == 4
    assert first <= 0.02
    passes = 2
    while reconciler.pass_once() <= 0.02 and passes < 10:
        passes += 1
    assert written() == 11
    assert passes == 3  # 4 + 4 + 3 writes; the third pass found no more due


def test_an_expiry_decided_from_a_fresh_read_leaves_a_recreated_lease_alone() -> None:
    """Delete and re-create: the view still holds the old, expired incarnation.

    The expiry reads the object first (``write_basis``), finds the new incarnation held
    and not expired, and writes nothing.
    """
    old = held("job")
    new = replace(held("job"), uid="uid-new", resource_version="9",
                  status=replace(old.status, lease_until=T0 + timedelta(seconds=60)))
    store = FakeStore([new])
    view = LeaseView()
    view.put(old)
    reconciler = Reconciler(store, view, timedelta(milliseconds=250))  # type: ignore[arg-type]
    reconciler.pass_once()
    assert store.writers == []
    assert store.objects["job"] == new
