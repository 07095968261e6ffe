"""The two work pools, one behaviour: ``Pool`` and ``AsyncPool`` run the same test bodies.

Issue 23, item 3. The claims are real (either client over the in-memory API server); the
list+watch is scripted (``support.pools.ScriptedFeed``) so each test decides which versions
the cache holds — for ``AsyncPool`` its events are delivered on its own event loop, as its
feed task would. Pinned for both: a claim is one conditional write decided from the cache;
a lost race costs one write and sets the name aside until a newer version; a lost answer is
retried with the same claim id and the landed claim adopted; a claim that only recorded
used-up attempts is not a lease and the cache learns the Failed version; a waiting claim
takes what the watch brings; ``until_empty``; closing releases a waiting claim; a dead
watch stops the claims with its cause; a refused first list is raised at once, an
unreachable one after the timeout, no list at all as ``NotSynced``; presence is announced
by the first holder and left on close; the client shares one pool per selector until
closed. The thread pool's own concerns (its clock injection: the pause schedule of lost
answers, a waiter's wake-up without polling) stay in ``test_sdk_pool.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from joblease.aio.pool import AsyncPool, _Sink
from joblease.core.presence import Presence
from joblease.core.steps import Stopped, SyncPort, drive
from joblease.domain.errors import PoolClosedError
from joblease.kube.api import ForbiddenError, UnavailableError
from joblease.kube.leases import LeaseStore
from joblease.sdk.pool import Pool
from support.clients import KINDS, LOOP, Client, LeaseView, client_over, fake_sleep
from support.fakekube import FakeKubeApi
from support.pools import ScriptedFeed, available, held_by_other, server, writes

pytestmark = pytest.mark.parametrize("kind", KINDS)
LOST = UnavailableError(0, "Unavailable", "connection reset")


class AsyncScriptedFeed(ScriptedFeed):
    """``ScriptedFeed`` for ``AsyncPool``: lists once, then delivers events on the pool's loop."""

    async def arun(self, sink: Any) -> None:
        try:
            self.list_step(sink)
            while not self.stopped.is_set():
                await asyncio.sleep(0.01)
        finally:  # cancelled with its pool: the feed ended, as ScriptedFeed's stop says
            self.stopped.set()

    def event(self, kind: str, name: str) -> None:
        self._on_loop(lambda: ScriptedFeed.event(self, kind, name))

    def relist(self) -> None:
        self._on_loop(lambda: ScriptedFeed.relist(self))

    def _on_loop(self, deliver: Callable[[], None]) -> None:
        """Run ``deliver`` on the pool's loop, as its feed task would, and wait for it."""
        done = threading.Event()

        def run() -> None:
            deliver()
            done.set()

        LOOP.loop.call_soon_threadsafe(run)
        assert done.wait(5)


class Waiter:
    """``pool.claim_next("w", **kwargs)`` in a thread of its own: a worker waiting for work."""

    def __init__(self, pool: Any, **kwargs: Any) -> None:
        self.got: list[Any] = []
        self.start = time.monotonic()
        self.thread = threading.Thread(
            target=lambda: self.got.append(pool.claim_next("w", **kwargs)))
        self.thread.start()

    def result(self, seconds: float) -> Any:
        """What the claim returned, waiting up to ``seconds`` for it to return."""
        self.thread.join(seconds)
        assert not self.thread.is_alive() and self.got, "the waiting claim did not return"
        return self.got[0]


class PoolView:
    """Either pool, blocking (its claims come back as ``LeaseView``s)."""

    def __init__(self, client: Client, real: Any) -> None:
        self.client, self.real = client, real

    def claim_next(self, *args: Any, **kwargs: Any) -> LeaseView | None:
        lease = self.client._call(self.real.claim_next, *args, **kwargs)
        return lease  # type: ignore[no-any-return]

    def unfinished(self, *timeout: float) -> int:
        return int(self.real.unfinished(*timeout))

    def close(self) -> None:
        self.client._call(self.real.close)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[PoolView, ScriptedFeed]]]:
    made: list[tuple[PoolView, ScriptedFeed]] = []
    yield made
    for pool, feed in made:
        feed.stop()
        pool.close()


def script_feeds(kind: str, monkeypatch: pytest.MonkeyPatch) -> list[ScriptedFeed]:
    """Replace the ``kind`` pool's feed by a ``ScriptedFeed``; the feeds made, in order."""
    made: list[ScriptedFeed] = []
    if kind == "sync":
        def feed(store: Any, namespace: str, selector: str, **_: Any) -> ScriptedFeed:
            made.append(ScriptedFeed(store.api))
            return made[-1]

        monkeypatch.setattr("joblease.sdk.pool.LeaseFeed", feed)
    else:
        async def scripted_feed(self: AsyncPool[Any]) -> None:
            made.append(AsyncScriptedFeed(self.client.api.sync))  # AsyncFakeKubeApi's fake
            await made[-1].arun(_Sink(self))

        monkeypatch.setattr(AsyncPool, "_feed", scripted_feed)
    return made


