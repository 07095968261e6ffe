"""Issue 28: the reconcile pass works only on what is due (lazy due-time heaps in the view).

Each test tries to make the heaps lose a lease (a renewal that moves the end, a write that
fails or decides nothing because the view was behind, delete and re-create, a re-list that
drops what was deleted unseen) or do work for leases that need none.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from joblease.controller import metrics
from joblease.controller.reconciler import MAX_IDLE, RETRY, SOON, LeaseView, Reconciler
from joblease.domain.clock import ServerNow
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed, Phase

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
MARGIN = timedelta(milliseconds=250)


class Api:
    """A server clock the test moves (exact: no error)."""

    def __init__(self) -> None:
        self.at = T0

    def server_now(self) -> ServerNow:
        return ServerNow(self.at, self.at)

    def monotonic(self) -> float:
        return 0.0


class Store:
    """Compare-and-swap in memory; counts every read and write; can be told to fail."""

    def __init__(self, *leases: Observed) -> None:
        self.api = Api()
        self.objects = {o.name: o for o in leases}
        self.reads = 0
        self.writes: list[str] = []
        self.fail: Exception | None = None
        self.lock = threading.Lock()

    def get(self, namespace: str, name: str, timeout: float = 10.0) -> Observed:
        self.reads += 1
        return self.objects[name]

    def write_status(self, observed: Observed, status: LeaseStatus,
                     timeout: float = 10.0) -> Observed:
        with self.lock:
            if self.fail is not None:
                raise self.fail
            current = self.objects[observed.name]
            assert current.resource_version == observed.resource_version
            new = replace(current, resource_version=str(int(current.resource_version) + 1),
                          status=status)
            self.objects[observed.name] = new
            self.writes.append(observed.name)
            return new

    def delete_if_unchanged(self, obs: Observed, timeout: float = 10.0) -> None:
        with self.lock:
            del self.objects[obs.name]
            self.writes.append(f"delete {obs.name}")


def held(name: str, until: float, rv: int = 5, uid: str = "") -> Observed:
    at = T0 + timedelta(seconds=until)
    status = LeaseStatus(phase=Phase.HELD, holder="w", generation=1, epoch=1,
                         renew_time=at - timedelta(seconds=30), lease_until=at)
    return Observed("ns", name, uid or f"uid-{name}", str(rv), 1, LeaseSpec(), status)


def available(name: str) -> Observed:
    return Observed("ns", name, f"uid-{name}", "5", 1, LeaseSpec(), LeaseStatus())


def at(store: Store, seconds: float) -> None:
    store.api.at = T0 + timedelta(seconds=seconds)


class CountingDict(dict[Any, Any]):
    """The view's table of leases, counting how often a pass looks a lease up."""

    lookups = 0

    def get(self, key: Any, default: Any = None) -> Any:
        CountingDict.lookups += 1
        return super().get(key, default)


def test_an_idle_pass_looks_at_no_lease_and_a_due_one_only_at_those_due() -> None:
    view = LeaseView()
    view._leases = CountingDict()  # type: ignore[assignment]
    leases = [held(f"h{i}", until=3600) for i in range(5_000)]
    leases += [available(f"a{i}") for i in range(5_000)]
    leases += [held(f"due{i}", until=1) for i in range(3)]
    store = Store(*leases)
    for obs in leases:
        view.put(obs)
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    at(store, 0)
    CountingDict.lookups = 0
    assert reconciler.pass_once() == MAX_IDLE  # the earliest is 1.25 s away: capped
    assert CountingDict.lookups == 0 and store.writes == []
    at(store, 2)
    reconciler.pass_once()
    assert sorted(store.writes) == ["due0", "due1", "due2"]
    assert CountingDict.lookups <= 2 * 3  # the pop's look-up, the write's view update
    assert view.phases()[Phase.EXPIRED] == 3 and view.phases()[Phase.HELD] == 5_000


def test_a_renewal_moves_the_due_time_and_the_heap_learns_it_lazily() -> None:
    woken: list[str] = []
    view = LeaseView(on_sooner=lambda: woken.append("sooner"))
    store = Store(held("job", until=10, rv=6))
    view.put(held("job", until=1))
    assert woken == ["sooner"]  # the first due time of an empty view
    view.put(held("job", until=10, rv=6))  # renewed: later, so no new entry
    assert woken == ["sooner"] and len(view._expiries) == 1
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    at(store, 5)
    reconciler.pass_once()  # the entry at 1 s comes up, is found moved, goes back at 10 s
    assert store.writes == [] and store.reads == 0
    assert view.seconds_until_due(store.api.server_now(), MARGIN) == 5.25
    at(store, 10.3)
    reconciler.pass_once()
    assert store.writes == ["job"] and store.objects["job"].status.phase is Phase.EXPIRED


def test_a_lease_due_sooner_than_anything_wakes_the_loop_a_later_one_does_not() -> None:
    woken: list[str] = []
    view = LeaseView(on_sooner=lambda: woken.append("sooner"))
    view.put(held("a", until=10))
    view.put(held("b", until=20))
    view.put(available("c"))
    assert len(woken) == 1
    view.put(held("d", until=5))
    assert len(woken) == 2


