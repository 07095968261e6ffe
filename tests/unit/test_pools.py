"""The two work pools, one behaviour: ``Pool`` and ``AsyncPool`` run the same test bodies.

Issue 23, item 3. The claims are real (either client over the in-memory API server); the
list+watch is scripted (``support.pools.ScriptedFeed``) so each test decides which versions
the cache holds — for ``AsyncPool`` its events are delivered on its own event loop, as its
feed task would. Pinned for both: a claim is one conditional write decided from the cache;
a lost race costs one write and sets the name aside until a newer version; a lost answer is
retried with the same claim id and the landed claim adopted; a claim that only recorded
used-up attempts is not a lease and the cache learns the Failed version; a waiting claim
takes what the watch brings; ``until_empty``; closing releases a waiting claim.
The thread pool's own concerns (its feed thread, its clock injection) stay in
``test_sdk_pool.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from joblease.aio.pool import AsyncPool
from joblease.domain.lease import Observed
from joblease.kube.api import UnavailableError
from joblease.sdk.pool import Pool
from support.clients import KINDS, LOOP, Client, LeaseView, client_over, fake_sleep
from support.fakekube import FakeKubeApi
from support.pools import ScriptedFeed, available, held_by_other, server, writes

pytestmark = pytest.mark.parametrize("kind", KINDS)
LOST = UnavailableError(0, "Unavailable", "connection reset")


class AsyncScriptedFeed(ScriptedFeed):
    """``ScriptedFeed`` for ``AsyncPool``: lists once, then delivers events on the pool's loop."""

    async def arun(self, sink: Any) -> None:
        self.sink = sink
        sink.replace([Observed.from_object(o) for o in self.api.objects.values()],
                     str(max(int(o["metadata"]["resourceVersion"])
                             for o in self.api.objects.values())))
        self.listed.set()
        while not self.stopped.is_set():
            await asyncio.sleep(0.01)

    def event(self, kind: str, name: str) -> None:
        done = threading.Event()

        def deliver() -> None:
            super(AsyncScriptedFeed, self).event(kind, name)
            done.set()

        LOOP.loop.call_soon_threadsafe(deliver)
        assert done.wait(5)


class PoolView:
    """Either pool, blocking (its claims come back as ``LeaseView``s)."""

    def __init__(self, client: Client, real: Any) -> None:
        self.client, self.real = client, real

    def claim_next(self, *args: Any, **kwargs: Any) -> LeaseView | None:
        lease = self.client._call(self.real.claim_next, *args, **kwargs)
        return lease  # type: ignore[no-any-return]

    def unfinished(self) -> int:
        return int(self.real.unfinished())

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


def pool_over(kind: str, api: FakeKubeApi, made: list[tuple[PoolView, ScriptedFeed]],
              monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> tuple[PoolView, ScriptedFeed]:
    client = client_over(kind, api)
    if kind == "sync":
        feeds: list[ScriptedFeed] = []

        def feed(store: Any, namespace: str, selector: str, **_: Any) -> ScriptedFeed:
            feeds.append(ScriptedFeed(store.api))
            return feeds[-1]

        monkeypatch.setattr("joblease.sdk.pool.LeaseFeed", feed)
        real: Any = Pool(client.real, "team=batch", presence=False, **kwargs)
        scripted = feeds[-1]
    else:
        scripted = AsyncScriptedFeed(api)

        async def scripted_feed(self: AsyncPool[Any]) -> None:
            from joblease.aio.pool import _Sink
            await scripted.arun(_Sink(self))

        monkeypatch.setattr(AsyncPool, "_feed", scripted_feed)
        real = AsyncPool(client.real, "team=batch", presence=False, **kwargs)
        LOOP.run(real.__aenter__())
    assert scripted.listed.wait(5)
    pool = PoolView(client, real)
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
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(pool.claim_next("w", timeout=10)))
    start = time.monotonic()
    waiter.start()
    time.sleep(0.05)
    server(available("new"), api=api)
    feed.event("ADDED", "new")
    waiter.join(10)
    assert got and got[0] is not None and got[0].name == "new"
    assert time.monotonic() - start < 5


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
    got: list[Any] = ["not returned"]
    waiter = threading.Thread(target=lambda: got.__setitem__(0, pool.claim_next("w")))
    waiter.start()
    time.sleep(0.1)
    pool.close()
    pool.close()  # idempotent
    waiter.join(5)
    assert not waiter.is_alive() and got == [None]
