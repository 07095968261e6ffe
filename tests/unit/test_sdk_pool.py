"""The thread-based work pool's own concerns (``joblease.sdk.pool.Pool``), in-memory.

What both pools share is tested once, for both, in ``tests/unit/test_pools.py``; here stay
the thread pool's clock injection (``joblease.sdk.pool.time``), its feed thread's failures,
the client's shared pool per selector and presence. The original summary:

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
from joblease.domain.errors import PoolClosedError
from joblease.kube.api import ForbiddenError, UnavailableError
from joblease.kube.leases import LeaseStore
from joblease.sdk.client import DEFAULT_MARGIN, LeaseClient
from joblease.sdk.pool import Pool
from support.fakekube import T_NOW, FakeKubeApi
from support.pools import ScriptedFeed, available, held_by_other, server, writes

LOST = UnavailableError(0, "Unavailable", "connection reset")


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




# -- claiming from the cache -------------------------------------------------------------------

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


# -- waiting -----------------------------------------------------------------------------------

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
