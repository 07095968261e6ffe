"""A work pool from asyncio code: one list+watch feeding the pure ``PoolView``, many claimers.

``joblease.domain.pool.PoolView`` decides what to claim next and when to look again (its
docstring: candidates by priority then age, rendezvous choice among the first few, a name
set aside after a refused claim until a newer version of it arrives, the next wake-up).
This module keeps the view fed — one task awaits the one feed of both pools
(``joblease.core.feed.Feed``: list, watch, resume, re-list after 410, backoff with jitter,
finished leases filtered on the server, unreadable objects skipped) — and drives the
claims with the one claim operation of both pools (``joblease.core.claiming``). Only the
waiting (a task and an event, where ``joblease.sdk.Pool`` has a thread and a condition)
is its own:

1. choose from the cache (no request to find work);
2. claim the chosen lease with one conditional write decided from the cached version; if
   it is refused (409, held, resting, finished, gone) set the name aside and choose again
   at once: a lost race costs one request;
3. if the write's answer is lost, retry the same name with the same claim id from a fresh
   read, so a claim that landed is adopted, never refused or orphaned;
4. fold the claim's answer into the view, so the next choice already knows;
5. with nothing claimable, wait for a watch event, the view's next wake-up, or the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from joblease.core.asteps import AsyncPort, adrive
from joblease.core.claiming import PooledLease, claim_chosen
from joblease.core.feed import WATCH_SECONDS, Feed
from joblease.core.presence import Presence
from joblease.domain.errors import LeaseFinishedError, PoolClosedError
from joblease.domain.lease import Observed
from joblease.domain.pool import DEFAULT_SPREAD, PoolView, seconds_until_wake
from joblease.kube.aioleases import AsyncLeaseStore
from joblease.kube.api import ApiError, UnavailableError
from joblease.kube.transport import AsyncTransport

L = TypeVar("L", bound=PooledLease)
L_co = TypeVar("L_co", bound=PooledLease, covariant=True)


class AsyncPoolClient(Protocol[L_co]):
    """What an :class:`AsyncPool` needs of its client (``AsyncLeaseClient``): its public surface."""

    namespace: str
    store: AsyncLeaseStore
    api: AsyncTransport

    async def calibrate_if_due(self) -> None:
        """Calibrate once, before the first choice."""

    async def resolve_holder(self, holder: str | None) -> str:
        """The holder written."""

    async def margin(self) -> timedelta:
        """The margin in force now."""

    async def claim(self, name: str, holder: str | None = None, *,
                    observed: Observed | None = None, claim_id: str | None = None,
                    max_conflicts: int = ...) -> L_co:
        """Claim once (the pool's one conditional write)."""

log = logging.getLogger("joblease.aio")
MIN_WAIT = 0.01


class _Sink:
    """What the feed calls (``joblease.core.feed.FeedSink``), kept off AsyncPool's surface."""

    def __init__(self, pool: AsyncPool[Any]) -> None:
        self._pool = pool

    def replace(self, items: list[Observed], resource_version: str) -> None:
        """A complete list: the view starts over; waiting claimers look again."""
        pool = self._pool
        pool.view.replace(items, resource_version)
        pool._synced, pool._trouble = True, None
        pool._signal()

    def apply(self, event_type: str, obs: Observed) -> None:
        """A watch event."""
        self._pool.view.apply(event_type, obs)
        self._pool._signal()

    def bookmark(self, resource_version: str) -> None:
        """A BOOKMARK: the resume point moved."""
        self._pool.view.bookmark(resource_version)

    def workers(self, live: dict[str, datetime]) -> None:
        """The presence records just listed (``joblease.core.presence.PresenceSink``)."""
        self._pool._workers(live)

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed: a claimer that never saw a list may raise it."""
        pool = self._pool
        pool.watch_errors += 1
        pool._trouble = error
        pool._signal()
        log.warning("JobLease pool %r: list/watch failed (%s); retrying", pool.selector, error)


class AsyncPool(Generic[L]):
    """The JobLeases of one label selector in the client's namespace, claimed one at a time.

    ``async with client.pool(selector) as pool:`` starts the list+watch task (and stops it
    on exit); any number of coroutines may then ``await pool.claim_next(...)``.

    Attributes:
        view: The pure view of the pool (``PoolView``) the watch keeps current.
        watch_errors: Lists or watches that failed and were retried (with backoff).
        conflicts: Claims refused (how often claimers collided).
        claims: Claims won.
        presence: This worker's presence in the pool (``joblease.core.presence``; ``None``
            until the first ``claim_next``, whose holder names the worker, or when off).
    """

    def __init__(self, client: AsyncPoolClient[L], selector: str | None, *,
                 spread: int = DEFAULT_SPREAD, watch_seconds: int = WATCH_SECONDS,
                 presence: bool = True) -> None:
        self.client = client
        self.selector = selector
        self.spread = spread
        self.view = PoolView()
        self.watch_errors = 0
        self.conflicts = 0
        self.claims = 0
        self._claiming: set[str] = set()  # names this pool's coroutines are claiming now
        self._changed = asyncio.Event()
        self._synced = False
        self._trouble: ApiError | None = None
        self._dead: Exception | None = None
        self._closed = False
        self._follower: asyncio.Task[None] | None = None
        self.feed = Feed(client.namespace, selector, watch_seconds=watch_seconds)
        # claims through the client's public claim(), like any caller's
        self._port = AsyncPort(client.store, claim=client.claim)
        self._with_presence = presence
        self.presence: Presence | None = None
        self._presence_names: set[str] = set()
        self._presence_task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.view)

    def unfinished(self) -> int:
        """How many JobLeases of the pool are not Completed or Failed (as last seen)."""
        return self.view.unfinished()

    async def __aenter__(self) -> AsyncPool[L]:
        self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def live_workers(self) -> list[str]:
        """The workers of the pool alive as last known (presence records, holders)."""
        return self.view.live_workers(self.client.api.clock.now(self.client.api.monotonic()))

    async def close(self) -> None:
        """Stop watching (idempotent); a waiting ``claim_next`` returns ``None``."""
        self._closed = True
        self._signal()
        follower, self._follower = self._follower, None
        presence_task, self._presence_task = self._presence_task, None
        for task in (follower, presence_task):
            if task is not None:
                task.cancel()
                await asyncio.wait([task])
        if presence_task is not None and self.presence is not None:
            with contextlib.suppress(Exception):  # best effort: a record left behind lapses
                await adrive(self.presence.leave_steps(), AsyncPort(self.client.store))

    async def claim_next(self, holder: str | None = None, *, timeout: float | None = None,
                         spread: int | None = None, until_empty: bool = False
                         ) -> L | None:
        """Claim the next claimable JobLease of the pool, waiting up to ``timeout`` seconds.

        Args:
            holder: As for ``claim`` (``None``: ``default_holder()``).
            timeout: Seconds to wait; ``None`` waits until one is claimed, ``0`` tries what
                the view holds now.
            spread: How many of the first candidates of the top priority to choose among.
            until_empty: Return ``None`` at once when no unfinished lease is left.

        Returns:
            The held lease, or ``None``: the timeout passed, the pool was closed, or (with
            ``until_empty``) it is empty.

        Raises:
            UnavailableError: no list arrived before the timeout, or a claim's answer was
                lost and the server stayed unreachable until then (it may have landed: it
                expires on its own).
            ApiError: the list, watch or a claim was refused (``ForbiddenError``: RBAC must
                allow ``list`` and ``watch`` on jobleases).
            PoolClosedError: the pool's watch stopped on an unexpected error.
        """
        self._start()
        client = self.client
        await client.calibrate_if_due()
        who = await client.resolve_holder(holder)
        self._announce(who)
        end = None if timeout is None else client.api.monotonic() + timeout
        width = self.spread if spread is None else spread
        while True:
            chosen = await self._choose_or_wait(who, end, width, until_empty)
            if chosen is None:
                return None
            try:
                lease = await self._claim(chosen, who, end)
            finally:
                self._claiming.discard(chosen.name)
            if lease is not None:
                return lease

    # -- choosing and waiting ---------------------------------------------------------------

    async def _choose_or_wait(self, who: str, end: float | None, spread: int,
                              until_empty: bool) -> Observed | None:
        """The cached lease to try now, after waiting for one; ``None``: give up (step 5)."""
        await self._wait_synced(end)
        api = self.client.api
        while True:
            if self._closed:
                self._raise_if_dead()
                return None  # closed under a waiting claim: a worker's loop ends
            changed = self._changed  # before looking: no event slips in between
            now = await api.server_now()
            margin = await self.client.margin()
            chosen = self.view.choose(who, now, margin, spread, exclude=self._claiming)  # 1
            if chosen is not None:
                self._claiming.add(chosen.name)  # sibling coroutines choose others meanwhile
                return chosen
            if until_empty and self.view.unfinished() == 0:
                return None
            left = None if end is None else end - api.monotonic()
            if left is not None and left <= 0:
                return None
            wake = self.view.next_wake(now, margin)
            wait = None if wake is None else max(
                MIN_WAIT, seconds_until_wake(api.clock, wake, api.monotonic()))
            await _until(changed, _least(wait, left))  # 5

    async def _wait_synced(self, end: float | None) -> None:
        """Wait for the first list; raise a refusal (403, no CRD, bad selector) at once."""
        api = self.client.api
        while not self._synced and not self._closed:
            if self._trouble is not None and not isinstance(self._trouble, UnavailableError):
                raise self._trouble
            left = None if end is None else end - api.monotonic()
            if left is not None and left <= 0:
                if self._trouble is not None:
                    raise self._trouble
                raise UnavailableError(0, "NotSynced", f"JobLease pool {self.selector!r}: no "
                                       "list of its leases within the timeout")
            await _until(self._changed, left)

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise PoolClosedError(f"JobLease pool {self.selector!r}: its watch stopped: "
                                  f"{self._dead!r}") from self._dead

    # -- claiming -----------------------------------------------------------------------------

    async def _claim(self, chosen: Observed, who: str, end: float | None) -> L | None:
        """Claim ``chosen`` (steps 2-4, ``joblease.core.claiming``); ``None``: choose again."""
        lease: L | Exception = await adrive(
            claim_chosen(chosen, who, end, self.client.api.monotonic), self._port)
        if isinstance(lease, Exception):
            written = lease.written if isinstance(lease, LeaseFinishedError) else None
            if isinstance(written, Observed):  # this claim wrote Failed: the view learns it
                self.view.learn(written)
            else:
                self.conflicts += 1
                self.view.set_aside(chosen.name, chosen.resource_version)  # 2
            return None
        if lease.observed is not None:
            self.view.learn(lease.observed)  # 4
        self.claims += 1
        return lease

    # -- the watch ------------------------------------------------------------------------

    def _start(self) -> None:
        if self._follower is None and not self._closed:
            self._follower = asyncio.get_running_loop().create_task(
                self._follow(), name=f"joblease-pool-{self.selector}")

    async def _follow(self) -> None:
        """List, then watch from the list's version; resume after each end; list after 410."""
        try:
            await self._feed()
        except Exception as err:  # a bug must not leave claimers waiting on a dead watch
            log.exception("JobLease pool %r: the watch stopped", self.selector)
            self._dead, self._closed = err, True
            self._signal()

    async def _feed(self) -> None:
        """The one feed (``joblease.core.feed.Feed``), awaited; it ends only by cancellation."""
        await adrive(self.feed.steps(_Sink(self)), AsyncPort(self.client.store))

    # -- presence -------------------------------------------------------------------------------

    def _announce(self, who: str) -> None:
        """Start this worker's presence in the pool, once (the first holder names it)."""
        if not self._with_presence or self.presence is not None or self._closed:
            return
        self.presence = Presence(self.client.namespace, self.selector, who)
        self._presence_task = asyncio.get_running_loop().create_task(
            self._run_presence(self.presence), name=f"joblease-presence-{self.selector}")

    async def _run_presence(self, presence: Presence) -> None:
        try:
            await adrive(presence.steps(_Sink(self)), AsyncPort(self.client.store))
        except Exception:  # presence is an optimisation: its failure must not stop claims
            log.exception("JobLease pool %r: presence stopped", self.selector)

    def _workers(self, live: dict[str, datetime]) -> None:
        for name in self._presence_names - live.keys():
            self.view.forget_worker(name)
        for name, until in live.items():
            self.view.note_worker(name, until)
        self._presence_names = set(live)
        self._signal()  # other workers change the turns: waiting claimers choose again

    def _signal(self) -> None:
        """Wake every coroutine waiting on the pool (each captured the event before looking)."""
        self._changed.set()
        self._changed = asyncio.Event()


def _least(*seconds: float | None) -> float | None:
    known = [s for s in seconds if s is not None]
    return min(known) if known else None


async def _until(event: asyncio.Event, seconds: float | None) -> None:
    """Wait for ``event``, at most ``seconds`` (``None``: without a bound)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
