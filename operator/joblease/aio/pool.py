"""A work pool from asyncio code: one list+watch feeding the pool's engine, many claimers.

The engine (``joblease.core.pool_engine.PoolEngine``) is the one copy of both pools'
decisions: which cached lease to claim (``PoolView``: priority, then age, one owner per job
and turns), how long to wait and on which clock, what a refusal means, what a claimer sees
before the first list, and presence. This module only drives it — one task awaits the one
feed of both pools (``joblease.core.feed.Feed``) into the engine — one per stream of the
scope the engine wants (``joblease.core.scope``: the whole pool, or, while a dispatcher
lives, this worker's jobs and those that did not opt in) — another runs presence,
and each ``claim_next`` asks the engine, claims with the one claim operation of both pools
(``joblease.core.claiming``) and waits when told to, on an event (``joblease.sdk.Pool``
waits on a condition, in threads):

1. choose from the cache (no request to find work);
2. claim the chosen lease with one conditional write decided from the cached version; if
   it is refused (409, held, resting, finished, gone) set the name aside and choose again
   at once: a lost race costs one request;
3. if the write's answer is lost, retry the same name with the same claim id from a fresh
   read, so a claim that landed is adopted, never refused or orphaned;
4. fold the claim's answer into the view, so the next choice already knows;
5. with nothing claimable, wait for a change, the view's next wake-up, or the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from types import TracebackType
from typing import Generic, Protocol, TypeVar, cast

from joblease.core.asteps import AsyncPort, adrive
from joblease.core.claiming import ADOPTION_REFUSED, PooledLease, claim_chosen, claim_proposed
from joblease.core.feed import WATCH_SECONDS, Feed, FeedSink
from joblease.core.inbox import Inbox
from joblease.core.pool_engine import (
    Adopt,
    Ask,
    ConfirmEmpty,
    EngineFront,
    PoolClock,
    PoolEngine,
    Propose,
    Wait,
)
from joblease.core.presence import Presence
from joblease.core.scope import Scope, unfinished_probe
from joblease.domain.dispatch import Proposal
from joblease.domain.lease import Observed
from joblease.domain.pool import DEFAULT_SPREAD, PoolView
from joblease.domain.token import FencingToken
from joblease.kube.aioleases import AsyncLeaseStore
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

    async def resume(self, name: str, holder: str | None, token: FencingToken,
                     claim_id: str | None = None, *, observed: Observed | None = None) -> L_co:
        """A lease for a claim made elsewhere (a dispatcher's, adopted)."""


class AsyncRenewable(Protocol):
    """What adopting a dispatcher's claim needs of a lease: its first renewal."""

    async def renew(self) -> None:
        """Renew once (the adoption: a conditional write)."""

log = logging.getLogger("joblease.aio")


class AsyncPool(EngineFront, Generic[L]):
    """The JobLeases of one label selector in the client's namespace, claimed one at a time.

    ``async with client.pool(selector) as pool:`` starts the list+watch task (and stops it
    on exit); any number of coroutines may then ``await pool.claim_next(...)``.

    Attributes:
        engine: The pool's decisions and state (``joblease.core.pool_engine``).
        view: The engine's cache (``PoolView``) the watch keeps current.
        feed: The list+watch of the whole pool (its ``counts``); the latest one.
        feeds: The feeds of the scope running now (one per stream).
    """

    def __init__(self, client: AsyncPoolClient[L], selector: str | None, *,
                 spread: int = DEFAULT_SPREAD, watch_seconds: int = WATCH_SECONDS,
                 presence: bool = True, slots: int | None = None) -> None:
        self.client = client
        self.selector = selector
        self.spread = spread
        self._changed = asyncio.Event()  # replaced on every change (see _signal)
        self.engine = PoolEngine(client.namespace, selector, PoolClock(client.api),
                                 presence=presence, wake=self._signal, slots=slots)
        self.view: PoolView = self.engine.view
        self._follower: asyncio.Task[None] | None = None
        self._watch_seconds = watch_seconds
        self.feed = self._new_feed(None)
        self.feeds: list[Feed] = []
        self._port = AsyncPort(client.store, claim=client.claim)  # the public claim()
        self._presence_task: asyncio.Task[None] | None = None
        self._inbox_task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.view)

    def unfinished(self) -> int:
        """How many JobLeases of the pool are not Completed or Failed, as last listed.

        Does not wait (``Pool.unfinished(timeout=0)``): before the first list there is no
        count, and it raises rather than answer 0, which would read as an empty pool.

        Raises:
            UnavailableError: no list yet (``NotSynced``, or the feed's last failure).
            ApiError: the list was refused.
        """
        self.engine.await_list(self.engine.clock.monotonic())
        return self.engine.unfinished()

    async def __aenter__(self) -> AsyncPool[L]:
        self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop watching (idempotent); a waiting ``claim_next`` returns ``None``."""
        self.engine.close()
        follower, self._follower = self._follower, None
        presence_task, self._presence_task = self._presence_task, None
        inbox_task, self._inbox_task = self._inbox_task, None
        for task in (follower, presence_task, inbox_task):
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
            spread: How many of the first candidates of the top priority to read at least.
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
        ask = self.engine.ask(who, timeout, self.spread if spread is None else spread,
                              until_empty)
        while True:
            chosen = await self._choose_or_wait(ask)
            if chosen is None:
                return None
            if isinstance(chosen, ConfirmEmpty):  # ask the API server, then decide again
                self.engine.confirmed(chosen, await adrive(
                    unfinished_probe(self.client.namespace, self.selector), self._port))
                continue
            if isinstance(chosen, Adopt):
                lease = await self._adopt(chosen.job, ask)
            elif isinstance(chosen, Propose):
                lease = await self._claim_proposed(chosen.proposal, ask)
            else:
                lease = await self._claim(chosen, ask)
            if lease is not None:
                return lease

    # -- choosing, waiting, claiming (the engine decides) ------------------------------------

    async def _choose_or_wait(self, ask: Ask) -> Observed | Adopt | Propose | ConfirmEmpty | None:
        """The cached lease to try now, after waiting for one; ``None``: give up (step 5)."""
        while (wait := self.engine.await_list(ask.end)) is not None:
            await _until(self._changed, wait.seconds)
        while True:
            margin = await self.client.margin()  # after a list: its answer told the time
            changed = self._changed  # right before deciding: no change slips in between
            decision = self.engine.decide(ask, margin)
            if not isinstance(decision, Wait):
                return decision
            await _until(changed, decision.seconds)

    async def _claim(self, chosen: Observed, ask: Ask) -> L | None:
        """Claim ``chosen`` (steps 2-4, ``joblease.core.claiming``); ``None``: choose again."""
        try:
            outcome: L | Exception = await adrive(
                claim_chosen(chosen, ask.who, ask.end, self.engine.clock.monotonic), self._port)
        except BaseException:
            self.engine.settle(chosen, None)
            raise
        return self.engine.settle(chosen, outcome)

    async def _claim_proposed(self, proposal: Proposal, ask: Ask) -> L | None:
        """Read a proposed job within the pool and claim it (as ``Pool._claim_proposed``)."""
        try:
            read, outcome = await adrive(claim_proposed(
                self.client.namespace, self.selector, proposal, ask.who, ask.end,
                self.engine.clock.monotonic), self._port)
        except BaseException:
            self.engine.settle_proposal(proposal, None, None)
            raise
        return self.engine.settle_proposal(proposal, read, outcome)

    async def _adopt(self, job: Observed, ask: Ask) -> L | None:
        """Adopt a dispatcher's claim: resume it and renew it once (as ``Pool._adopt``)."""
        outcome: L | Exception
        try:
            lease = await self.client.resume(job.name, ask.who, job.status.token(),
                                             claim_id=job.status.claim_id, observed=job)
            await cast(AsyncRenewable, lease).renew()
            outcome = lease
        except ADOPTION_REFUSED as refusal:
            outcome = refusal
        except BaseException:
            self.engine.settle(job, None)
            raise
        return self.engine.settle(job, outcome)

    # -- the watch ------------------------------------------------------------------------

    def _start(self) -> None:
        if self._follower is None and not self.engine.closed:
            self._follower = asyncio.get_running_loop().create_task(
                self._follow(), name=f"joblease-pool-{self.selector}")

    def _new_feed(self, fields: str | None) -> Feed:
        return Feed(self.client.namespace, self.selector, watch_seconds=self._watch_seconds,
                    fields=fields)

    async def _follow(self) -> None:
        """Run the scope the engine wants, switching when it wants another, until closed."""
        first = True
        while not self.engine.closed:
            scope = self.engine.wanted_scope()
            feeds = [self.feed if first and field is None else self._new_feed(field)
                     for field in scope.fields()]
            first = first and not feeds  # the feed made first serves the first list
            if feeds and not scope.narrow:
                self.feed = feeds[0]
            await self._run_scope(scope, feeds)

    async def _run_scope(self, scope: Scope, feeds: list[Feed]) -> None:
        """Run ``feeds`` (one per stream of ``scope``) until the engine wants another scope."""
        epoch = self.engine.open_scope(scope)
        self.feeds = feeds
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._stream(feed, self.engine.stream_sink(epoch, i)),
                                  name=f"joblease-feed-{self.selector}#{i}")
                 for i, feed in enumerate(feeds)]
        try:
            while not self.engine.closed and self.engine.wanted_scope() == scope:
                await _until(self._changed, self.engine.scope_wake())
        finally:
            for task in tasks:
                task.cancel()
            if tasks:  # the empty scope (PENDING) runs none; asyncio.wait refuses an empty set
                await asyncio.wait(tasks)

    async def _stream(self, feed: Feed, sink: FeedSink) -> None:
        """One stream's list+watch; a bug must not leave claimers waiting on a dead watch."""
        try:
            await self._feed(feed, sink)
        except Exception as err:
            self.engine.died(err)

    async def _feed(self, feed: Feed, sink: FeedSink) -> None:
        """One feed (``joblease.core.feed.Feed``), awaited; it ends only by cancellation."""
        await adrive(feed.steps(sink), AsyncPort(self.client.store))

    # -- presence -------------------------------------------------------------------------------

    def _announce(self, who: str) -> None:
        """Start this worker's presence in the pool, once (the first holder names it)."""
        presence = self.engine.announce(who)
        if presence is None:
            return
        loop = asyncio.get_running_loop()
        self._presence_task = loop.create_task(
            self._run_presence(presence), name=f"joblease-presence-{self.selector}")
        inbox = self.engine.inbox_feed
        if inbox is not None:
            self._inbox_task = loop.create_task(self._run_inbox(inbox),
                                                name=f"joblease-inbox-{self.selector}")

    async def _run_inbox(self, inbox: Inbox) -> None:
        try:
            await adrive(inbox.steps(self.engine), AsyncPort(self.client.store))
        except Exception:  # an inbox is an optimisation: its failure must not stop claims
            log.exception("JobLease pool %r: the inbox stopped", self.selector)

    async def _run_presence(self, presence: Presence) -> None:
        try:
            await adrive(presence.steps(self.engine), AsyncPort(self.client.store))
        except Exception:  # presence is an optimisation: its failure must not stop claims
            log.exception("JobLease pool %r: presence stopped", self.selector)

    def _signal(self) -> None:
        """Wake every coroutine waiting on the pool (each captured the event before looking)."""
        self._changed.set()
        self._changed = asyncio.Event()


async def _until(event: asyncio.Event, seconds: float | None) -> None:
    """Wait for ``event``, at most ``seconds`` (``None``: without a bound)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
