"""The dispatcher's record and its view of the workers, on the in-memory API server.

``joblease.core.dispatcher.DispatcherRecord`` is the leader election among a pool's
dispatcher replicas; until this file only the cluster suites drove it (its mutants had no
unit test at all). Pinned here on the wire, with the fake server's 409s and 404s as the real
one answers them: a replica creates the record when there is none, renews it while it is its
own (identity *and* replica), takes it over exactly at its lapse on the server's earliest
time and not before; each write is conditional, so a replica that lost the race between its
read and its write is told so (``False``), never both; the record publishes the pool's
unfinished jobs for narrow workers; leaving deletes only one's own record, conditionally.
Also the dispatcher's list of workers (live records only, their slots), its round of the
election (what it publishes, a refusal as "not the leader"), ``for_client`` and ``whoami``.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from joblease.core.dispatcher import (
    RECORD_SECONDS,
    REPLICA_ANNOTATION,
    Dispatcher,
    DispatcherRecord,
    dispatcher_record_name,
    whoami,
)
from joblease.core.presence import (
    DISPATCHER_ROLE,
    POOL_LABEL,
    ROLE_LABEL,
    SLOTS_ANNOTATION,
    UNFINISHED_ANNOTATION,
    micro_time,
    pool_key,
    record_name,
)
from joblease.core.steps import Call, SyncPort, drive
from joblease.domain.clock import ServerNow
from joblease.domain.lease import Observed
from joblease.domain.time import parse_time
from joblease.kube.api import MERGE_PATCH, ForbiddenError
from joblease.kube.leases import LeaseStore
from support.fakekube import T_NOW, FakeKubeApi, lease_object

SELECTOR = "team=batch"
POOL = pool_key(SELECTOR)
NAME = dispatcher_record_name(POOL)
KEY = ("ns", NAME)
# an error interval: the lapse is judged on the earliest time, the record carries the midpoint
NOW = ServerNow(T_NOW - timedelta(seconds=1), T_NOW + timedelta(seconds=1))


def record(identity: str = "op", replica: str = "r1", seconds: int = RECORD_SECONDS
           ) -> DispatcherRecord:
    return DispatcherRecord("ns", SELECTOR, identity, replica=replica, seconds=seconds)


def hold(rec: DispatcherRecord, api: FakeKubeApi, unfinished: int | None = None,
         port: SyncPort | None = None) -> bool:
    return drive(rec.hold_steps(unfinished), port or SyncPort(LeaseStore(api)))  # type: ignore[arg-type]


def server(now: ServerNow = NOW) -> FakeKubeApi:
    return FakeKubeApi(now=now)


def test_the_record_name_is_the_pools_digest() -> None:
    assert f"joblease-dispatcher-{POOL}" == NAME
    assert record().name == NAME and record().pool == POOL


def test_with_no_record_a_replica_creates_it_with_the_servers_time() -> None:
    api = server()
    assert hold(record(), api, unfinished=7) is True
    assert [m for m, _ in api.presence_requests] == ["GET", "POST"]
    stored = api.presence[KEY]
    assert stored["apiVersion"] == "coordination.k8s.io/v1" and stored["kind"] == "Lease"
    assert stored["metadata"]["name"] == NAME
    assert stored["metadata"]["labels"] == {POOL_LABEL: POOL, ROLE_LABEL: DISPATCHER_ROLE}
    assert stored["metadata"]["annotations"] == {REPLICA_ANNOTATION: "r1",
                                                 UNFINISHED_ANNOTATION: "7"}
    assert stored["spec"] == {"holderIdentity": "op", "leaseDurationSeconds": RECORD_SECONDS,
                              "renewTime": micro_time(T_NOW), "acquireTime": micro_time(T_NOW)}


def test_a_record_made_without_a_count_publishes_none() -> None:
    api = server()
    assert hold(record(seconds=4), api) is True
    stored = api.presence[KEY]
    assert stored["metadata"]["annotations"] == {REPLICA_ANNOTATION: "r1"}
    assert stored["spec"]["leaseDurationSeconds"] == 4


def test_a_replica_without_a_name_of_its_own_gets_a_random_one() -> None:
    a = DispatcherRecord("ns", SELECTOR, "op")
    b = DispatcherRecord("ns", SELECTOR, "op")
    assert a.replica != b.replica and len(a.replica) == 12
    assert a.seconds == RECORD_SECONDS


class CreatedMeanwhile(SyncPort):
    """Another replica's create lands between this one's read and its own create."""

    def __init__(self, api: FakeKubeApi) -> None:
        super().__init__(LeaseStore(api))  # type: ignore[arg-type]
        self.fake = api

    def perform(self, step: Any) -> Any:
        if isinstance(step, Call) and step.call.method == "POST":
            hold(record(replica="other"), self.fake)
        return super().perform(step)


def test_two_replicas_creating_at_once_cannot_both_win() -> None:
    api = server()
    assert hold(record(), api, port=CreatedMeanwhile(api)) is False
    assert api.presence[KEY]["metadata"]["annotations"][REPLICA_ANNOTATION] == "other"


def test_the_holder_renews_its_record_conditionally_and_publishes_the_count() -> None:
    api = server()
    mine = record()
    hold(mine, api, unfinished=3)
    version = api.presence[KEY]["metadata"]["resourceVersion"]
    api.now = ServerNow.exact(T_NOW + timedelta(seconds=5))
    api.presence_requests.clear()
    port = Recording(api)
    assert hold(mine, api, unfinished=2, port=port) is True
    assert [m for m, _ in api.presence_requests] == ["GET", "PATCH"]
    assert port.content_types == [None, MERGE_PATCH]  # a merge patch, as the server needs
    stored = api.presence[KEY]
    assert stored["metadata"]["resourceVersion"] != version
    assert stored["metadata"]["annotations"][UNFINISHED_ANNOTATION] == "2"
    assert stored["spec"]["renewTime"] == micro_time(T_NOW + timedelta(seconds=5))
    assert stored["spec"]["acquireTime"] == micro_time(T_NOW)  # a renewal is no new claim


class Recording(SyncPort):
    """Records each call's content type."""

    def __init__(self, api: FakeKubeApi) -> None:
        super().__init__(LeaseStore(api))  # type: ignore[arg-type]
        self.content_types: list[str | None] = []

    def perform(self, step: Any) -> Any:
        if isinstance(step, Call):
            self.content_types.append(step.call.content_type)
        return super().perform(step)


