"""Work pools on the real API server: claim_next, its watch, its wake-ups, its priorities.

No operator runs here unless a test starts one: then nothing but the pool's own timer can
notice that a holder stopped renewing (no watch event happens at ``leaseUntil``).

Both pools (issue 30, item 4: one engine, two drivers): a test that takes ``open_pool`` runs
once with the thread pool and once with the asyncio pool, which lives on the tests' shared
event loop (``support.clients.LOOP``) and is driven with blocking calls
(:class:`BlockingAsyncPool`), so one body serves both. What stays thread-pool only needs its
feed's ``interrupt()`` (a forced 410) or its client's clock readings by name.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import pytest

from joblease import InvalidError, LeaseFinishedError, Phase
from joblease.aio import AsyncLeaseClient, AsyncPool
from joblease.domain.lease import add_time
from joblease.kube.api import UnavailableError
from joblease.sdk.client import LeaseClient
from joblease.sdk.pool import Pool
from support.clients import LOOP, LeaseView
from support.waiting import wait_for

WAKE_BOUND = 0.3  # seconds: how late a waiting claim_next may come back


def create(leases: LeaseClient, name: str, labels: dict[str, str] | None = None,
           **spec: Any) -> None:
    leases.store.create(leases.namespace, name, spec, labels or {"pool": "p"})


def conflicts_409(cluster: Any) -> int:
    """The API server's own count of 409 answers to JobLease requests (all namespaces)."""
    text = cluster.kubectl("get", "--raw", "/metrics", check=True).stdout
    total = 0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="jobleases"' in line \
                and 'code="409"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def claim_in_thread(pool: Any, holder: str, timeout: float | None
                    ) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``claim_next`` in a thread; the dict gets the lease and when it came back."""
    result: dict[str, Any] = {}

    def run() -> None:
        result["lease"] = pool.claim_next(holder, timeout=timeout)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def synced_pool(client: LeaseClient, selector: str = "pool=p", **kwargs: Any) -> Pool:
    client.calibrate()
    pool = Pool(client, selector, **kwargs)
    pool.unfinished()  # the first list has arrived
    return pool


class BlockingAsyncPool:
    """An ``AsyncPool`` and its own ``AsyncLeaseClient`` on the shared test loop, driven
    with blocking calls as a ``Pool`` is; its leases come back as blocking ``LeaseView``s."""

    def __init__(self, kubeconfig: str, namespace: str, selector: str, **kwargs: Any) -> None:
        async def start() -> tuple[AsyncLeaseClient, AsyncPool[Any]]:
            client = AsyncLeaseClient(namespace, kubeconfig=kubeconfig)
            await client.calibrate()
            pool: AsyncPool[Any] = AsyncPool(client, selector, **kwargs)
            await pool.__aenter__()
            return client, pool

        self.client, self.real = LOOP.run(start())
        self._closed = False

    def claim_next(self, *args: Any, **kwargs: Any) -> LeaseView | None:
        lease = LOOP.run(self.real.claim_next(*args, **kwargs))
        return None if lease is None else LeaseView(lease)

    def unfinished(self, timeout: float = 30.0) -> int:
        """As ``Pool.unfinished(timeout)``: the asyncio pool's own never waits for a list."""
        async def count() -> int:
            return self.real.unfinished()

        deadline = time.monotonic() + timeout
        while True:
            try:
                return int(LOOP.run(count()))
            except UnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            LOOP.run(self.real.close())
            LOOP.run(self.client.close())

    def __enter__(self) -> BlockingAsyncPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)  # feed, conflicts, claims


def delivering(pool: Any, admin: LeaseClient, selector: str) -> None:
    """Wait until ``pool``'s watch delivers: a probe job of its selector comes and goes.

    Right after the CRD is installed, the API server's watch cache for it answers 429
    ("storage is (re)initializing") for a moment after the first list succeeded; a wake-up
    test that started then measured the feed's retries, not the pool (2 s late in 4 runs
    of 7 of the first test of a session).
    """
    labels = dict(part.split("=", 1) for part in selector.split(","))
    name = f"probe-{secrets.token_hex(3)}"
    admin.store.create(admin.namespace, name, {}, labels)
    wait_for(lambda: pool.view.get(name) is not None, 20, "the pool's watch to deliver")
    admin.store.delete_if_unchanged(admin.get(name))
    wait_for(lambda: pool.view.get(name) is None, 20, "the probe to leave the pool")


