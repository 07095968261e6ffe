"""Work pools: claim the *next* JobLease of a label selector, not a named one (issue 17).

A :class:`Pool` owns one list+watch (``joblease.core.feed.LeaseFeed``, in a thread of its
own) feeding one engine (``joblease.core.pool_engine.PoolEngine``: the cache, the choice, the
waits, the refusals, the first list and presence, written once for this pool and the asyncio
one), and is shared by every thread of a worker that claims from the same selector.
``claim_next``:

1. asks the engine which cached lease to claim (``PoolView.choose``: priority, FIFO, one
   owner per job and turns) — no request to find work;
2. claims it with one conditional write decided from the cached version
   (``joblease.core.claiming``); a refusal sets the name aside until the watch brings a
   newer version, and the next one is chosen at once: a lost race costs one request;
3. retries a lost answer on *the same name with the same claim id*, from a fresh read, so a
   write that did land is adopted rather than refused or orphaned;
4. folds the claim's answer into the cache, so the next choice, by this thread or another,
   already knows;
5. when nothing is claimable, waits on the pool's condition for whichever comes first: a
   change (a watch event, a list, presence, a sibling's claim ending), the earliest instant
   something becomes claimable without any event (``PoolView.next_wake`` through the
   transport's clock), or the timeout. There is no polling period.

All that is this module's own is how it waits and what runs where: threads and a
condition, where ``joblease.aio.AsyncPool`` has tasks and an event. One thread runs the
feed's scope (the engine says which: the whole pool, or, while a dispatcher lives, only
this worker's jobs and those that did not opt in, ``joblease.core.scope``), with one
``LeaseFeed`` thread per stream, and switches when the engine's wanted scope changes.
Safety never rests on the cache: every claim is a compare-and-swap decided by the same
protocol as ``LeaseClient.claim``; a stale cache only costs a refused write.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import timedelta
from types import TracebackType
from typing import Generic, Protocol, TypeVar, cast

from joblease.core.claiming import ADOPTION_REFUSED, PooledLease, claim_chosen, claim_proposed
from joblease.core.feed import WATCH_SECONDS, FeedSink, LeaseFeed
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
from joblease.core.steps import Stopped, SyncPort, drive
from joblease.domain.dispatch import Proposal
from joblease.domain.lease import Observed
from joblease.domain.pool import DEFAULT_SPREAD, PoolView
from joblease.domain.token import FencingToken
from joblease.kube.leases import LeaseStore
from joblease.kube.transport import Transport

L = TypeVar("L", bound=PooledLease)
L_co = TypeVar("L_co", bound=PooledLease, covariant=True)


class PoolClient(Protocol[L_co]):
    """What a :class:`Pool` needs of its client (``LeaseClient``): the public surface only."""

    namespace: str
    store: LeaseStore
    api: Transport

    def calibrate_if_due(self) -> None:
        """Calibrate once, before the first choice."""

    def resolve_holder(self, holder: str | None) -> str:
        """The holder written."""

    def margin(self) -> timedelta:
        """The margin in force now."""

    def claim(self, name: str, holder: str | None = None, *, observed: Observed | None = None,
              claim_id: str | None = None, max_conflicts: int = ...) -> L_co:
        """Claim once (the pool's one conditional write)."""

    def resume(self, name: str, holder: str | None, token: FencingToken,
               claim_id: str | None = None, *, observed: Observed | None = None) -> L_co:
        """A lease for a claim made elsewhere (a dispatcher's, adopted)."""


class Renewable(Protocol):
    """What adopting a dispatcher's claim needs of a lease: its first renewal."""

    def renew(self) -> None:
        """Renew once (the adoption: a conditional write)."""

DEFAULT_SYNC_TIMEOUT = 30.0

log = logging.getLogger(__name__)


class Pool(EngineFront, Generic[L]):
    """The JobLeases of one label selector, kept current by a watch; claims the next one.

    Thread-safe: one pool serves every thread of a worker (``joblease work`` runs K jobs
    at a time). Close it (``close()``, or ``with client.pool(selector) as pool:``) to stop
    its watch.

    Args:
        client: The ``LeaseClient`` whose identity, margin and clock estimate it uses
            (any :class:`PoolClient`: the pool uses only the client's public surface).
        selector: A label selector (``team=batch,queue=nightly``); ``""`` is every JobLease
            of the client's namespace.
        spread: The default ``spread`` of :meth:`claim_next`.
        watch_seconds: How long each watch runs before the server ends it and the pool
            resumes it (tests shorten it).
        presence: Keep a presence record for this worker and read the others'
            (``joblease.core.presence``), so each job has one owner among the live
            workers; started by the first ``claim_next`` (its holder names the worker).

    Attributes:
        selector: The label selector.
        feed: The list+watch of the whole pool (its ``counts`` say how often it listed,
            watched, met 410); the latest one, when the scope switched.
        feeds: The feeds of the scope running now (one per stream).
        engine: The pool's decisions and state (``joblease.core.pool_engine``).
        view: The engine's cache (``PoolView``).
    """

    def __init__(self, client: PoolClient[L], selector: str, *, spread: int = DEFAULT_SPREAD,
                 watch_seconds: int = WATCH_SECONDS, presence: bool = True,
                 slots: int | None = None) -> None:
        self.selector = selector
        self.spread = spread
        self._client = client
        self._changed = threading.Condition()  # reentrant: the engine takes it too
        self.engine = PoolEngine(client.namespace, selector,
                                 PoolClock(client.api, client.api.server_now),
                                 presence=presence, guard=self._changed,
                                 wake=self._changed.notify_all, slots=slots)
        self.view: PoolView = self.engine.view
        self._watch_seconds = watch_seconds
        self.feeds: list[LeaseFeed] = []
        self.feed = self._new_feed(None)
        self._port = SyncPort(client.store, claim=client.claim)  # the public claim()
        self._thread = threading.Thread(target=self._run_scopes, daemon=True,
                                        name=f"joblease-pool[{selector}]")
        self._thread.start()
        self._presence_stop = threading.Event()
        self._presence_thread: threading.Thread | None = None
        self._inbox_thread: threading.Thread | None = None
        self._inbox_port = SyncPort(client.store, stop=self._presence_stop)
        self._shut = False  # close() ran: the feed and presence are stopped

    @property
    def _view(self) -> PoolView:
        """The cache (``bench.pool_scale_worker`` times a choice over it)."""
        return self.engine.view

    # -- the public surface ----------------------------------------------------------------

    def claim_next(self, holder: str | None = None, *, timeout: float | None = None,
                   spread: int | None = None, until_empty: bool = False) -> L | None:
        """Claim the next claimable JobLease of the pool, waiting up to ``timeout`` seconds.

        Args:
            holder: As for ``LeaseClient.claim`` (``None``: ``default_holder()``).
            timeout: Seconds to wait for a claimable lease; ``None`` waits forever, ``0``
                tries what the cache holds now and returns.
            spread: How many of the first candidates of the top priority a worker reads at
                least (the window of its turns).
            until_empty: Return ``None`` at once when no unfinished lease is left in the
                pool (``joblease work --until-empty``) instead of waiting for new ones.

        Returns:
            The held ``Lease``, or ``None`` when the timeout passed, the pool was closed
            (a waiting call returns at once), or, with ``until_empty``, the pool is empty.

        Raises:
            UnavailableError: the pool could not list its leases before the timeout, or a
                claim's answer was lost and the API server stayed unreachable until then
                (the claim may have landed: it expires on its own).
            ApiError: the API server refuses the list or watch (``ForbiddenError``:
                RBAC must allow ``list`` and ``watch`` on jobleases), or a claim
                (``ForbiddenError`` from the holder-only admission policy).
            PoolClosedError: the pool's watch stopped on an unexpected error (its cause).
        """
        self._client.calibrate_if_due()
        who = self._client.resolve_holder(holder)
        self._announce(who)
        ask = self.engine.ask(who, timeout, self.spread if spread is None else spread,
                              until_empty)
        while True:
            chosen = self._choose_or_wait(ask)
            if chosen is None:
                return None
            if isinstance(chosen, ConfirmEmpty):  # ask the API server, then decide again
                self.engine.confirmed(chosen, drive(
                    unfinished_probe(self._client.namespace, self.selector), self._port))
                continue
            if isinstance(chosen, Adopt):
                lease = self._adopt(chosen.job, ask)
            elif isinstance(chosen, Propose):
                lease = self._claim_proposed(chosen.proposal, ask)
            else:
                lease = self._claim(chosen, ask)
            if lease is not None:
                return lease

    def unfinished(self, timeout: float = DEFAULT_SYNC_TIMEOUT) -> int:
        """How many leases of the pool are not Completed or Failed (after the first list).

        Raises:
            UnavailableError: no list succeeded within ``timeout`` seconds.
            ApiError: the list was refused.
        """
        with self._changed:
            self._until_listed(self.engine.clock.monotonic() + timeout)
            return self.engine.unfinished()

    def close(self) -> None:
        """Stop the watch and its thread (idempotent); a waiting ``claim_next`` returns.

        Also after the watch died (the engine is closed then, but presence still runs).
        """
        self.engine.close()
        with self._changed:
            if self._shut:
                return
            self._shut = True
        for feed in self.feeds:
            feed.stop()
        self._thread.join(timeout=10)
        self._leave()

    def __enter__(self) -> Pool[L]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- choosing, waiting, claiming (the engine decides) ------------------------------------

    def _choose_or_wait(self, ask: Ask) -> Observed | Adopt | Propose | ConfirmEmpty | None:
        """The cached lease to try now, after waiting for one; ``None``: give up (step 5)."""
        with self._changed:
            self._until_listed(ask.end)
            while True:
                margin = self._client.margin()  # after a list: its answer told the time
                seen = self.engine.changes
                decision = self.engine.decide(ask, margin)
                if not isinstance(decision, Wait):
                    return decision
                self._wait(seen, decision)

    def _until_listed(self, end: float | None) -> None:
        """Wait (holding the condition) for the first list, as the engine rules (or raise)."""
        while (wait := self.engine.await_list(end)) is not None:
            self._wait(self.engine.changes, wait)  # the lock is held: nothing changed since

    def _wait(self, seen: int, wait: Wait) -> None:
        """Wait (holding the condition) for a change after ``seen``, or ``wait.seconds``."""
        self._changed.wait_for(lambda: self.engine.changes != seen, timeout=wait.seconds)

    def _claim(self, chosen: Observed, ask: Ask) -> L | None:
        """Claim ``chosen`` (steps 2-4, ``joblease.core.claiming``); ``None``: choose again."""
        try:
            outcome: L | Exception = drive(
                claim_chosen(chosen, ask.who, ask.end, self.engine.clock.monotonic), self._port)
        except BaseException:
            self.engine.settle(chosen, None)
            raise
        return self.engine.settle(chosen, outcome)

    def _claim_proposed(self, proposal: Proposal, ask: Ask) -> L | None:
        """Read a proposed job within the pool and claim it (``claiming.claim_proposed``)."""
        try:
            read, outcome = drive(claim_proposed(
                self._client.namespace, self.selector, proposal, ask.who, ask.end,
                self.engine.clock.monotonic), self._port)
        except BaseException:
            self.engine.settle_proposal(proposal, None, None)
            raise
        return self.engine.settle_proposal(proposal, read, outcome)

    def _adopt(self, job: Observed, ask: Ask) -> L | None:
        """Adopt a dispatcher's claim for this worker: resume it and renew it once.

        The renewal is the adoption (``joblease.domain.lease.unadopted``): conditional on
        the claim being current, so a job the dispatcher took back meanwhile is refused
        here and never run. ``None``: refused (set aside), choose again.
        """
        outcome: L | Exception
        try:
            lease = self._client.resume(job.name, ask.who, job.status.token(),
                                        claim_id=job.status.claim_id, observed=job)
            cast(Renewable, lease).renew()
            outcome = lease
        except ADOPTION_REFUSED as refusal:
            outcome = refusal
        except BaseException:
            self.engine.settle(job, None)
            raise
        return self.engine.settle(job, outcome)

    # -- the feeds (a thread for the scope, one per stream) ----------------------------------

    def _new_feed(self, fields: str | None) -> LeaseFeed:
        return LeaseFeed(self._client.store, self._client.namespace, self.selector,
                         watch_seconds=self._watch_seconds, fields=fields)

    def _run_scopes(self) -> None:
        """Run the scope the engine wants, switching when it wants another, until closed."""
        first = True
        while not self.engine.closed:
            scope = self.engine.wanted_scope()
            fields = scope.fields()
            feeds = [self.feed if first and field is None else self._new_feed(field)
                     for field in fields]
            first = first and not feeds  # the feed made first serves the first list
            if feeds and not scope.narrow:
                self.feed = feeds[0]
            self._run_scope(scope, feeds)

    def _run_scope(self, scope: Scope, feeds: list[LeaseFeed]) -> None:
        """Run ``feeds`` (one per stream of ``scope``) until the engine wants another scope."""
        epoch = self.engine.open_scope(scope)
        self.feeds = feeds
        threads = [threading.Thread(target=self._run_feed,
                                    args=(feed, self.engine.stream_sink(epoch, i)),
                                    daemon=True, name=f"joblease-feed[{self.selector}]#{i}")
                   for i, feed in enumerate(feeds)]
        for thread in threads:
            thread.start()
        with self._changed:
            while not self.engine.closed and self.engine.wanted_scope() == scope:
                self._changed.wait(timeout=self.engine.scope_wake())
        for feed in feeds:
            feed.stop()
        for thread in threads:
            thread.join(timeout=5)

    def _run_feed(self, feed: LeaseFeed, sink: FeedSink) -> None:
        try:
            feed.run(sink)
        except Exception as err:  # a bug must not leave claimers waiting on a dead feed
            self.engine.died(err)

    # -- presence (its own thread; joblease.core.presence) ------------------------------------

    def _announce(self, who: str) -> None:
        """Start this worker's presence in the pool, once (the first holder names it)."""
        presence = self.engine.announce(who)
        if presence is None:
            return
        self._presence_thread = threading.Thread(
            target=self._run_presence, args=(presence,), daemon=True,
            name=f"joblease-presence[{self.selector}]")
        self._presence_thread.start()
        inbox = self.engine.inbox_feed
        if inbox is not None:
            self._inbox_thread = threading.Thread(
                target=self._run_inbox, args=(inbox,), daemon=True,
                name=f"joblease-inbox[{self.selector}]")
            self._inbox_thread.start()

    def _run_inbox(self, inbox: Inbox) -> None:
        try:
            drive(inbox.steps(self.engine), self._inbox_port)
        except Stopped:
            return
        except Exception:  # an inbox is an optimisation: its failure must not stop claims
            log.exception("JobLease pool %r: the inbox stopped", self.selector)

    def _run_presence(self, presence: Presence) -> None:
        port = SyncPort(self._client.store, stop=self._presence_stop)
        try:
            drive(presence.steps(self.engine), port)
        except Stopped:
            return
        except Exception:  # presence is an optimisation: its failure must not stop claims
            log.exception("JobLease pool %r: presence stopped", self.selector)

    def _leave(self) -> None:
        self._presence_stop.set()
        self._inbox_port.interrupt()
        if self._inbox_thread is not None:
            self._inbox_thread.join(timeout=5)
        thread, presence = self._presence_thread, self.presence
        if thread is None or presence is None:
            return
        thread.join(timeout=5)
        with contextlib.suppress(Exception):  # best effort: a record left behind lapses
            drive(presence.leave_steps(), SyncPort(self._client.store))
