"""The two work pools, one behaviour: ``Pool`` and ``AsyncPool`` run the same test bodies.

Issue 23, item 3; issue 30, item 4 (one engine, ``joblease.core.pool_engine``, driven by
both). The claims are real (either client over the in-memory API server); the list+watch is
scripted (``support.pools.ScriptedFeed``) so each test decides which versions the cache
holds — for ``AsyncPool`` its events are delivered on its own event loop, as its feed task
would. Pinned for both: a claim is one conditional write decided from the cache; a lost race
costs one write and sets the name aside until a newer version; a lost answer is retried with
the same claim id and the landed claim adopted, pausing 50 ms doubling to 2 s and never past
the timeout; a claim that only recorded used-up attempts is not a lease and the cache learns
the Failed version; a waiting claim takes what the watch brings, wakes when a holder's end
has certainly passed without polling, and waits at least ``MIN_WAIT`` for a wake-up that
looks due; a sibling's failed claim hands its name back at once; ``until_empty``; closing
releases a waiting claim; a dead watch stops the claims with its cause; a refused first list
is raised at once, an unreachable one after the timeout, no list at all as ``NotSynced``,
and no count of unfinished leases is given before a list; ``live_workers`` sends no request;
presence is announced by the first holder and left on close; the client shares one pool per
selector until closed.

Time: both pools count every deadline and wait on their transport's clock (the one clock of
the engine), so a test moves time by moving the fake server's ``monotonic``, for both alike.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from joblease.aio import AsyncLeaseClient
from joblease.aio.pool import AsyncPool
from joblease.core.pool_engine import MIN_WAIT, PROPOSAL_RETRY
from joblease.core.presence import Presence
from joblease.core.steps import Stopped, SyncPort, drive
from joblease.domain.clock import ServerClock
from joblease.domain.errors import PoolClosedError, format_time
from joblease.domain.pool import PoolView as CacheView
from joblease.kube.api import ForbiddenError, UnavailableError
from joblease.kube.leases import LeaseStore
from joblease.sdk.client import DEFAULT_MARGIN, LeaseClient
from joblease.sdk.pool import Pool
from support.clients import KINDS, LOOP, Client, LeaseView, client_over, fake_sleep
from support.fakekube import FakeKubeApi, lease_object
from support.pools import (
    RealTimeApi,
    ScriptedFeed,
    available,
    held_by_other,
    server,
    writes,
)

pytestmark = pytest.mark.parametrize("kind", KINDS)
LOST = UnavailableError(0, "Unavailable", "connection reset")
# The scripted feed's own pause: ``fake_sleep`` replaces ``asyncio.sleep`` on the module, so
# a feed task that woke after it was installed recorded its 0.01 s pauses as the pool's and
# spun without yielding (seen under load: ``slept == [0.05]`` failed with 0.01 s entries).
FEED_PAUSE = asyncio.sleep


class AsyncScriptedFeed(ScriptedFeed):
    """``ScriptedFeed`` for ``AsyncPool``: lists once, then delivers events on the pool's loop."""

    async def arun(self, sink: Any) -> None:
        try:
            self.list_step(sink)
            while not self.stopped.is_set():
                await FEED_PAUSE(0.01)
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
    """``pool.claim_next("w", **kwargs)`` in a thread of its own: a worker waiting for work.

    What it returned lands in ``got``, what it raised in ``raised``.
    """

    def __init__(self, pool: Any, **kwargs: Any) -> None:
        self.got: list[Any] = []
        self.raised: list[BaseException] = []
        self.start = time.monotonic()
        self.thread = threading.Thread(target=self._claim, args=(pool, kwargs))
        self.thread.start()

    def _claim(self, pool: Any, kwargs: dict[str, Any]) -> None:
        try:
            self.got.append(pool.claim_next("w", **kwargs))
        except BaseException as err:
            self.raised.append(err)

    def result(self, seconds: float) -> Any:
        """What the claim returned, waiting up to ``seconds`` for it to return."""
        self.thread.join(seconds)
        assert not self.thread.is_alive() and self.got, "the waiting claim did not return"
        return self.got[0]


