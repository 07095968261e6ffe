"""``joblease.aio`` on the real API server: the asyncio client keeps every promise the
thread-based one keeps, without blocking the event loop and without a thread per lease.

Each test runs its own event loop (``asyncio.run``) with an ``AsyncLeaseClient`` built from
the test identity's kubeconfig (the ``kubernetes`` loaders, run in a worker thread); the
sync ``leases`` client of the fixtures creates objects and checks what the server stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from joblease.aio import AsyncLease, AsyncLeaseClient
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLostError,
    StaleLeaseError,
)
from joblease.domain.lease import Phase
from joblease.sdk.client import LeaseClient
from support.hangproxy import HangingProxy, api_port, kubeconfig_via

T = TypeVar("T")
# seconds: a callback that runs longer blocked the loop (asyncio's debug check, by wall time).
# Not lower: on a shared 2-CPU CI machine at load 15 a 10 ms step of pure Python can take
# 100 ms of wall time. The short blocking calls (a synchronous request to the loopback API
# server takes ~10 ms) are caught by _BlockingCalls instead, which does not depend on load.
SLOW = 0.25


def run(main: Callable[[], Awaitable[T]], *, debug: bool = False) -> T:
    """Run ``main`` in a fresh event loop (in debug mode: slow callbacks are logged)."""
    async def wrapped() -> T:
        asyncio.get_running_loop().slow_callback_duration = SLOW
        return await main()

    return asyncio.run(wrapped(), debug=debug)


def client_for(cluster: Any, namespace: str, user: str = "admin", **kwargs: Any
               ) -> AsyncLeaseClient:
    return AsyncLeaseClient(namespace, kubeconfig=str(cluster.kubeconfig_for(user)), **kwargs)


def test_claim_renew_release_and_complete(cluster: Any, leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 5})
    epoch = int(leases.get("job").resource_version)

    async def main() -> None:
        async with client_for(cluster, leases.namespace) as client:
            lease = await client.claim("job", holder="a")
            assert (lease.holder, lease.generation, lease.token.epoch) == ("a", 1, epoch)
            assert lease.valid() and 3 < lease.remaining() < 5
            first_until = lease.lease_until
            await asyncio.sleep(1.1)
            await lease.renew()
            assert lease.lease_until is not None and first_until is not None
            assert lease.lease_until > first_until and lease.generation == 1
            await lease.release()
            assert leases.get("job").status.phase is Phase.AVAILABLE
            again = await client.claim("job", holder="b")
            assert again.generation == 2 and again.token > lease.token
            await again.complete("done")

    run(main)
    status = leases.get("job").status
    assert status.phase is Phase.COMPLETED and status.generation == 2
    assert status.completion is not None and status.completion.result == "done"


def test_a_stale_holder_is_refused_naming_the_new_holder_and_token(
        cluster: Any, leases: LeaseClient) -> None:
    """The A/B example: A claims generation N and stops renewing; after its lease ends B
    claims N+1; A's completion is refused, naming B and both tokens."""
    leases.store.create(leases.namespace, "report", {"leaseDurationSeconds": 2})

    async def main() -> tuple[AsyncLease, AsyncLease, StaleLeaseError]:
        async with client_for(cluster, leases.namespace) as a_client, \
                client_for(cluster, leases.namespace) as b_client:
            a = await a_client.claim("report", holder="worker-a")
            with pytest.raises(LeaseHeldError):
                await b_client.claim("report", holder="worker-b")
            b = await b_client.wait_claim("report", holder="worker-b", timeout=10)
            with pytest.raises(StaleLeaseError) as refused:
                await a.complete("late")
            assert a.loss is refused.value and not a.valid()
            return a, b, refused.value

    a, b, err = run(main)
    assert b.generation == a.generation + 1 and b.token > a.token
    assert (err.holder, err.token, err.current_holder, err.current_token) == (
        "worker-a", a.token, "worker-b", b.token)
    assert f"presented generation {a.generation} (token {a.token})" in str(err)
    assert f"current generation is {b.generation} (token {b.token}, held by 'worker-b'" \
        in str(err)
    status = leases.get("report").status
    assert (status.holder, status.generation, status.phase) == ("worker-b", b.generation,
                                                                Phase.HELD)


