"""The thread-based work pool (``joblease.sdk.pool.Pool``) on the in-memory API server.

The claims are real (``LeaseClient``, ``LeaseStore`` and ``transact`` over
``support.fakekube``); only the list+watch is scripted (``ScriptedFeed`` stands in for
``joblease.kube.pool.LeaseFeed``, which ``tests/unit/test_kube_feed.py`` and the cluster tests
cover), so each test decides exactly which versions the pool's cache holds. Pinned here: a
claim is one conditional write decided from the cache; a lost race costs one request and
sets the name aside until a newer version arrives; a lost answer is retried on the same
name with the same claim id, pausing 50 ms doubling to 2 s, never past the timeout; a
claim that only recorded used-up attempts is not a lease; a waiter wakes on an event or at
the certain server time (no polling); a pool that never listed, was closed, or whose watch
died says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from joblease.core.presence import Presence
from joblease.core.steps import Stopped, SyncPort, drive
from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import PoolClosedError, format_time
from joblease.domain.lease import Observed
from joblease.kube.api import ForbiddenError, Response, UnavailableError
from joblease.kube.leases import LeaseStore
from joblease.sdk.client import DEFAULT_MARGIN, Lease, LeaseClient
from joblease.sdk.pool import Pool
from support.fakekube import T_NOW, FakeKubeApi, lease_object

LOST = UnavailableError(0, "Unavailable", "connection reset")


class ScriptedFeed:
    """``LeaseFeed``'s surface: lists the fake server's objects once, then waits for events.

    ``before_list`` is reported as trouble (and the list skipped) when set; ``crash`` is
    raised from ``run`` instead of listing (a bug in the feed's thread).
    """

    before_list: Exception | None = None
    crash: Exception | None = None

    def __init__(self, api: FakeKubeApi) -> None:
        self.api = api
        self.sink: Any = None
        self.listed = threading.Event()
        self.stopped = threading.Event()

    def run(self, sink: Any) -> None:
        self.sink = sink
        if self.crash is not None:
            raise self.crash
        if self.before_list is not None:
            sink.trouble(self.before_list)
        else:
            sink.replace([Observed.from_object(o) for o in self.api.objects.values()],
                         str(max(int(o["metadata"]["resourceVersion"])
                                 for o in self.api.objects.values())))
        self.listed.set()
        self.stopped.wait(30)

    def stop(self) -> None:
        self.stopped.set()

    def event(self, kind: str, name: str) -> None:
        """Deliver the fake server's current version of ``name`` as a watch event."""
        self.sink.apply(kind, Observed.from_object(self.api.stored("ns", name)))  # type: ignore[arg-type]


class FakeTime:
    """``time`` for ``joblease.sdk.pool``: ``sleep`` moves ``monotonic`` and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def feeds(monkeypatch: pytest.MonkeyPatch) -> list[ScriptedFeed]:
    made: list[ScriptedFeed] = []

    def feed(store: Any, namespace: str, selector: str, *, watch_seconds: int) -> ScriptedFeed:
        made.append(ScriptedFeed(store.api))
        return made[-1]

    monkeypatch.setattr("joblease.sdk.pool.LeaseFeed", feed)
    return made


def server(*jobs: tuple[str, dict[str, Any] | None, dict[str, Any]],
           api: FakeKubeApi | None = None) -> FakeKubeApi:
    """A fake API server holding ``(name, status, spec)`` jobs, created one second apart."""
    api = api or FakeKubeApi()
    for i, (name, status, spec) in enumerate(jobs):
        obj = lease_object(name, status, **spec)
        obj["metadata"]["creationTimestamp"] = format_time(T_NOW + timedelta(seconds=i))
        api.put_object(obj)
    return api


def available(name: str, **spec: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    return name, {"phase": "Available", "generation": 0, "epoch": 1}, spec


def held_by_other(name: str, until: float, **extra: Any
                  ) -> tuple[str, dict[str, Any], dict[str, Any]]:
    status = {"phase": "Held", "holder": "other", "generation": 1, "epoch": 1,
              "claimId": "theirs", "leaseUntil": format_time(T_NOW + timedelta(seconds=until)),
              **extra.pop("status", {})}
    return name, status, extra


def pool_over(api: FakeKubeApi, feeds: list[ScriptedFeed], **kwargs: Any
              ) -> tuple[LeaseClient, Pool, ScriptedFeed]:
    client = LeaseClient("ns", api=api, calibrate=False)  # type: ignore[arg-type]
    pool = client.pool("team=batch", **kwargs)
    assert feeds[-1].listed.wait(5) or feeds[-1].before_list is not None
    return client, pool, feeds[-1]


@pytest.fixture
def closing() -> Iterator[list[Pool]]:
    pools: list[Pool] = []
    yield pools
    for pool in pools:
        pool.close()


def writes(api: FakeKubeApi) -> list[tuple[str, str]]:
    return [(method, path.rsplit("/", 2)[-2] if path.endswith("/status") else
             path.rsplit("/", 1)[-1]) for method, path in api.requests]


# -- claiming from the cache -------------------------------------------------------------------

def test_each_claim_is_one_write_decided_from_the_cache_oldest_first(
        feeds: list[ScriptedFeed], closing: list[Pool]) -> None:
    api = server(available("first"), available("second"))
    _, pool, _ = pool_over(api, feeds, spread=1)
    closing.append(pool)
    one = pool.claim_next("w", timeout=0)
    two = pool.claim_next("w", timeout=0)
    assert isinstance(one, Lease) and isinstance(two, Lease)
    assert (one.name, one.holder, one.generation) == ("first", "w", 1)
    assert two.name == "second"  # the cache learned that "first" is held now
    assert writes(api) == [("PATCH", "first"), ("PATCH", "second")]  # no read to find work
    assert pool.claim_next("w", timeout=0) is None
    assert (pool.claims, pool.conflicts) == (2, 0)
    assert api.stored("ns", "first")["status"]["claimId"] == one.claim_id  # type: ignore[index]


def test_a_lost_race_costs_one_write_and_sets_the_name_aside_until_a_newer_version(
        feeds: list[ScriptedFeed], closing: list[Pool]) -> None:
    api = server(available("first"), available("second"))
    _, pool, feed = pool_over(api, feeds, spread=1)
    closing.append(pool)
    server(held_by_other("first", 30), api=api)  # another worker was faster
    got = pool.claim_next("w", timeout=0)
    assert got is not None and got.name == "second"
    assert writes(api) == [("PATCH", "first"), ("PATCH", "second")]
    assert (pool.claims, pool.conflicts) == (1, 1)
    assert pool.claim_next("w", timeout=0) is None  # "first" is not asked about again
    assert len(api.requests) == 2
    server(available("first"), api=api)  # released: the watch brings the newer version
    feed.event("MODIFIED", "first")
    again = pool.claim_next("w", timeout=0)
    assert again is not None and again.name == "first"


def test_a_lost_answer_is_retried_with_the_same_claim_id_and_a_landed_claim_adopted(
        feeds: list[ScriptedFeed], closing: list[Pool], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    api = server(available("first"))
    _, pool, _ = pool_over(api, feeds)
    closing.append(pool)
    clock = FakeTime()
    monkeypatch.setattr("joblease.sdk.pool.time", clock)
    real_request = api.request

    def request(method: str, path: str, body: Any = None, **kwargs: Any) -> Response:
        answer = real_request(method, path, body, **kwargs)
        if method == "PATCH" and len(api.requests) == 1:
            raise LOST  # the write landed, its answer did not
        return answer

    monkeypatch.setattr(api, "request", request)
    lease = pool.claim_next("w", timeout=10)
    assert lease is not None and lease.generation == 1
    assert writes(api) == [("PATCH", "first"), ("GET", "first")]  # adopted: no second write
    assert api.stored("ns", "first")["status"]["claimId"] == lease.claim_id  # type: ignore[index]
    assert clock.slept == [0.05]
    assert (pool.claims, pool.conflicts) == (1, 0)


@pytest.mark.parametrize(("timeout", "pauses"), [
    (3.0, [0.05, 0.1, 0.2, 0.4, 0.8]),  # the next pause (1.6) would end past the timeout
    (10.0, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]),  # doubling stops at 2 s
])
def test_lost_answers_are_retried_doubling_to_two_seconds_and_never_past_the_timeout(
        feeds: list[ScriptedFeed], closing: list[Pool], monkeypatch: pytest.MonkeyPatch,
        timeout: float, pauses: list[float]) -> None:
    api = server(available("first"))
    _, pool, _ = pool_over(api, feeds)
    closing.append(pool)
    clock = FakeTime()
    monkeypatch.setattr("joblease.sdk.pool.time", clock)
    api.refuse_next = [LOST] * 1000
    with pytest.raises(UnavailableError) as err:
        pool.claim_next("w", timeout=timeout)
    assert err.value is LOST
    assert clock.slept == pytest.approx(pauses)
    assert pool.conflicts == 0  # unknown is not refused


def test_a_claim_that_only_records_used_up_attempts_is_not_a_lease(
        feeds: list[ScriptedFeed], closing: list[Pool]) -> None:
    api = server(held_by_other("last", -60, maxAttempts=1))
    _, pool, _ = pool_over(api, feeds)
    closing.append(pool)
    assert pool.claim_next("w", timeout=0) is None
    assert api.stored("ns", "last")["status"]["phase"] == "Failed"  # type: ignore[index]
    assert (pool.claims, pool.conflicts) == (0, 0)
    assert pool.unfinished() == 0  # the cache learned the write


# -- waiting -----------------------------------------------------------------------------------

def test_a_waiting_claim_takes_what_the_watch_brings(feeds: list[ScriptedFeed],
                                                     closing: list[Pool]) -> None:
    api = server(held_by_other("busy", 3600))
    _, pool, feed = pool_over(api, feeds)
    closing.append(pool)
    got: list[Lease | None] = []
    waiter = threading.Thread(target=lambda: got.append(pool.claim_next("w", timeout=10)))
    start = time.monotonic()
    waiter.start()
    server(available("new"), api=api)
    feed.event("ADDED", "new")
    waiter.join(10)
    assert got and got[0] is not None and got[0].name == "new"
    assert time.monotonic() - start < 5


class RealTimeApi(FakeKubeApi):
    """A fake server whose clock runs with this process's (exact: no error interval)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()
        self.clock = ServerClock()
        self.clock.observe(0.0, 0.0, int(T_NOW.timestamp()))  # T_NOW is a whole second
        self.server_now_calls = 0

    def server_now(self) -> ServerNow:
        self.server_now_calls += 1
        return ServerNow.exact(T_NOW + timedelta(seconds=self.monotonic()))

    def monotonic(self) -> float:
        return time.monotonic() - self.start


def test_a_waiter_wakes_when_a_holders_end_plus_margin_has_certainly_passed_without_polling(
        feeds: list[ScriptedFeed], closing: list[Pool]) -> None:
    api = RealTimeApi()
    wake = 0.4
    server(held_by_other("busy", wake - DEFAULT_MARGIN.total_seconds()), api=api)
    _, pool, _ = pool_over(api, feeds)  # type: ignore[arg-type]
    closing.append(pool)
    lease = pool.claim_next("w", timeout=5)
    assert lease is not None and lease.name == "busy"
    assert api.monotonic() >= wake
    assert api.monotonic() < 3  # woken at the end, not at the timeout
    assert api.server_now_calls < 20  # it slept until then; it did not spin


def test_until_empty_returns_at_once_when_nothing_unfinished_is_left(
        feeds: list[ScriptedFeed], closing: list[Pool]) -> None:
    api = server(("done", {"phase": "Completed", "generation": 1, "epoch": 1}, {}))
    _, pool, _ = pool_over(api, feeds)
    closing.append(pool)
    start = time.monotonic()
    assert pool.claim_next("w", timeout=5, until_empty=True) is None
    assert time.monotonic() - start < 2
    assert pool.unfinished() == 0


def test_closing_the_pool_releases_a_waiting_claim(feeds: list[ScriptedFeed]) -> None:
    api = server(held_by_other("busy", 3600))
    _, pool, feed = pool_over(api, feeds)
    got: list[Lease | None] = ["not returned"]  # type: ignore[list-item]
    waiter = threading.Thread(target=lambda: got.__setitem__(0, pool.claim_next("w")))
    waiter.start()
    time.sleep(0.05)
    pool.close()
    pool.close()  # idempotent
    waiter.join(5)
    assert not waiter.is_alive() and got == [None]
    assert feed.stopped.is_set()


def test_a_dead_watch_stops_the_claims_with_its_cause(feeds: list[ScriptedFeed],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      closing: list[Pool]) -> None:
    boom = RuntimeError("boom")
    monkeypatch.setattr(ScriptedFeed, "crash", boom)
    client = LeaseClient("ns", api=server(available("a")), calibrate=False)  # type: ignore[arg-type]
    pool = client.pool("team=batch")
    closing.append(pool)
    with pytest.raises(PoolClosedError) as err:
        pool.claim_next("w", timeout=5)
    assert err.value.__cause__ is boom
    assert str(err.value) == "JobLease pool 'team=batch': its watch stopped: RuntimeError('boom')"


# -- before the first list ---------------------------------------------------------------------

def test_a_refused_list_is_raised_not_waited_for(feeds: list[ScriptedFeed],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 closing: list[Pool]) -> None:
    refused = ForbiddenError(403, "Forbidden", "cannot list jobleases")
    monkeypatch.setattr(ScriptedFeed, "before_list", refused)
    client = LeaseClient("ns", api=server(available("a")), calibrate=False)  # type: ignore[arg-type]
    pool = client.pool("team=batch")
    closing.append(pool)
    assert feeds[0].listed.wait(5)
    start = time.monotonic()
    with pytest.raises(ForbiddenError) as err:
        pool.claim_next("w", timeout=5)
    assert err.value is refused and time.monotonic() - start < 2


def test_an_unreachable_server_is_raised_once_the_timeout_passed(
        feeds: list[ScriptedFeed], monkeypatch: pytest.MonkeyPatch, closing: list[Pool]
        ) -> None:
    monkeypatch.setattr(ScriptedFeed, "before_list", LOST)
    client = LeaseClient("ns", api=server(available("a")), calibrate=False)  # type: ignore[arg-type]
    pool = client.pool("team=batch")
    closing.append(pool)
    assert feeds[0].listed.wait(5)
    with pytest.raises(UnavailableError) as err:
        pool.claim_next("w", timeout=0.1)
    assert err.value is LOST


def test_no_list_within_the_timeout_is_unavailable(feeds: list[ScriptedFeed],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   closing: list[Pool]) -> None:
    monkeypatch.setattr(ScriptedFeed, "run", lambda self, sink: self.stopped.wait(30))
    client = LeaseClient("ns", api=server(available("a")), calibrate=False)  # type: ignore[arg-type]
    pool = client.pool("team=batch")
    closing.append(pool)
    for call in (lambda: pool.claim_next("w", timeout=0.1), lambda: pool.unfinished(0.1)):
        start = time.monotonic()
        with pytest.raises(UnavailableError) as err:
            call()
        assert (err.value.status, err.value.reason) == (0, "NotSynced")
        assert "JobLease pool 'team=batch': no list" in err.value.message
        assert 0.1 <= time.monotonic() - start < 2


# -- the client's shared pools -----------------------------------------------------------------

def test_the_clients_claim_next_shares_one_pool_per_selector_until_closed(
        feeds: list[ScriptedFeed]) -> None:
    api = server(available("a"), available("b"))
    client = LeaseClient("ns", api=api, calibrate=False)  # type: ignore[arg-type]
    first = client.claim_next("team=batch", "w", timeout=0)
    second = client.claim_next("team=batch", "w", timeout=0)
    assert first is not None and second is not None and {first.name, second.name} == {"a", "b"}
    assert len(feeds) == 1
    client.close()
    assert feeds[0].stopped.is_set()
    with pytest.raises(RuntimeError, match="the LeaseClient is closed"):
        client.claim_next("team=batch", "w", timeout=0)


# -- presence (joblease.core.presence) --------------------------------------------------------

def test_a_pool_announces_its_worker_learns_the_others_and_leaves_on_close(
        feeds: list[ScriptedFeed]) -> None:
    api = server(available("job"))
    other = Presence("ns", "team=batch", "other-worker")
    with pytest.raises(Stopped):  # one round of another worker of the same pool
        drive(other.steps(type("Sink", (), {"workers": lambda self, live: None})()),
              SyncPort(LeaseStore(api), stop=_set_after_first_sleep()))  # type: ignore[arg-type]
    _, pool, _ = pool_over(api, feeds)
    try:
        assert pool.claim_next("me", timeout=5) is not None
        deadline = time.monotonic() + 5
        while pool.presence is None or pool.presence.counts.lists == 0:
            assert time.monotonic() < deadline, "presence never listed"
            time.sleep(0.01)
        assert pool.live_workers() == ["me", "other-worker"]
    finally:
        pool.close()
    # closing the pool deleted its own record; the other's stays until it lapses
    assert [obj["spec"]["holderIdentity"] for obj in api.presence.values()] == ["other-worker"]
    assert writes(api) == [("PATCH", "job")]  # presence never shows among the JobLease requests


def _set_after_first_sleep() -> threading.Event:
    stop = threading.Event()
    stop.set()  # the first Sleep ends the round at once
    return stop