@pytest.fixture(params=["sync", "async"])
def open_pool(request: pytest.FixtureRequest, cluster: Any,
              make_client: Callable[..., LeaseClient], namespace: str
              ) -> Iterator[Callable[..., Any]]:
    """Open a pool of the parametrised kind, each with a client of its own (as ``user``),
    listed already; every pool opened is closed after the test."""
    opened: list[Any] = []
    admin = make_client()

    def open_pool(selector: str = "pool=p", user: str = "admin", **kwargs: Any) -> Any:
        pool: Any
        if request.param == "sync":
            pool = synced_pool(make_client(user), selector, **kwargs)
        else:
            pool = BlockingAsyncPool(str(cluster.kubeconfig_for(user)), namespace, selector,
                                     **kwargs)
            pool.unfinished()  # the first list has arrived
        opened.append(pool)
        delivering(pool, admin, selector)
        return pool

    yield open_pool
    for pool in opened:
        pool.close()


# --- selection ----------------------------------------------------------------------------

def test_two_pools_with_different_selectors_see_only_their_jobs(
        leases: LeaseClient, open_pool: Callable[..., Any]) -> None:
    for i in range(3):
        create(leases, f"a-{i}", {"team": "a"})
    for i in range(2):
        create(leases, f"b-{i}", {"team": "b"})
    create(leases, "loner", {})
    with open_pool("team=a") as pool_a, open_pool("team=b") as pool_b:
        assert (pool_a.unfinished(), pool_b.unfinished()) == (3, 2)
        got = [pool_a.claim_next("w", timeout=0) for _ in range(3)]
        assert sorted(lease.name for lease in got if lease) == ["a-0", "a-1", "a-2"]
        assert pool_a.claim_next("w", timeout=0.5) is None  # b's and the loner stay
        lease = pool_b.claim_next("w", timeout=0)
        assert lease is not None and lease.name.startswith("b-")
        for held in got:
            assert held is not None
            held.complete()
        wait_for(lambda: pool_a.unfinished() == 0, 5, "completed leases to leave the pool")
        assert pool_a.claim_next("w", timeout=5, until_empty=True) is None
    assert leases.get("loner").status.generation == 0


# --- many workers ---------------------------------------------------------------------------