def test_a_failed_write_is_tried_again_a_second_later_not_every_pass() -> None:
    store = Store(held("job", until=1))
    view = LeaseView()
    view.put(held("job", until=1))
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    store.fail = RuntimeError("an unforeseen error")
    at(store, 2)
    tries = store.reads
    assert reconciler.pass_once() > SOON
    assert store.reads == tries + 1
    reconciler.pass_once()
    assert store.reads == tries + 1  # not again at once
    store.fail = None
    at(store, 2 + RETRY.total_seconds())
    reconciler.pass_once()
    assert store.writes == ["job"]


def test_a_write_that_finds_the_view_behind_leaves_the_lease_scheduled() -> None:
    """The view holds an expired end, the server a renewal whose event is on its way.

    The fresh read decides nothing. The renewal's event then moves the end later, which
    pushes no entry; the lease must still be expired when the renewed lease runs out.
    """
    store = Store(held("job", until=40, rv=6))
    view = LeaseView()
    view.put(held("job", until=1))
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    at(store, 2)
    reconciler.pass_once()
    assert store.writes == []
    view.put(held("job", until=40, rv=6))  # the renewal's watch event
    at(store, 3.5)
    reconciler.pass_once()  # the follow-up entry comes up, goes back at 40 s
    assert store.writes == []
    at(store, 40.5)
    reconciler.pass_once()
    assert store.writes == ["job"]


def test_a_recreated_lease_is_scheduled_by_its_own_end_not_its_predecessors() -> None:
    store = Store(held("job", until=30, rv=9, uid="new"))
    view = LeaseView()
    view.put(held("job", until=1, uid="old"))
    view.drop("ns", "job", "old")
    view.put(held("job", until=30, rv=9, uid="new"))
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    at(store, 5)
    reconciler.pass_once()
    assert store.writes == []
    at(store, 31)
    reconciler.pass_once()
    assert store.writes == ["job"]


def test_ttl_deletions_come_after_expiries_within_the_bound() -> None:
    done = Observed("ns", "done", "uid-done", "5", 1, LeaseSpec(ttl_seconds_after_finished=5),
                    LeaseStatus(phase=Phase.COMPLETED, holder="w", generation=1, epoch=1,
                                finish_time=T0))
    late = held("late", until=1)
    store = Store(done, late)
    view = LeaseView()
    view.put(done)
    view.put(late)
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    reconciler.max_writes_per_pass = 1
    at(store, 4)
    assert reconciler.pass_once() > SOON and store.writes == ["late"]  # TTL not yet due
    at(store, 6)
    reconciler.pass_once()
    assert store.writes == ["late", "delete done"] and view.get("ns", "done") is None


def test_the_phase_counts_follow_versions_and_the_pass_exports_them() -> None:
    view = LeaseView()
    view.put(available("a"))
    view.put(held("b", until=3600))
    view.put(held("a", until=3600, rv=6))
    view.put(available("a"))  # an older version arriving late changes nothing
    assert view.phases()[Phase.HELD] == 2 and view.phases()[Phase.AVAILABLE] == 0
    view.drop("ns", "b", "uid-b")
    view.drop("ns", "a", "someone-else")
    assert view.phases()[Phase.HELD] == 1
    Reconciler(Store(), view, MARGIN).pass_once()  # type: ignore[arg-type]
    assert metrics.LEASES.labels("Held")._value.get() == 1
    assert metrics.LEASES.labels("Available")._value.get() == 0


def test_a_relist_forgets_only_what_it_did_not_show_in_its_own_scope() -> None:
    view = LeaseView()
    for obs in (held("kept", until=9), held("gone", until=9), available("x")):
        view.put(obs)
    view.put(replace(available("other"), namespace="elsewhere"))
    gone = view.forget_unlisted({("ns", "kept"), ("ns", "x")}, lambda ns: ns == "ns")
    assert [o.name for o in gone] == ["gone"]
    assert sorted(o.name for o in view.snapshot()) == ["kept", "other", "x"]
    assert view.phases()[Phase.HELD] == 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put-held", "put-available", "put-expired", "drop",
                                           "drop-other-uid", "forget", "old-version"]),
                          st.sampled_from(["a", "b", "c"])), max_size=30))
def test_the_held_leases_are_exactly_the_views_held_ones_after_any_sequence(
        steps: list[tuple[str, str]]) -> None:
    """The overdue gauges read ``held()`` instead of scanning every lease (issue 28): it must
    equal the scan's answer after every put, late event, drop and re-list."""
    view = LeaseView()
    rv = 10
    for step, name in steps:
        rv += 1
        if step == "put-held":
            view.put(held(name, until=rv, rv=rv))
        elif step == "put-available":
            view.put(replace(available(name), resource_version=str(rv)))
        elif step == "put-expired":
            base = held(name, until=rv, rv=rv)
            view.put(replace(base, status=replace(base.status, phase=Phase.EXPIRED)))
        elif step == "old-version":
            view.put(held(name, until=rv, rv=1))  # a late event: kept out if a newer is known
        elif step == "drop":
            view.drop("ns", name, f"uid-{name}")
        elif step == "drop-other-uid":
            view.drop("ns", name, "uid-of-an-earlier-incarnation")
        else:
            view.forget_unlisted({("ns", n) for n in "abc" if n != name}, lambda _ns: True)
        scanned = {o.name: o for o in view.snapshot() if o.status.phase is Phase.HELD}
        assert {o.name: o for o in view.held()} == scanned
        assert len(scanned) == view.phases()[Phase.HELD]