def started(feeds: list[ScriptedFeed], count: int = 1) -> ScriptedFeed:
    """The ``count``-th feed made, once its list step is over (the asyncio one starts late)."""
    deadline = time.monotonic() + 5
    while len(feeds) < count:
        assert time.monotonic() < deadline, "the pool never started its feed"
        time.sleep(0.005)
    assert feeds[count - 1].listed.wait(5)
    return feeds[count - 1]


def pool_over(kind: str, api: FakeKubeApi, made: list[tuple[PoolView, ScriptedFeed]],
              monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> tuple[PoolView, ScriptedFeed]:
    client = client_over(kind, api)
    kwargs.setdefault("presence", False)
    feeds = script_feeds(kind, monkeypatch)
    if kind == "sync":
        real: Any = Pool(client.real, "team=batch", **kwargs)
    else:
        real = AsyncPool(client.real, "team=batch", **kwargs)
        LOOP.run(real.__aenter__())
    pool = PoolView(client, real)
    scripted = started(feeds)
    made.append((pool, scripted))
    return pool, scripted


# -- claiming from the cache -------------------------------------------------------------------

def test_each_claim_is_one_write_decided_from_the_cache_oldest_first(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("first"), available("second"))
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    one = pool.claim_next("w", timeout=0)
    two = pool.claim_next("w", timeout=0)
    assert one is not None and two is not None
    assert (one.name, one.holder, one.generation) == ("first", "w", 1)
    assert two.name == "second"  # the cache learned that "first" is held now
    assert writes(api) == [("PATCH", "first"), ("PATCH", "second")]  # no read to find work
    assert pool.claim_next("w", timeout=0) is None
    assert (pool.claims, pool.conflicts) == (2, 0)
    assert api.stored("ns", "first")["status"]["claimId"] == one.claim_id  # type: ignore[index]


def test_a_lost_race_costs_one_write_and_sets_the_name_aside_until_a_newer_version(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("first"), available("second"))
    pool, feed = pool_over(kind, api, pools, monkeypatch)
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
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("first"))
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    slept = fake_sleep(monkeypatch, lambda _: None)
    monkeypatch.setattr("joblease.sdk.pool.time.sleep", lambda s: slept.append(s))
    real_request = api.request

    def request(method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        answer = real_request(method, path, body, **kwargs)
        if method == "PATCH" and len(api.requests) == 1:
            raise LOST  # the write landed, its answer did not
        return answer

    monkeypatch.setattr(api, "request", request)
    lease = pool.claim_next("w", timeout=10)
    assert lease is not None and lease.generation == 1
    assert writes(api) == [("PATCH", "first"), ("GET", "first")]  # adopted: no second write
    assert api.stored("ns", "first")["status"]["claimId"] == lease.claim_id  # type: ignore[index]
    assert slept == [0.05]
    assert (pool.claims, pool.conflicts) == (1, 0)


def test_a_claim_that_only_records_used_up_attempts_is_not_a_lease(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(held_by_other("last", -60, maxAttempts=1))
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    assert pool.claim_next("w", timeout=0) is None
    assert api.stored("ns", "last")["status"]["phase"] == "Failed"  # type: ignore[index]
    assert (pool.claims, pool.conflicts) == (0, 0)
    assert pool.unfinished() == 0  # the cache learned the write


# -- waiting -----------------------------------------------------------------------------------

def test_a_waiting_claim_takes_what_the_watch_brings(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(held_by_other("busy", 3600))
    pool, feed = pool_over(kind, api, pools, monkeypatch)
    waiter = Waiter(pool, timeout=10)
    time.sleep(0.05)
    server(available("new"), api=api)
    feed.event("ADDED", "new")
    got = waiter.result(10)
    assert got is not None and got.name == "new"
    assert time.monotonic() - waiter.start < 5


def test_until_empty_returns_at_once_when_nothing_unfinished_is_left(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(("done", {"phase": "Completed", "generation": 1, "epoch": 1}, {}))
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    start = time.monotonic()
    assert pool.claim_next("w", timeout=5, until_empty=True) is None
    assert time.monotonic() - start < 2
    assert pool.unfinished() == 0


def test_closing_the_pool_releases_a_waiting_claim(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(held_by_other("busy", 3600))
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    waiter = Waiter(pool)
    time.sleep(0.1)
    pool.close()
    pool.close()  # idempotent
    assert waiter.result(5) is None


def test_a_dead_watch_stops_the_claims_with_its_cause(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    boom = RuntimeError("boom")
    monkeypatch.setattr(ScriptedFeed, "crash", boom)
    pool, _ = pool_over(kind, server(available("a")), pools, monkeypatch)
    with pytest.raises(PoolClosedError) as err:
        pool.claim_next("w", timeout=5)
    assert err.value.__cause__ is boom
    assert str(err.value) == "JobLease pool 'team=batch': its watch stopped: RuntimeError('boom')"


# -- before the first list ---------------------------------------------------------------------

def test_a_refused_list_is_raised_not_waited_for(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    refused = ForbiddenError(403, "Forbidden", "cannot list jobleases")
    monkeypatch.setattr(ScriptedFeed, "before_list", refused)
    pool, _ = pool_over(kind, server(available("a")), pools, monkeypatch)
    start = time.monotonic()
    with pytest.raises(ForbiddenError) as err:
        pool.claim_next("w", timeout=5)
    assert err.value is refused and time.monotonic() - start < 2


def real_time(api: FakeKubeApi, monkeypatch: pytest.MonkeyPatch) -> FakeKubeApi:
    """``api`` with the real monotonic clock (the fake's advances 1 ms per reading).

    A timeout is counted on the transport's monotonic clock by ``AsyncPool`` and on
    ``time.monotonic`` by ``Pool``; real transports read the same real clock.
    """
    monkeypatch.setattr(api, "monotonic", time.monotonic)
    return api


def test_an_unreachable_server_is_raised_once_the_timeout_passed(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ScriptedFeed, "before_list", LOST)
    api = real_time(server(available("a")), monkeypatch)
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    start = time.monotonic()
    with pytest.raises(UnavailableError) as err:
        pool.claim_next("w", timeout=0.3)
    assert err.value is LOST
    assert 0.3 <= time.monotonic() - start < 2  # waited for a list until the timeout


def test_no_list_within_the_timeout_is_unavailable(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ScriptedFeed, "never_lists", True)
    api = real_time(server(available("a")), monkeypatch)
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    calls = [lambda: pool.claim_next("w", timeout=0.3)]
    if kind == "sync":  # the thread pool's unfinished() may wait; the asyncio one's reads
        calls.append(lambda: pool.unfinished(0.3))
    for call in calls:
        start = time.monotonic()
        with pytest.raises(UnavailableError) as err:
            call()
        assert (err.value.status, err.value.reason) == (0, "NotSynced")
        assert err.value.message == ("JobLease pool 'team=batch': no list of its leases "
                                     "within the timeout")
        assert 0.3 <= time.monotonic() - start < 2


def test_a_list_that_arrives_while_a_claim_waits_is_used(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ScriptedFeed, "never_lists", True)
    api = server(available("a"))
    pool, feed = pool_over(kind, api, pools, monkeypatch)
    waiter = Waiter(pool, timeout=10)
    time.sleep(0.1)
    assert not waiter.got  # waiting for the first list
    monkeypatch.setattr(ScriptedFeed, "never_lists", False)
    feed.relist()
    got = waiter.result(10)
    assert got is not None and got.name == "a"
    assert time.monotonic() - waiter.start < 5


# -- presence (joblease.core.presence) --------------------------------------------------------

def test_a_pool_announces_its_worker_learns_the_others_and_leaves_on_close(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("job"))
    other = Presence("ns", "team=batch", "other-worker")
    stop = threading.Event()
    stop.set()  # the first Sleep ends the round at once
    with pytest.raises(Stopped):  # one round of another worker of the same pool
        drive(other.steps(type("Sink", (), {"workers": lambda self, live: None})()),
              SyncPort(LeaseStore(api), stop=stop))  # type: ignore[arg-type]
    pool, _ = pool_over(kind, api, pools, monkeypatch, presence=True)
    assert pool.presence is None  # no holder named yet
    assert pool.claim_next("me", timeout=5) is not None
    deadline = time.monotonic() + 5
    while pool.presence is None or pool.presence.counts.lists == 0:
        assert time.monotonic() < deadline, "presence never listed"
        time.sleep(0.01)
    assert pool.live_workers() == ["me", "other-worker"]
    announced = pool.presence
    assert pool.claim_next("someone-else", timeout=0) is None
    assert pool.presence is announced  # announced once, by the first holder
    pool.close()
    # closing the pool deleted its own record; the other's stays until it lapses
    assert [obj["spec"]["holderIdentity"] for obj in api.presence.values()] == ["other-worker"]
    assert writes(api) == [("PATCH", "job")]  # presence never shows among the JobLease requests


def test_a_pool_without_presence_announces_nothing(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("job"))
    pool, _ = pool_over(kind, api, pools, monkeypatch, presence=False)
    assert pool.claim_next("me", timeout=5) is not None
    assert pool.presence is None and not api.presence


# -- the client's shared pools -----------------------------------------------------------------

def test_the_clients_claim_next_shares_one_pool_per_selector_until_closed(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    feeds = script_feeds(kind, monkeypatch)
    client = client_over(kind, real_time(server(available("a"), available("b")), monkeypatch))
    first = client.claim_next("team=batch", "w", timeout=5)  # waits for the first list
    second = client.claim_next("team=batch", "w", timeout=0)  # the same pool: listed already
    assert first is not None and second is not None and {first.name, second.name} == {"a", "b"}
    assert len(feeds) == 1
    assert client.claim_next("team=other", "w", timeout=0.2) is None  # another selector
    assert len(feeds) == 2
    client.close()
    assert feeds[0].stopped.wait(5) and feeds[1].stopped.wait(5)  # every pool closed
    client.close()  # idempotent
    with pytest.raises(RuntimeError, match=r"the (Async)?LeaseClient is closed"):
        client.claim_next("team=batch", "w", timeout=0)