class ChangedMeanwhile(SyncPort):
    """The record changes (or goes) between this replica's read and its patch."""

    def __init__(self, api: FakeKubeApi, delete: bool) -> None:
        super().__init__(LeaseStore(api))  # type: ignore[arg-type]
        self.fake, self.delete = api, delete

    def perform(self, step: Any) -> Any:
        if isinstance(step, Call) and step.call.method == "PATCH":
            if self.delete:
                del self.fake.presence[KEY]
            else:
                self.fake.presence[KEY]["metadata"]["resourceVersion"] = "changed"
        return super().perform(step)


@pytest.mark.parametrize("delete", [False, True], ids=["changed", "deleted"])
def test_a_renewal_that_lost_the_record_between_read_and_write_is_not_leadership(
        delete: bool) -> None:
    api = server()
    mine = record()
    hold(mine, api)
    assert hold(mine, api, port=ChangedMeanwhile(api, delete)) is False


def until_of(api: FakeKubeApi) -> Any:
    spec = api.presence[KEY]["spec"]
    return parse_time(spec["renewTime"]) + timedelta(seconds=spec["leaseDurationSeconds"])


def test_another_replicas_live_record_is_left_alone_until_its_lapse_on_the_earliest_time(
) -> None:
    api = server(ServerNow.exact(T_NOW))
    hold(record(replica="other"), api)
    until = until_of(api)
    theirs = api.presence[KEY]
    api.presence_requests.clear()
    # just before the lapse on the earliest time (the latest is past it): not taken over
    api.now = ServerNow(until - timedelta(milliseconds=1), until + timedelta(seconds=5))
    assert hold(record(), api) is False
    assert [m for m, _ in api.presence_requests] == ["GET"] and api.presence[KEY] == theirs
    # at the lapse exactly: taken over, with one conditional write
    api.now = ServerNow.exact(until)
    assert hold(record(), api, unfinished=1) is True
    stored = api.presence[KEY]
    assert stored["spec"]["holderIdentity"] == "op"
    assert stored["metadata"]["annotations"][REPLICA_ANNOTATION] == "r1"
    assert stored["spec"]["renewTime"] == micro_time(until)