def test_fifty_concurrent_claimers_in_one_loop_one_wins_per_generation(
        cluster: Any, leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "hot", {"leaseDurationSeconds": 30})
    rounds = 3

    async def main() -> list[list[AsyncLease]]:
        winners: list[list[AsyncLease]] = []
        async with client_for(cluster, leases.namespace) as client:
            await client.calibrate()
            for _ in range(rounds):
                results = await asyncio.gather(
                    *(client.claim("hot", holder=f"w{i}") for i in range(50)),
                    return_exceptions=True)
                won = [r for r in results if isinstance(r, AsyncLease)]
                others = Counter(type(r).__name__ for r in results
                                 if not isinstance(r, AsyncLease))
                assert others == Counter({"LeaseHeldError": 50 - len(won)}), others
                winners.append(won)
                for lease in won:
                    await lease.release()
        return winners

    winners = run(main)
    assert [len(won) for won in winners] == [1] * rounds
    assert [won[0].generation for won in winners] == [1, 2, 3]
    assert len({won[0].token for won in winners}) == rounds
    assert leases.get("hot").status.generation == rounds


def test_a_holding_renews_over_several_durations_then_releases(
        cluster: Any, leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 2})

    async def main() -> None:
        async with client_for(cluster, leases.namespace) as client:
            lease = await client.claim("job", holder="a")
            first_until = lease.lease_until
            async with client.hold(lease) as holding:
                await asyncio.sleep(5)  # two and a half lease durations
                holding.check()
                assert holding.loss is None and holding.renew_failures == 0
                assert lease.lease_until is not None and first_until is not None
                assert (lease.lease_until - first_until).total_seconds() > 3
                assert lease.generation == 1 and lease.valid()

    run(main)
    status = leases.get("job").status
    assert status.phase is Phase.AVAILABLE and status.attempts == 0 and status.generation == 1


def test_a_holding_declares_the_loss_by_its_deadline_when_the_server_hangs(
        cluster: Any, leases: LeaseClient, tmp_path: Path) -> None:
    """Connections stay open but nothing comes back: the watchdog, not a request timeout,
    ends the hold, by the lease's local deadline, and the body is cancelled."""
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 3})
    with HangingProxy(api_port(cluster)) as proxy:
        kubeconfig = kubeconfig_via(cluster, proxy.port, tmp_path)

        async def main() -> tuple[float, float, LeaseLostError, int]:
            async with AsyncLeaseClient(leases.namespace, kubeconfig=str(kubeconfig)
                                        ) as client:
                lease = await client.claim("job", holder="a")
                steps = 0
                with pytest.raises(LeaseLostError) as lost:
                    async with client.hold(lease) as holding:
                        proxy.hang()
                        while steps < 300:  # 30 s unless cut short by the loss
                            await asyncio.sleep(0.1)
                            steps += 1
                assert holding.loss is lost.value and lease.loss is lost.value
                return lease.deadline, time.monotonic(), lost.value, steps

        deadline, ended, err, steps = run(main)
    assert isinstance(err, LeaseExpiredError)
    assert ended <= deadline + 0.5, (ended - deadline)  # the body ended by the deadline
    assert 5 < steps < 40  # it ran until then, not a request timeout (10 s) longer