class PoolView:
    """Either pool, blocking (its claims come back as ``LeaseView``s)."""

    feeds: list[ScriptedFeed]

    def __init__(self, client: Client, real: Any) -> None:
        self.client, self.real = client, real

    def on_loop(self, action: Callable[[], None]) -> None:
        """Run ``action`` where the pool's engine is changed: its loop for ``AsyncPool``."""
        if isinstance(self.real, Pool):
            action()
            return
        done = threading.Event()

        def run() -> None:
            action()
            done.set()

        LOOP.loop.call_soon_threadsafe(run)
        assert done.wait(5)

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
        def feed(store: Any, namespace: str, selector: str, **options: Any) -> ScriptedFeed:
            made.append(ScriptedFeed(store.api))
            made[-1].fields = options.get("fields")
            return made[-1]

        monkeypatch.setattr("joblease.sdk.pool.LeaseFeed", feed)
    else:
        async def scripted_feed(self: AsyncPool[Any], feed: Any, sink: Any) -> None:
            made.append(AsyncScriptedFeed(self.client.api.sync))  # AsyncFakeKubeApi's fake
            made[-1].fields = feed.fields
            await made[-1].arun(sink)

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
    pool.feeds = feeds  # every feed the pool makes, in order (a scope switch makes more)
    scripted = started(feeds)
    made.append((pool, scripted))
    return pool, scripted


def presence_written(api: FakeKubeApi) -> None:
    """Wait (at most 5 s) for the pool's presence, in its own thread or task, to write."""
    deadline = time.monotonic() + 5
    while not api.presence:
        assert time.monotonic() < deadline, "presence never wrote its record"
        time.sleep(0.01)


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


@pytest.mark.parametrize(("timeout", "pauses"), [
    (3.0, [0.05, 0.1, 0.2, 0.4, 0.8]),  # the next pause (1.6) would end past the timeout
    (10.0, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]),  # doubling stops at 2 s
])
def test_lost_answers_are_retried_doubling_to_two_seconds_never_past_the_timeout(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch,
        timeout: float, pauses: list[float]) -> None:
    """The timeout is counted on the transport's clock, which only the pauses move here.

    The thread pool counted it on ``time.monotonic`` (and paused with its own
    ``time.sleep``): with its sleeps faked it retried until the fake server's refusals ran
    out, since real time hardly passed.
    """
    api = server(available("first"))
    pool, _ = pool_over(kind, api, pools, monkeypatch)

    def move(seconds: float) -> None:
        api._monotonic += seconds

    slept = fake_sleep(monkeypatch, move)
    api.refuse_next = [LOST] * 1000
    with pytest.raises(UnavailableError) as err:
        pool.claim_next("w", timeout=timeout)
    assert err.value is LOST
    assert [s for s in slept if s != 0.01] == pytest.approx(pauses)  # 0.01: the async feed
    assert pool.conflicts == 0  # unknown is not refused