@pytest.mark.parametrize(("identity", "replica"), [("op", "r2"), ("someone", "r1")],
                         ids=["same-identity-other-replica", "same-replica-other-identity"])
def test_a_record_is_ones_own_only_by_identity_and_replica(identity: str, replica: str
                                                          ) -> None:
    api = server()
    hold(record(identity, replica), api)
    assert hold(record(), api) is False
    assert hold(record(identity, replica), api) is True


def test_an_unreadable_record_is_taken_over() -> None:
    api = server()
    hold(record(replica="other"), api)
    del api.presence[KEY]["spec"]["renewTime"]
    assert hold(record(), api) is True
    assert api.presence[KEY]["spec"]["holderIdentity"] == "op"
    assert api.presence[KEY]["metadata"]["annotations"][REPLICA_ANNOTATION] == "r1"


def test_a_record_without_metadata_or_spec_is_no_ones() -> None:
    assert record()._is_mine({}) is False
    assert record()._is_mine({"metadata": None, "spec": None}) is False
    assert record()._is_mine({"metadata": {"annotations": {REPLICA_ANNOTATION: "r1"}},
                              "spec": {"holderIdentity": "op"}}) is True


def test_leaving_deletes_only_ones_own_record() -> None:
    api = server()
    hold(record(replica="other"), api)
    drive(record().leave_steps(), SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert KEY in api.presence
    assert [m for m, _ in api.presence_requests][-1] == "GET"
    drive(record(replica="other").leave_steps(), SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert KEY not in api.presence


class DeleteAfterChange(SyncPort):
    def __init__(self, api: FakeKubeApi) -> None:
        super().__init__(LeaseStore(api))  # type: ignore[arg-type]
        self.fake = api

    def perform(self, step: Any) -> Any:
        if isinstance(step, Call) and step.call.method == "DELETE":
            assert step.call.body == {"preconditions": {
                "resourceVersion": self.fake.presence[KEY]["metadata"]["resourceVersion"]}}
            self.fake.presence[KEY]["metadata"]["resourceVersion"] = "renewed-since"
        return super().perform(step)


def test_leaving_is_conditional_and_its_failures_are_only_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    api = server()
    mine = record()
    hold(mine, api)
    with caplog.at_level(logging.DEBUG, logger="joblease.core.dispatcher"):
        drive(mine.leave_steps(), DeleteAfterChange(api))  # 409: left in place, no raise
        assert KEY in api.presence
        del api.presence[KEY]
        drive(mine.leave_steps(), SyncPort(LeaseStore(api)))  # type: ignore[arg-type]  # 404
    assert [r.getMessage() for r in caplog.records] == [
        f"dispatcher record {NAME}: leaving: 409 Conflict: the object has been modified",
        f"dispatcher record {NAME}: leaving: 404 NotFound: leases {NAME!r} not found",
    ]


# -- the dispatcher's side: workers, its round of the election, construction ---------------

def worker_record(api: FakeKubeApi, who: str, renewed: Any, slots: int | None,
                  selector: str = SELECTOR) -> None:
    annotations = {} if slots is None else {SLOTS_ANNOTATION: str(slots)}
    api.presence[("ns", record_name(pool_key(selector), who))] = {
        "metadata": {"name": record_name(pool_key(selector), who),
                     "labels": {POOL_LABEL: pool_key(selector)}, "annotations": annotations},
        "spec": {"holderIdentity": who, "leaseDurationSeconds": 15,
                 "renewTime": micro_time(renewed)}}


def dispatcher(api: FakeKubeApi) -> Dispatcher:
    made = Dispatcher(LeaseStore(api), api, lambda: timedelta(seconds=1),  # type: ignore[arg-type]
                      "ns", SELECTOR, "op", record_seconds=7)
    made._executor.shutdown()
    return made


def test_the_dispatcher_sees_the_live_workers_of_its_pool_and_their_slots() -> None:
    api = server(ServerNow.exact(T_NOW))
    worker_record(api, "w1", T_NOW, 3)
    worker_record(api, "w2", T_NOW, None)  # live, no slots announced: gets no assignment
    worker_record(api, "gone", T_NOW - timedelta(seconds=15), 4)  # lapsed exactly now
    worker_record(api, "x1", T_NOW, 5, selector="team=other")
    made = dispatcher(api)
    made._list_workers(SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert made._live == {"w1", "w2"}
    assert made._slots == {"w1": 3}
    assert api.presence_requests[-1] == ("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases")


class Refusing(SyncPort):
    def perform(self, step: Any) -> Any:
        raise ForbiddenError(403, "Forbidden", "leases is forbidden")


def test_a_refused_list_of_workers_keeps_the_last_one_and_says_why(
        caplog: pytest.LogCaptureFixture) -> None:
    api = server()
    made = dispatcher(api)
    made._live, made._slots = {"w1"}, {"w1": 2}
    made._list_workers(Refusing(LeaseStore(api)))  # type: ignore[arg-type]
    assert (made._live, made._slots) == ({"w1"}, {"w1": 2})
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "dispatcher of 'team=batch': listing workers: "
                          "403 Forbidden: leases is forbidden")]


def test_its_round_of_the_election_publishes_the_queue_once_listed(
        caplog: pytest.LogCaptureFixture) -> None:
    api = server()
    api.put_object(lease_object("a", {"phase": "Available", "generation": 0, "epoch": 1}))
    api.put_object(lease_object("b", {"phase": "Completed", "generation": 1, "epoch": 1}))
    made = dispatcher(api)
    port = SyncPort(LeaseStore(api))  # type: ignore[arg-type]
    assert made._hold(port) is True
    assert UNFINISHED_ANNOTATION not in api.presence[KEY]["metadata"]["annotations"]
    assert api.presence[KEY]["spec"]["leaseDurationSeconds"] == 7
    made.replace([Observed.from_object(o) for o in api.objects.values()], "1")
    assert made._hold(port) is True
    assert api.presence[KEY]["metadata"]["annotations"][UNFINISHED_ANNOTATION] == "1"
    assert made._hold(Refusing(LeaseStore(api))) is False  # type: ignore[arg-type]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "dispatcher of 'team=batch': its record: "
                          "403 Forbidden: leases is forbidden")]