def test_no_call_blocks_the_event_loop(cluster: Any, leases: LeaseClient,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two checks over a whole session of claims, renewals and a pool.

    In asyncio's debug mode every callback (a task step included) that runs longer than
    ``SLOW`` is logged: none may be. And no blocking call — ``time.sleep``, a synchronous
    HTTP request through ``http.client`` (the light transport) or urllib3 (the
    ``kubernetes`` client) — may run on a thread that is running an event loop, however
    short it is (config loading runs in a worker thread, which is fine).
    """
    blocking = _BlockingCalls(monkeypatch)
    slow = _SlowCallbacks()
    for i in range(4):
        leases.store.create(leases.namespace, f"job-{i}", {"leaseDurationSeconds": 2},
                            labels={"pool": "p"})

    async def control() -> None:  # proves the check is live: a blocking call is caught
        loop = asyncio.get_running_loop()
        loop.call_soon(time.sleep, 2 * SLOW)
        await asyncio.sleep(3 * SLOW)

    with slow.watching():
        run(control, debug=True)
    assert len(slow.records) == 1, slow.records
    assert blocking.calls == ["time.sleep"], blocking.calls
    slow.records.clear()
    blocking.calls.clear()

    async def main() -> None:
        async with client_for(cluster, leases.namespace) as client:
            lease = await client.claim("job-0", holder="a")
            async with client.hold(lease) as holding:
                await asyncio.sleep(2.5)  # several renewals
                async with client.pool("pool=p") as pool:
                    got = await asyncio.gather(*(pool.claim_next(f"w{i}", timeout=5)
                                                 for i in range(3)))
                    assert all(g is not None for g in got)
                    for g in got:
                        assert g is not None
                        await g.complete()
                await holding.complete("ok")

    with slow.watching():
        run(main, debug=True)
    assert slow.records == []
    assert blocking.calls == []
    assert {leases.get(f"job-{i}").status.phase for i in range(4)} == {Phase.COMPLETED}


def test_no_thread_is_started_per_lease(cluster: Any, leases: LeaseClient) -> None:
    for i in range(20):
        leases.store.create(leases.namespace, f"job-{i}", {"leaseDurationSeconds": 2})

    async def main() -> tuple[int, int, list[int]]:
        async with client_for(cluster, leases.namespace) as client:
            held = [await client.claim(f"job-{i}", holder="a") for i in range(20)]
            before = threading.active_count()
            firsts = [lease.lease_until for lease in held]
            async with contextlib.AsyncExitStack() as stack:
                holdings = [await stack.enter_async_context(client.hold(lease))
                            for lease in held]
                await asyncio.sleep(1.5)  # every holding renews at least once
                during = threading.active_count()
                renewed = [int(lease.lease_until != first)
                           for lease, first in zip(held, firsts, strict=True)]
                assert all(h.loss is None for h in holdings)
            return before, during, renewed

    before, during, renewed = run(main)
    assert during == before, (before, during)
    assert renewed == [1] * 20
    assert {leases.get(f"job-{i}").status.phase for i in range(20)} == {Phase.AVAILABLE}


def test_ten_coroutines_work_through_a_pool(cluster: Any, leases: LeaseClient) -> None:
    names = [f"item-{i}" for i in range(8)]
    for name in names:
        # 2 s leases: the ten coroutines stay live ranks of the pool's turns until their
        # last lease ends (docs/pools.md), so the late job below waits for their turns only
        # that long
        leases.store.create(leases.namespace, name, {"leaseDurationSeconds": 2},
                            labels={"pool": "p"})
    leases.store.create(leases.namespace, "other", {"leaseDurationSeconds": 10},
                        labels={"pool": "q"})
    done: list[tuple[str, str, int]] = []

    async def worker(pool: Any, who: str) -> int:
        ends = 0
        for _ in range(20):  # bounded: at most 8 items exist
            lease = await pool.claim_next(who, timeout=2)
            if lease is None:
                ends += 1
                break
            done.append((lease.name, who, lease.generation))
            await asyncio.sleep(0.05)  # work
            await lease.complete(who)
        return ends

    async def main() -> tuple[int, AsyncLease | None, float]:
        async with client_for(cluster, leases.namespace) as client, \
                client.pool("pool=p") as pool:
            ends = sum(await asyncio.gather(*(worker(pool, f"w{i}") for i in range(10))))
            # the one feed of both pools leaves finished jobs out on the server (the async
            # pool used to cache all 8 Completed ones; issue 23, item 2)
            assert pool.unfinished() == 0 and len(pool) == 0
            # a claim_next waiting on an empty pool wakes on the watch's ADDED event
            waiting = asyncio.ensure_future(pool.claim_next("late", timeout=20))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            added = time.monotonic()
            await client.store.create(client.namespace, "item-late",
                                      {"leaseDurationSeconds": 10}, labels={"pool": "p"})
            late = await waiting
            return ends, late, time.monotonic() - added

    ends, late, woke_after = run(main)
    assert ends == 10  # every coroutine ended with None, and only then
    assert sorted(name for name, _, _ in done) == names  # each item exactly once
    assert {generation for _, _, generation in done} == {1}
    assert len({who for _, who, _ in done}) > 1  # the work was spread
    for name in names:
        status = leases.get(name).status
        assert status.phase is Phase.COMPLETED and status.generation == 1
    assert leases.get("other").status.generation == 0  # another pool: untouched
    assert late is not None and late.name == "item-late" and woke_after < 3


def test_a_pool_wakes_at_a_holders_end_and_close_ends_a_waiting_claimer(
        cluster: Any, leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "item", {"leaseDurationSeconds": 2},
                        labels={"pool": "p"})
    held = leases.claim("item", holder="elsewhere")  # never renewed: it ends on its own

    async def main() -> tuple[AsyncLease | None, float, AsyncLease | None, float]:
        async with client_for(cluster, leases.namespace) as client, \
                client.pool("pool=p") as pool:
            started = time.monotonic()
            taken = await pool.claim_next("a", timeout=15)  # no event comes: the wake-up
            took = time.monotonic() - started
            assert taken is not None
            await taken.complete()
            assert await pool.claim_next("a", timeout=5, until_empty=True) is None
            waiting = asyncio.ensure_future(pool.claim_next("b", timeout=30))
            await asyncio.sleep(0.3)
            closed_at = time.monotonic()
            await pool.close()
            after_close = await waiting
            return taken, took, after_close, time.monotonic() - closed_at

    taken, took, after_close, close_took = run(main)
    assert taken is not None and taken.generation == held.generation + 1
    assert took < 4  # held for 2 s from the claim, plus margin and the Date's second
    assert after_close is None and close_took < 1


def test_a_pool_the_identity_may_not_list_raises_at_once(cluster: Any, leases: LeaseClient
                                                        ) -> None:
    from joblease.kube.api import ForbiddenError

    async def main() -> float:
        async with client_for(cluster, leases.namespace, "alice", calibrate=False) as client:
            started = time.monotonic()
            with pytest.raises(ForbiddenError):
                await client.claim_next("pool=p", "alice", timeout=20)
            return time.monotonic() - started

    assert run(main) < 5  # a refusal is not waited out like an outage


# -- helpers ----------------------------------------------------------------------------------

class _BlockingCalls:
    """Records blocking calls made on a thread that is running an event loop."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import http.client

        import urllib3.connectionpool

        self.calls: list[str] = []
        for owner, attribute, name in (
                (time, "sleep", "time.sleep"),
                (http.client.HTTPConnection, "request", "http.client request"),
                (urllib3.connectionpool.HTTPConnectionPool, "urlopen", "urllib3 urlopen")):
            monkeypatch.setattr(owner, attribute, self._wrap(getattr(owner, attribute), name))

    def _wrap(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if asyncio._get_running_loop() is not None:
                self.calls.append(name)
            return original(*args, **kwargs)
        return recorded


class _SlowCallbacks(logging.Handler):
    """Collects asyncio's "Executing <...> took N seconds" warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing"):
            self.records.append(message)

    @contextlib.contextmanager
    def watching(self) -> Any:
        logger = logging.getLogger("asyncio")
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)




def test_the_display_reads_match_the_thread_clients_on_a_real_server(
        cluster: Any, leases: LeaseClient) -> None:
    """get_object, events, list_objects, count and server_now: the same answers from both
    clients (issue 31: the CLI's ls/describe/work use only these, no client internals)."""
    ns = leases.namespace
    for i in range(3):
        leases.store.create(ns, f"job-{i}", {"leaseDurationSeconds": 30}, {"batch": "b1"})
    leases.store.create(ns, "other", {}, {"batch": "b2"})
    leases.claim("job-0", holder="a").release(failed=True)  # Available again, one attempt
    leases.claim("job-2", holder="b")  # Held: the phase count must leave it out
    obs = leases.get("job-1")
    leases.store.post_event(obs, "Normal", "Checked", "by the test")

    async def main() -> tuple[Any, ...]:
        async with client_for(cluster, ns, calibrate=False) as client:
            return (await client.get_object("job-1"), await client.events(obs),
                    await client.list_objects("batch=b1"), await client.count("batch=b1"),
                    await client.count("batch=b1", phase=Phase.AVAILABLE),
                    await client.server_now())

    raw, events, objects, total, available, now = run(main)
    assert raw["metadata"]["labels"] == {"batch": "b1"} and raw == leases.get_object("job-1")
    assert [e["reason"] for e in events] == ["Checked"] == [
        e["reason"] for e in leases.events(obs)]
    assert sorted(o["metadata"]["name"] for o in objects) == ["job-0", "job-1", "job-2"]
    assert [o["metadata"]["name"] for o in leases.list_objects("batch=b1")] == sorted(
        o["metadata"]["name"] for o in objects)
    assert total == 3 == leases.count("batch=b1")
    # job-1 was never written (born Available: the CRD's status default), job-0 is Available
    # again after its release, job-2 is Held
    assert available == 2 == leases.count("batch=b1", phase=Phase.AVAILABLE)
    assert abs((now.midpoint - leases.server_now().midpoint).total_seconds()) < 5