def test_workers_claim_every_job_exactly_once_with_few_409s(
        cluster: Any, make_client: Callable[..., LeaseClient],
        open_pool: Callable[..., Any]) -> None:
    workers, jobs = 5, 40
    admin = make_client()
    for i in range(jobs):
        create(admin, f"job-{i:02d}")
    pools = [open_pool() for _ in range(workers)]
    before = conflicts_409(cluster)
    claimed: list[tuple[str, int]] = []
    lock = threading.Lock()

    def work(pool: Any, holder: str) -> None:
        for _ in range(jobs + 1):  # bounded: never more claims than jobs
            lease = pool.claim_next(holder, timeout=20, until_empty=True)
            if lease is None:
                return
            with lock:
                claimed.append((lease.name, lease.generation))
            lease.complete(holder)

    threads = [threading.Thread(target=work, args=(pool, f"worker-{n}"))
               for n, pool in enumerate(pools)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    refused = conflicts_409(cluster) - before
    for pool in pools:
        pool.close()
    assert sorted(claimed) == [(f"job-{i:02d}", 1) for i in range(jobs)]  # once each
    for i in range(jobs):
        status = admin.get(f"job-{i:02d}").status
        assert status.phase is Phase.COMPLETED and status.generation == 1
    lost = sum(pool.conflicts for pool in pools)
    print(f"{workers} workers, {jobs} jobs: {refused} 409s from the API server, "
          f"{lost} lost races counted by the pools")
    assert refused <= lost  # every 409 was a lost race the pool saw (no re-read storm)
    # Uncoordinated choices collide at the birthday bound of the window, which shrinks
    # as the queue drains: sum over r remaining of (workers - 1) / min(spread, r) is about
    # 12 for 5 workers and 40 jobs (measured: 11-16). A herd would cost ~4 per claim.
    assert refused <= jobs // 2, f"{refused} conflicts for {jobs} claims"


def test_threads_sharing_one_pool_never_race_each_other(
        cluster: Any, leases: LeaseClient, open_pool: Callable[..., Any]) -> None:
    jobs = 24
    for i in range(jobs):
        create(leases, f"job-{i:02d}")
    pool = open_pool()
    before = conflicts_409(cluster)
    names: list[str] = []

    def work() -> None:
        for _ in range(jobs + 1):
            lease = pool.claim_next("one-worker", timeout=10, until_empty=True)
            if lease is None:
                return
            names.append(lease.name)
            lease.complete()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    pool.close()
    assert sorted(names) == [f"job-{i:02d}" for i in range(jobs)]
    assert pool.conflicts == 0 and conflicts_409(cluster) == before


# --- wake-ups -------------------------------------------------------------------------------

def test_a_waiting_claim_wakes_when_a_job_is_created_or_released(
        make_client: Callable[..., LeaseClient], open_pool: Callable[..., Any]) -> None:
    admin = make_client()
    pool = open_pool()
    thread, result = claim_in_thread(pool, "w", timeout=10)
    time.sleep(0.5)
    created = time.monotonic()
    create(admin, "new-job")
    thread.join(12)
    assert result["lease"] is not None and result["lease"].name == "new-job"
    print(f"woke {result['at'] - created:.3f}s after the create was sent")
    assert result["at"] - created < WAKE_BOUND, f"woke {result['at'] - created:.3f}s late"

    result["lease"].release()
    admin.calibrate()
    held = admin.claim("new-job", holder="other")
    thread, result = claim_in_thread(pool, "w", timeout=10)
    time.sleep(0.5)
    assert "lease" not in result  # held by "other": nothing to claim
    released = time.monotonic()
    held.release()
    thread.join(12)
    assert result["lease"] is not None and result["lease"].generation == 3
    print(f"woke {result['at'] - released:.3f}s after the release was sent")
    assert result["at"] - released < WAKE_BOUND, f"woke {result['at'] - released:.3f}s late"
    pool.close()


def test_a_waiting_claim_wakes_at_lease_until_plus_margin_when_the_holder_stops(
        make_client: Callable[..., LeaseClient]) -> None:
    holder, worker = make_client(), make_client()
    create(holder, "job", leaseDurationSeconds=2)
    holder.calibrate()
    stopped = holder.claim("job", holder="silent")  # never renewed; no operator runs
    pool = synced_pool(worker)
    events = pool.feed.counts.events
    thread, result = claim_in_thread(pool, "w", timeout=10)
    thread.join(12)
    lease = result["lease"]
    assert lease is not None and lease.generation == 2
    assert stopped.lease_until is not None
    expected = worker.api.clock.monotonic_certain(add_time(stopped.lease_until,
                                                          worker.margin()))
    late = result["at"] - expected
    print(f"woke {late:+.3f}s from leaseUntil + margin")
    assert -0.05 < late < WAKE_BOUND, f"woke {late:+.3f}s from leaseUntil + margin"
    assert pool.feed.counts.events - events <= 1  # at most the echo of its own claim
    pool.close()


def claim_when_claimable(cluster: Any, kind: str, namespace: str, selector: str,
                         claimable: Callable[[timedelta], datetime]) -> tuple[int, float]:
    """One ``claim_next`` by the ``kind`` pool of a fresh client; the generation it took,
    and how late it came back after ``claimable(margin)`` had certainly passed, as that
    client's own clock estimate tells (seconds, negative: early)."""
    kubeconfig = str(cluster.kubeconfig_for("admin"))
    if kind == "sync":
        client = LeaseClient(namespace, kubeconfig=kubeconfig)
        client.calibrate()
        with client.pool(selector) as pool:
            lease = pool.claim_next("w", timeout=10)
            at = time.monotonic()
        expected = client.api.clock.monotonic_certain(claimable(client.margin()))
        client.close()
        assert lease is not None
        return lease.generation, at - expected

    async def main() -> tuple[int, float]:
        async with AsyncLeaseClient(namespace, kubeconfig=kubeconfig) as aclient, \
                aclient.pool(selector) as apool:
            await aclient.calibrate()
            alease = await apool.claim_next("w", timeout=10)
            came = time.monotonic()
            assert alease is not None
            due = aclient.api.clock.monotonic_certain(claimable(await aclient.margin()))
            return alease.generation, came - due

    return asyncio.run(main())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_both_pools_wake_when_a_holders_end_and_a_rest_have_certainly_passed(
        cluster: Any, make_client: Callable[..., LeaseClient], kind: str) -> None:
    """One engine, one clock (the transport's), both pools: the wake-ups on a real server.

    Neither pool gets an event at ``leaseUntil + margin`` or at ``notBefore``: only its
    timer, on the transport's monotonic clock and server-time estimate, brings it back.
    """
    holder = make_client()
    holder.calibrate()
    # 4 s, and a rest of 3 s: time for the pool's client to calibrate (up to 1.5 s) and
    # list before the moment it must wake at
    create(holder, "job", leaseDurationSeconds=4)
    stopped = holder.claim("job", holder="silent")  # never renewed; no operator runs
    assert stopped.lease_until is not None
    until = stopped.lease_until
    generation, late = claim_when_claimable(cluster, kind, holder.namespace, "pool=p",
                                            lambda margin: add_time(until, margin))
    print(f"{kind}: woke {late:+.3f}s from leaseUntil + margin")
    assert generation == 2 and -0.05 < late < WAKE_BOUND

    create(holder, "rests", {"pool": "r"},
           backoff={"initialSeconds": 3, "factor": 2, "maxSeconds": 6})
    holder.claim("rests", holder="a").release(failed=True)
    rest_end = wait_for(lambda: holder.get("rests").status.not_before, 5, "notBefore")
    generation, late = claim_when_claimable(cluster, kind, holder.namespace, "pool=r",
                                            lambda _margin: rest_end)
    print(f"{kind}: woke {late:+.3f}s from notBefore")
    assert generation == 2 and -0.05 < late < WAKE_BOUND


def test_backoff_is_respected_after_a_failed_release_and_after_an_expiry(
        make_client: Callable[..., LeaseClient]) -> None:
    holder, worker = make_client(), make_client()
    backoff = {"initialSeconds": 1, "factor": 2, "maxSeconds": 4}
    create(holder, "fails", backoff=backoff)
    holder.calibrate()
    pool = synced_pool(worker)
    holder.claim("fails", holder="a").release(failed=True)
    rest_end = wait_for(lambda: holder.get("fails").status.not_before, 5, "notBefore")
    thread, result = claim_in_thread(pool, "w", timeout=10)
    thread.join(12)
    assert result["lease"] is not None and result["lease"].name == "fails"
    late = result["at"] - worker.api.clock.monotonic_certain(rest_end)
    print(f"woke {late:+.3f}s from notBefore")
    assert -0.05 < late < WAKE_BOUND, f"woke {late:+.3f}s from notBefore"
    result["lease"].complete()

    create(holder, "expires", leaseDurationSeconds=1, backoff=backoff)
    stopped = holder.claim("expires", holder="silent")  # runs out; its expiry earns 1 s
    assert stopped.lease_until is not None
    rest_end = add_time(stopped.lease_until, timedelta(seconds=1))
    thread, result = claim_in_thread(pool, "w", timeout=10)
    thread.join(12)
    assert result["lease"] is not None and result["lease"].name == "expires"
    late = result["at"] - worker.api.clock.monotonic_certain(rest_end)
    print(f"woke {late:+.3f}s from leaseUntil + backoff")
    assert -0.05 < late < WAKE_BOUND, f"woke {late:+.3f}s from leaseUntil + backoff"
    assert worker.get("expires").status.attempts == 1
    pool.close()


def test_a_timeout_returns_none_and_until_empty_returns_at_once(
        open_pool: Callable[..., Any]) -> None:
    pool = open_pool()
    start = time.monotonic()
    assert pool.claim_next("w", timeout=0.5) is None
    assert 0.5 <= time.monotonic() - start < 0.5 + WAKE_BOUND
    start = time.monotonic()
    assert pool.claim_next("w", until_empty=True) is None  # timeout=None, yet at once
    assert time.monotonic() - start < 0.1
    thread, result = claim_in_thread(pool, "w", timeout=None)  # waits forever...
    time.sleep(0.3)
    closed = time.monotonic()
    pool.close()  # ...until the pool is closed under it
    thread.join(5)
    assert result == {"lease": None, "at": pytest.approx(closed, abs=WAKE_BOUND)}


# --- priorities -----------------------------------------------------------------------------

def test_all_priority_10_jobs_are_claimed_before_any_priority_0(
        make_client: Callable[..., LeaseClient], open_pool: Callable[..., Any]) -> None:
    admin = make_client()
    for i in range(4):
        create(admin, f"low-{i}")  # older: FIFO alone would take them first
    for i in range(4):
        create(admin, f"high-{i}", priority=10)
    pools = [open_pool() for _ in range(3)]
    leases: list[Any] = []
    lock = threading.Lock()

    def work(pool: Any, holder: str) -> None:
        for _ in range(9):
            # until_empty, not timeout=0: a job's turn may belong to another worker for a
            # moment (docs/pools.md); "nothing for me now" is not "nothing left"
            lease = pool.claim_next(holder, timeout=10, until_empty=True)
            if lease is None:
                return
            with lock:
                leases.append(lease)

    threads = [threading.Thread(target=work, args=(p, f"w{n}")) for n, p in enumerate(pools)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for pool in pools:
        pool.close()
    assert len(leases) == 8
    acquired = {name: admin.get(name).status.acquire_time for name in
                [f"high-{i}" for i in range(4)] + [f"low-{i}" for i in range(4)]}
    last_high = max(t for n, t in acquired.items() if n.startswith("high") and t)
    first_low = min(t for n, t in acquired.items() if n.startswith("low") and t)
    # each client stamps its own estimate of server time: allow their error bounds
    assert last_high <= first_low + timedelta(milliseconds=50), acquired


# --- the watch ------------------------------------------------------------------------------

def test_the_watch_resumes_after_the_server_ends_it_without_relisting(
        leases: LeaseClient, open_pool: Callable[..., Any]) -> None:
    pool = open_pool(watch_seconds=1)
    wait_for(lambda: pool.feed.counts.watches >= 3, 10, "the watch to be resumed twice")
    create(leases, "late")
    lease = pool.claim_next("w", timeout=5)
    assert lease is not None and lease.name == "late"
    assert pool.feed.counts.lists == 1 and pool.feed.counts.gone == 0
    pool.close()


def test_a_410_from_the_real_server_makes_the_pool_list_again(leases: LeaseClient) -> None:
    create(leases, "before")
    pool = synced_pool(leases)
    wait_for(lambda: pool.feed.counts.watches == 1, 5, "the watch to open")
    # as if this watch had been away long enough for the server to forget its version
    pool.feed.resource_version = "1"
    pool.feed.interrupt()
    wait_for(lambda: pool.feed.counts.lists == 2, 10, "a re-list after 410")
    assert pool.feed.counts.gone == 1
    create(leases, "after")
    names = {lease.name for _ in range(2) if (lease := pool.claim_next("w", timeout=5))}
    assert names == {"before", "after"}
    pool.close()


# --- the CRD --------------------------------------------------------------------------------

def test_the_crd_refuses_a_backoff_whose_cap_is_below_its_start(leases: LeaseClient) -> None:
    with pytest.raises(InvalidError,
                       match=re.escape("spec.backoff.maxSeconds must be at least "
                                       "spec.backoff.initialSeconds")):
        create(leases, "bad", backoff={"initialSeconds": 60, "maxSeconds": 10})


def test_kubectl_selects_jobleases_by_phase(cluster: Any, leases: LeaseClient) -> None:
    create(leases, "fails", maxAttempts=1)
    create(leases, "fine")
    with pytest.raises(LeaseFinishedError):
        leases.claim("fails", holder="a").release(failed=True)
    assert leases.get("fails").status.phase is Phase.FAILED
    out = cluster.kubectl("get", "jl", "-n", leases.namespace, "-o", "name",
                          "--field-selector", "status.phase=Failed", check=True).stdout
    assert out.split() == ["joblease.joblease.dev/fails"]
    out = cluster.kubectl("get", "jl", "-n", leases.namespace, "-o", "name",
                          "--field-selector", "status.phase!=Failed", check=True).stdout
    assert out.split() == ["joblease.joblease.dev/fine"]