class Client:
    """The surface ``Dispatcher.for_client`` uses of a ``LeaseClient``."""

    def __init__(self, api: FakeKubeApi) -> None:
        self.api, self.store, self.namespace = api, LeaseStore(api), "ns"  # type: ignore[arg-type]
        self.calibrations = 0

    def calibrate_if_due(self) -> None:
        self.calibrations += 1

    def margin(self) -> timedelta:
        return timedelta(seconds=2)


def test_a_dispatcher_for_a_client_uses_its_store_clock_margin_and_username() -> None:
    api = server()
    api.whoami = lambda: "system:serviceaccount:ns:op"  # type: ignore[attr-defined]
    client = Client(api)
    made = Dispatcher.for_client(client, SELECTOR, in_flight=3)
    made._executor.shutdown()
    assert client.calibrations == 1
    assert made.store is client.store and made.api is client.api  # type: ignore[comparison-overlap]
    assert (made.namespace, made.selector) == ("ns", SELECTOR)
    assert made.margin() == timedelta(seconds=2) and made.in_flight == 3
    assert made.record.identity == "system:serviceaccount:ns:op"
    named = Dispatcher.for_client(client, SELECTOR, "someone")
    named._executor.shutdown()
    assert named.record.identity == "someone"
    assert whoami(client.store) == "system:serviceaccount:ns:op"


# -- the dispatcher's life: its threads, started and stopped --------------------------------

class OneList:
    """A feed that lists the store's JobLeases once, then waits to be stopped."""

    def __init__(self, api: FakeKubeApi, fail: Exception | None = None) -> None:
        self.api, self.fail = api, fail
        self.stopped = threading.Event()

    def run(self, sink: Any) -> None:
        if self.fail is not None:
            raise self.fail
        sink.replace([Observed.from_object(o) for o in self.api.objects.values()], "5")
        self.stopped.wait(10)

    def stop(self) -> None:
        self.stopped.set()