def test_a_siblings_failed_claim_hands_the_name_back_at_once(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that raises frees its name, and a sibling waiting meanwhile takes it.

    The asyncio pool did not wake its waiting coroutines when a sibling's claim ended
    without a lease: the one waiting here slept until its timeout.
    """
    refused = ForbiddenError(403, "Forbidden", "the admission policy said no")
    first_call = threading.Event()
    if kind == "sync":
        real_claim = LeaseClient.claim

        def claim(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not first_call.is_set():
                first_call.set()
                time.sleep(0.3)
                raise refused
            return real_claim(self, *args, **kwargs)

        monkeypatch.setattr(LeaseClient, "claim", claim)
    else:
        real_aclaim = AsyncLeaseClient.claim

        async def aclaim(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not first_call.is_set():
                first_call.set()
                await asyncio.sleep(0.3)
                raise refused
            return await real_aclaim(self, *args, **kwargs)

        monkeypatch.setattr(AsyncLeaseClient, "claim", aclaim)
    api = real_time(server(available("a")), monkeypatch)
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    first = Waiter(pool, timeout=5)
    assert first_call.wait(5)  # claiming "a" now, for 0.3 s
    second = Waiter(pool, timeout=5)
    time.sleep(0.1)
    assert not second.got  # "a" is its sibling's: it waits
    got = second.result(5)
    assert got is not None and got.name == "a"
    assert time.monotonic() - second.start < 2  # woken by the sibling, not by its timeout
    first.thread.join(5)
    assert not first.got and first.raised == [refused]  # the first claimer raised it


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
    # "busy" is held by the waiter itself: with another holder, that holder would be a live
    # worker whose turn "new" may start in, and the in-memory server's time moves only with
    # each clock reading, so whose turn it is hung on how often the engine read the clock
    # (safety.md #52)
    api = server(held_by_other("busy", 3600, status={"holder": "w"}))
    pool, feed = pool_over(kind, api, pools, monkeypatch)
    waiter = Waiter(pool, timeout=10)
    time.sleep(0.05)
    server(available("new"), api=api)
    feed.event("ADDED", "new")
    got = waiter.result(10)
    assert got is not None and got.name == "new"
    assert time.monotonic() - waiter.start < 5


def count_choices(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``PoolView.choose`` from now on (the worker choosing), by either pool."""
    made: list[str] = []
    real = CacheView.choose

    def choose(self: CacheView, worker: str, *args: Any, **kwargs: Any) -> Any:
        made.append(worker)
        return real(self, worker, *args, **kwargs)

    monkeypatch.setattr(CacheView, "choose", choose)
    return made


def test_a_waiter_wakes_when_a_holders_end_plus_margin_has_certainly_passed_without_polling(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = RealTimeApi()
    wake = 0.4
    server(held_by_other("busy", wake - DEFAULT_MARGIN.total_seconds()), api=api)
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    choices = count_choices(monkeypatch)
    lease = pool.claim_next("w", timeout=5)
    assert lease is not None and lease.name == "busy"
    assert api.monotonic() >= wake
    assert api.monotonic() < 3  # woken at the end, not at the timeout
    assert len(choices) < 10  # it slept until then; it did not spin


def test_a_wake_up_that_looks_due_already_waits_the_least_wait_not_zero(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """An estimate that puts the wake-up at (or before) now must not make a claimer spin.

    Only the asyncio pool had the least wait; the thread pool waited ``max(0, …)`` and chose
    again at once, as often as the CPU allowed, for as long as the estimate said so.
    """
    api = RealTimeApi()
    server(held_by_other("busy", 3600), api=api)
    pool, _ = pool_over(kind, api, pools, monkeypatch)
    monkeypatch.setattr(api.clock, "monotonic_certain", lambda when: 0.0)  # "due long ago"
    choices = count_choices(monkeypatch)
    start = time.monotonic()
    assert pool.claim_next("w", timeout=0.3) is None
    assert 0.3 <= time.monotonic() - start < 2
    assert 3 <= len(choices) <= 0.3 / MIN_WAIT + 5  # about one choice per least wait


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

    Both pools count a timeout on their transport's monotonic clock.
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
    if kind == "sync":  # the thread pool's unfinished() may wait; the asyncio one never does
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


def test_no_count_of_unfinished_leases_is_given_before_the_first_list(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a list there is no count: 0 would read as an empty pool (``--until-empty``).

    The asyncio pool's ``unfinished()`` answered 0 before its first list.
    """
    monkeypatch.setattr(ScriptedFeed, "never_lists", True)
    api = real_time(server(available("a")), monkeypatch)
    pool, feed = pool_over(kind, api, pools, monkeypatch)
    now: tuple[float, ...] = (0.0,) if kind == "sync" else ()  # the asyncio one never waits
    with pytest.raises(UnavailableError) as err:
        pool.unfinished(*now)
    assert err.value.reason == "NotSynced"
    monkeypatch.setattr(ScriptedFeed, "never_lists", False)
    feed.relist()
    assert pool.unfinished(*now) == 1


def test_a_refused_list_is_raised_by_unfinished_too(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    refused = ForbiddenError(403, "Forbidden", "cannot list jobleases")
    monkeypatch.setattr(ScriptedFeed, "before_list", refused)
    pool, _ = pool_over(kind, server(available("a")), pools, monkeypatch)
    with pytest.raises(ForbiddenError) as err:
        pool.unfinished(*((5.0,) if kind == "sync" else ()))
    assert err.value is refused
    assert pool.watch_errors == 1


# -- presence (joblease.core.presence) --------------------------------------------------------

def test_a_pool_announces_its_worker_learns_the_others_and_leaves_on_close(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("job"))
    other = Presence("ns", "team=batch", "other-worker")
    stop = threading.Event()
    stop.set()  # the first Sleep ends the round at once
    with pytest.raises(Stopped):  # one round of another worker of the same pool
        drive(other.steps(type("Sink", (), {"workers": lambda self, live: None,
                                          "dispatcher": lambda self, until, count=None: None})()),
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


def test_a_pool_whose_watch_died_still_leaves_its_presence_on_close(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread pool's ``close()`` returned at once once its watch had died (it took that
    for "already closed"), leaving its presence thread renewing a record of a dead pool."""
    api = server(available("job"))
    pool, _ = pool_over(kind, api, pools, monkeypatch, presence=True)
    assert pool.claim_next("me", timeout=5) is not None
    presence_written(api)
    boom = RuntimeError("boom")

    async def die() -> None:  # on the pool's loop, as its feed task would
        pool.engine.died(boom)

    if kind == "sync":
        pool.engine.died(boom)
    else:
        LOOP.run(die())
    with pytest.raises(PoolClosedError):
        pool.claim_next("me", timeout=0)
    pool.close()
    assert api.presence == {}  # its record deleted


def test_a_pool_without_presence_announces_nothing(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("job"))
    pool, _ = pool_over(kind, api, pools, monkeypatch, presence=False)
    assert pool.claim_next("me", timeout=5) is not None
    assert pool.presence is None and not api.presence


def test_live_workers_sends_no_request_and_knows_no_one_before_any_answer(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Read from what the pool knows, on the transport's estimate; never a request.

    The thread pool asked ``server_now()``, which sends ``GET /version`` to a transport that
    has heard nothing yet; the asyncio one read the estimate, which raised ``RuntimeError``
    then.
    """
    monkeypatch.setattr(ScriptedFeed, "never_lists", True)
    api = server(held_by_other("busy", 30))
    api.clock = ServerClock()  # nothing heard yet: no estimate
    pool, feed = pool_over(kind, api, pools, monkeypatch)
    assert pool.live_workers() == []
    api.clock.observe(0.0, 0.0, int(api.now.earliest.timestamp()))  # the list's Date
    monkeypatch.setattr(ScriptedFeed, "never_lists", False)
    feed.relist()
    assert pool.live_workers() == ["other"]  # the holder it caches, until its leaseUntil
    assert api.requests == []


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


# -- a dispatched pool (issue 30) ----------------------------------------------------------------

def test_a_dispatched_worker_adopts_its_assignment_and_takes_only_jobs_not_opted_in(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from joblease.domain.errors import format_time
    from joblease.domain.lease import dispatch_claim_id, unadopted
    from support.fakekube import T_NOW

    opt_in = {"enabled": True, "serviceAccountNames": ["w"]}
    at = format_time(T_NOW - timedelta(seconds=1))
    assigned = held_by_other("mine", 30, dispatch=opt_in, status={
        "holder": "w", "claimId": dispatch_claim_id("x"), "acquireTime": at, "renewTime": at})
    api = server(available("open", dispatch=opt_in), assigned, available("plain"))
    pool, _ = pool_over(kind, api, pools, monkeypatch, slots=1)
    pool.engine.dispatcher_until = T_NOW + timedelta(seconds=60)  # a live dispatcher record
    mine = pool.claim_next("w", timeout=0)
    assert mine is not None and mine.name == "mine"
    assert writes(api) == [("PATCH", "mine")]  # the adoption, from the watched version
    stored = api.stored("ns", "mine")["status"]  # type: ignore[index]
    assert stored["renewTime"] != stored["acquireTime"] and stored["generation"] == 1
    assert not unadopted(mine.observed.status)
    assert mine.claim_id == dispatch_claim_id("x")  # the dispatcher's claim, not a new one
    plain = pool.claim_next("w", timeout=0)  # by turns: the dispatcher never gives it out
    assert plain is not None and plain.name == "plain"
    assert pool.claim_next("w", timeout=0) is None  # "open" is the dispatcher's to give
    pool.engine.dispatcher_until = None  # the record lapsed: every job by turns again
    again = pool.claim_next("w", timeout=0)
    assert again is not None and again.name == "open"
    assert (pool.claims, pool.conflicts) == (3, 0)


def test_an_assignment_taken_back_before_its_adoption_is_never_handed_out(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from joblease.domain.errors import format_time
    from joblease.domain.lease import dispatch_claim_id
    from support.fakekube import T_NOW

    at = format_time(T_NOW - timedelta(seconds=1))
    status = {"holder": "w", "claimId": dispatch_claim_id("x"), "acquireTime": at,
              "renewTime": at}
    api = server(held_by_other("mine", 30, status=status))
    pool, _ = pool_over(kind, api, pools, monkeypatch, slots=1)
    pool.engine.dispatcher_until = T_NOW + timedelta(seconds=60)
    server(held_by_other("mine", 30, status={**status, "holder": "w2", "generation": 2,
                                              "claimId": dispatch_claim_id("y")}), api=api)
    assert pool.claim_next("w", timeout=0) is None  # its adoption is refused: nothing runs
    assert writes(api)[0] == ("PATCH", "mine")  # the adoption, refused: a newer version
    stored = api.stored("ns", "mine")["status"]  # type: ignore[index]
    assert (stored["holder"], stored["generation"]) == ("w2", 2)  # w2's claim stands
    assert pool.conflicts == 1 and pool.view.is_set_aside("mine")


def test_an_adoption_that_raises_hands_the_job_back_for_the_next_call(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from joblease.domain.errors import format_time
    from joblease.domain.lease import dispatch_claim_id
    from support.fakekube import T_NOW

    at = format_time(T_NOW - timedelta(seconds=1))
    api = server(held_by_other("mine", 30, status={
        "holder": "w", "claimId": dispatch_claim_id("x"), "acquireTime": at, "renewTime": at}))
    pool, _ = pool_over(kind, api, pools, monkeypatch, slots=1)
    pool.engine.dispatcher_until = T_NOW + timedelta(seconds=60)
    client = pool.real._client if kind == "sync" else pool.real.client
    resume = client.resume

    def broken(*args: Any, **kwargs: Any) -> Any:
        client.resume = resume  # once
        raise RuntimeError("resume broke")

    client.resume = broken
    with pytest.raises(RuntimeError, match="resume broke"):
        pool.claim_next("w", timeout=0)
    again = pool.claim_next("w", timeout=0)  # not left marked as being adopted
    assert again is not None and again.name == "mine"


@pytest.mark.parametrize("inbox", [False, True], ids=["adopter", "inbox"])
def test_a_dispatched_worker_watches_only_its_own_part_and_the_whole_pool_once_it_lapses(
        kind: str, inbox: bool, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch of scope in both drivers (issue 30): new feeds, the old ones stopped, and
    the job held across both switches never out of view. A worker that reads its inbox runs
    one narrow stream (no echo of its own writes), an adopter two."""
    from datetime import timedelta

    from joblease.core.scope import FULL, Scope
    from support.fakekube import T_NOW

    api = server(available("held"))
    pool, first = pool_over(kind, api, pools, monkeypatch, slots=1)
    assert pool.claim_next("w", timeout=0) is not None  # an answer: the server's time known
    engine = pool.real.engine
    engine.presence = Presence("ns", "team=batch", "w", slots=1)  # announced (not run here)
    engine.presence.reads_inbox = inbox
    scope = Scope("w", own=not inbox)
    pool.on_loop(lambda: engine.dispatcher(T_NOW + timedelta(hours=1)))
    narrow = [started(pool.feeds, 2 + i) for i in range(len(scope.fields()))]
    assert [feed.fields for feed in narrow] == list(scope.fields())
    assert len(narrow) == (1 if inbox else 2)
    deadline = time.monotonic() + 5
    while pool.real.scope != scope:
        assert time.monotonic() < deadline, "the view never became the narrow scope's"
        time.sleep(0.01)
    assert first.stopped.wait(5) and pool.real.view.get("held") is not None
    pool.on_loop(lambda: engine.dispatcher(None))  # the record is gone: turns, the whole pool
    whole = started(pool.feeds, 2 + len(narrow))
    assert whole.fields is None and all(feed.stopped.wait(5) for feed in narrow)
    while pool.real.scope != FULL or engine.scopes != 3:
        assert time.monotonic() < deadline + 5, "the view never became the whole pool's"
        time.sleep(0.01)
    assert pool.real.view.get("held") is not None and len(pool.feeds) == 2 + len(narrow)


def test_a_worker_that_may_be_dispatched_lists_nothing_until_its_presence_answers(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both drivers run the engine's empty scope (issue 30): no feed, no list, until the
    first presence list says which part of the pool the worker needs; then one feed."""
    from joblease.core.scope import FULL, PENDING

    api = server(available("a"))
    client = client_over(kind, api)
    feeds = script_feeds(kind, monkeypatch)
    if kind == "sync":
        real: Any = Pool(client.real, "team=batch", slots=1)
    else:
        real = AsyncPool(client.real, "team=batch", slots=1)
        LOOP.run(real.__aenter__())
    pool = PoolView(client, real)
    pool.feeds = feeds
    engine = real.engine
    deadline = time.monotonic() + 5
    while engine.scopes < 1:  # the driver opened the scope the engine wants: no stream
        assert time.monotonic() < deadline, "the driver never asked for a scope"
        time.sleep(0.005)
    assert engine.wanted_scope() == PENDING and api.requests == []
    assert not any(feed.listed.is_set() for feed in feeds)  # the sync pool made one, unrun
    pool.on_loop(lambda: engine.dispatcher(None))  # presence listed: no dispatcher
    whole = started(feeds)
    pools.append((pool, whole))
    assert whole.fields is None and engine.wanted_scope() == FULL and len(feeds) == 1
    assert engine.scopes == 2


def test_presence_that_breaks_is_logged_whole_and_claims_go_on(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import time

    from joblease.core.presence import Presence

    def broken(self: Presence, sink: Any) -> Any:
        raise RuntimeError("presence broke")
        yield  # a generator, as presence's steps are

    monkeypatch.setattr(Presence, "steps", broken)
    api = server(available("a"))
    pool, _ = pool_over(kind, api, pools, monkeypatch, presence=True)
    lease = pool.claim_next("w", timeout=0)
    assert lease is not None and lease.name == "a"
    deadline = time.monotonic() + 10  # presence runs in its own thread or task
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(r.levelno, r.getMessage(), str(r.exc_info and r.exc_info[1]))
            for r in caplog.records] == [
        (logging.ERROR, "JobLease pool 'team=batch': presence stopped", "presence broke")]


def test_a_waiting_claim_on_an_empty_pool_waits_for_new_jobs_by_default(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``until_empty=True`` (``joblease work --until-empty``) gives up on an empty pool:
    by default a worker waits for the next job to be created."""
    api = server()
    pool, feed = pool_over(kind, api, pools, monkeypatch)
    assert pool.claim_next("w", timeout=5, until_empty=True) is None  # empty: at once
    waiter = Waiter(pool, timeout=10)
    time.sleep(0.1)
    assert not waiter.got and not waiter.raised  # still waiting
    server(available("new"), api=api)
    feed.event("ADDED", "new")
    got = waiter.result(10)
    assert got is not None and got.name == "new"


def test_closing_a_pool_twice_leaves_its_presence_once(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(available("job"))
    pool, _ = pool_over(kind, api, pools, monkeypatch, presence=True)
    assert pool.claim_next("me", timeout=5) is not None
    presence_written(api)
    pool.close()
    deletes = [req for req in api.presence_requests if req[0] == "DELETE"]
    assert len(deletes) == 1 and api.presence == {}
    pool.close()  # idempotent: nothing is stopped, joined or deleted again
    assert [req for req in api.presence_requests if req[0] == "DELETE"] == deletes


def test_the_thread_pool_runs_only_named_daemon_threads(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread pool left open must not keep the interpreter alive at exit (daemon threads),
    and a thread dump names each of its threads by its part and pool; the asyncio pool
    starts no thread at all (its feeds and presence are tasks on the caller's loop)."""
    before = set(threading.enumerate())
    api = server(available("job"))
    pool, _ = pool_over(kind, api, pools, monkeypatch, presence=True)
    assert pool.claim_next("me", timeout=5) is not None
    presence_written(api)
    started_here = {t for t in threading.enumerate() if t not in before}
    names = {t.name for t in started_here}
    if kind != "sync":
        assert not [name for name in names if name.startswith("joblease-")], names
        return
    assert {"joblease-pool[team=batch]", "joblease-feed[team=batch]#0",
            "joblease-presence[team=batch]"} <= names, names
    assert all(t.daemon for t in started_here if t.name.startswith("joblease-")), \
        [(t.name, t.daemon) for t in started_here]


def pool_job(api: FakeKubeApi, name: str, status: dict[str, Any],
             labels: dict[str, str] | None = None) -> None:
    """A job of the pool (``team=batch``; other ``labels``: of another pool), opted in."""
    obj = lease_object(name, status, dispatch={"enabled": True, "serviceAccountNames": ["w"]})
    obj["metadata"]["labels"] = {"team": "batch"} if labels is None else labels
    api.put_object(obj)


def proposed(pool: Any, *names: str) -> None:
    """The worker's inbox now proposes ``names`` (as its inbox watch delivers it)."""
    from joblease.domain.dispatch import Proposal

    pool.on_loop(lambda: pool.engine.inbox(tuple(Proposal(n, "1") for n in names)))


def test_a_proposed_job_is_read_within_the_pool_and_claimed_by_the_worker_itself(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from support.fakekube import T_NOW

    api = FakeKubeApi()
    pool_job(api, "open", {"phase": "Available", "generation": 0, "epoch": 1})
    pool, _ = pool_over(kind, api, pools, monkeypatch, slots=1)
    pool.engine.dispatcher_until = T_NOW + timedelta(seconds=60)  # a live dispatcher
    assert pool.claim_next("w", timeout=0) is None  # dispatched: "open" only by proposal
    proposed(pool, "open")
    lease = pool.claim_next("w", timeout=0)
    assert lease is not None and lease.name == "open"
    assert writes(api) == [("GET", "jobleases"), ("PATCH", "open")]  # read, then its claim
    stored = api.stored("ns", "open")["status"]  # type: ignore[index]
    assert (stored["holder"], stored["generation"]) == ("w", 1)
    assert stored["claimId"].startswith("proposed-")  # its own claim, made on a proposal
    assert pool.claim_next("w", timeout=0) is None  # tried: not read again at that version
    assert len(writes(api)) == 2 and (pool.claims, pool.conflicts) == (1, 0)


def test_a_proposal_outside_the_pool_or_not_claimable_writes_nothing(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from support.fakekube import T_NOW

    api = FakeKubeApi()
    pool_job(api, "elsewhere", {"phase": "Available", "generation": 0, "epoch": 1},
             labels={"team": "other"})  # a forged proposal: a job of another pool
    pool_job(api, "taken", {"phase": "Held", "holder": "other", "generation": 3, "epoch": 1,
                            "claimId": "theirs",
                            "leaseUntil": format_time(T_NOW + timedelta(seconds=30))})
    pool, _ = pool_over(kind, api, pools, monkeypatch, slots=1)
    pool.engine.dispatcher_until = T_NOW + timedelta(seconds=60)
    proposed(pool, "elsewhere", "taken", "missing")
    assert pool.claim_next("w", timeout=0) is None
    # three reads, no write: the pool's selector hides "elsewhere", "taken" is refused
    # from the version read, "missing" does not exist
    assert writes(api) == [("GET", "jobleases")] * 3
    assert api.stored("ns", "taken")["status"]["generation"] == 3  # type: ignore[index]
    assert pool.claims == 0 and pool.engine.proposals != ()


def test_a_read_of_a_proposal_that_raises_hands_it_back_for_the_next_call(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from support.fakekube import T_NOW

    api = FakeKubeApi()
    pool_job(api, "open", {"phase": "Available", "generation": 0, "epoch": 1})
    pool, _ = pool_over(kind, api, pools, monkeypatch, slots=1)
    pool.engine.dispatcher_until = T_NOW + timedelta(seconds=60)
    proposed(pool, "open")
    real = api.request

    def unreachable(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        api.request = real  # type: ignore[method-assign]  # once
        raise UnavailableError(0, "Unavailable", "connection reset")

    api.request = unreachable  # type: ignore[method-assign]
    assert pool.claim_next("w", timeout=0) is None  # the read failed: nothing claimed
    proposed(pool, "open")  # still proposed: the inbox says it again, at another version
    pool.on_loop(lambda: pool.engine.inbox(()))
    proposed(pool, "open")
    lease = pool.claim_next("w", timeout=0)
    assert lease is not None and lease.name == "open"


def test_a_refused_proposal_is_read_again_after_a_second_and_a_claimed_one_never(
        kind: str, pools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A proposal the worker could not claim (here: held by another in its read) stays in
    the inbox; it is read again a second later, not at every call. One it claimed and
    completed, still listed until the dispatcher's next write, is never read again."""
    from datetime import timedelta

    from support.fakekube import T_NOW

    api = FakeKubeApi()
    pool_job(api, "taken", {"phase": "Held", "holder": "other", "generation": 3, "epoch": 1,
                            "claimId": "theirs",
                            "leaseUntil": format_time(T_NOW + timedelta(seconds=30))})
    pool_job(api, "open", {"phase": "Available", "generation": 0, "epoch": 1})
    pool, _ = pool_over(kind, api, pools, monkeypatch, slots=1)
    pool.engine.dispatcher_until = T_NOW + timedelta(seconds=60)
    proposed(pool, "taken", "open")
    lease = pool.claim_next("w", timeout=0)  # "taken" read and refused, then "open"
    assert lease is not None and lease.name == "open"
    lease.complete("done")
    reads = writes(api).count(("GET", "jobleases"))
    assert reads == 2
    assert pool.claim_next("w", timeout=0) is None  # within the second: nothing read
    assert writes(api).count(("GET", "jobleases")) == reads
    api._monotonic += PROPOSAL_RETRY + 0.1
    assert pool.claim_next("w", timeout=0) is None  # "taken" read again; "open" never
    assert writes(api).count(("GET", "jobleases")) == reads + 1