def until(condition: Any) -> bool:
    deadline = time.monotonic() + 10  # the dispatcher's threads; bounded, not timed
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def test_a_started_dispatcher_leads_assigns_and_on_close_deletes_its_record() -> None:
    api = server(ServerNow.exact(T_NOW))
    api.put_object(lease_object("j", {"phase": "Available", "generation": 0, "epoch": 1},
                                dispatch={"enabled": True, "serviceAccountNames": ["w1"]}))
    worker_record(api, "system:serviceaccount:ns:w1", T_NOW, 1)
    made = Dispatcher(LeaseStore(api), api, lambda: timedelta(seconds=1),  # type: ignore[arg-type]
                      "ns", SELECTOR, "op")
    made.feed = OneList(api)  # type: ignore[assignment]
    made.start()
    assert until(lambda: (api.stored("ns", "j") or {}).get("status", {}).get("holder")
                 == "system:serviceaccount:ns:w1")
    assert made.leader and made.counts.assigned == 1 and KEY in api.presence

    def rounds() -> tuple[int, int]:
        path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
        return (api.presence_requests.count(("PATCH", f"{path}/{NAME}")),
                api.presence_requests.count(("GET", path)))

    renewed, listed = rounds()
    api._monotonic += 2.0  # the renewal period (and the list's) passed on its clock
    assert until(lambda: rounds()[0] > renewed and rounds()[1] > listed)  # renews, lists again
    assert sorted(t.name for t in made._threads) == [
        f"joblease-dispatch-feed[{SELECTOR}]", f"joblease-dispatch-record[{SELECTOR}]",
        f"joblease-dispatcher[{SELECTOR}]"]
    made.close()
    assert KEY not in api.presence  # workers take turns again at their next list
    assert made.feed.stopped.is_set()  # type: ignore[attr-defined]
    assert not any(t.is_alive() for t in made._threads)


def test_a_dispatcher_whose_feed_dies_says_so_and_stops(
        caplog: pytest.LogCaptureFixture) -> None:
    api = server()
    made = Dispatcher(LeaseStore(api), api, lambda: timedelta(seconds=1),  # type: ignore[arg-type]
                      "ns", SELECTOR, "op")
    boom = RuntimeError("boom")
    made.feed = OneList(api, fail=boom)  # type: ignore[assignment]
    made.start()
    assert until(lambda: not any(t.is_alive() for t in made._threads))
    made.kill()
    assert [(r.levelno, r.getMessage(), r.exc_info and r.exc_info[1]) for r in caplog.records
            if r.levelno >= logging.WARNING] == [
        (logging.ERROR, f"dispatcher of {SELECTOR!r}: its watch stopped", boom)]


def test_a_dispatcher_whose_record_thread_meets_a_bug_says_so_stops_and_leads_no_more(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only an ``ApiError``: any exception in the record's thread (safety.md #59's kind)
    must not leave a dispatcher that believes it leads while nothing renews its record."""
    api = server(ServerNow.exact(T_NOW))
    made = Dispatcher(LeaseStore(api), api, lambda: timedelta(seconds=1),  # type: ignore[arg-type]
                      "ns", SELECTOR, "op")
    made.feed = OneList(api)  # type: ignore[assignment]
    boom = RuntimeError("boom")

    def broken(port: Any) -> bool:
        raise boom

    monkeypatch.setattr(made, "_list_workers", broken)
    made.start()
    assert until(lambda: not any(t.is_alive() for t in made._threads[1:]))
    assert not made.leader
    made.kill()
    assert [(r.levelno, r.getMessage(), r.exc_info and r.exc_info[1]) for r in caplog.records
            if r.levelno >= logging.WARNING] == [
        (logging.ERROR, f"dispatcher of {SELECTOR!r}: its record thread stopped", boom)]


def test_a_dispatchers_defaults() -> None:
    from joblease.core.dispatcher import IN_FLIGHT, MAX_SLOTS
    from joblease.domain.dispatch import ADOPT_WITHIN

    api = server()
    made = Dispatcher(LeaseStore(api), api, lambda: timedelta(seconds=1),  # type: ignore[arg-type]
                      "ns", SELECTOR, "op")
    made._executor.shutdown()
    assert (made.max_slots, made.in_flight, made.adopt_within) == (
        MAX_SLOTS, IN_FLIGHT, ADOPT_WITHIN)
    assert (made.record.identity, made.record.seconds, made.record.pool) == (
        "op", RECORD_SECONDS, POOL)
    assert (made.namespace, made.selector, made.leader) == ("ns", SELECTOR, False)
    assert made._executor._max_workers == IN_FLIGHT  # type: ignore[attr-defined]
    assert (made.feed.store, made.feed.namespace, made.feed.label_selector,
            made.feed.watch_seconds) == (made.store, "ns", SELECTOR, 300)
    assert all(t.daemon for t in made._threads)
