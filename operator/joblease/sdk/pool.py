"""Work pools: claim the *next* JobLease of a label selector, not a named one (issue 17).

A :class:`Pool` owns one list+watch (``joblease.core.feed.LeaseFeed``, in a thread of its
own) feeding one cache (``joblease.domain.pool.PoolView``), and is shared by every thread
of a worker that claims from the same selector. ``claim_next``:

1. chooses from the cache (``PoolView.choose``: priority, FIFO, rendezvous spread) — no
   request to find work;
2. claims the chosen lease with one conditional write decided from the cached version
   (no read first). If it is refused (409: someone was faster; held, resting or finished
   on the server) the name is set aside until the watch brings a newer version, and the
   next one is chosen at once: a lost race costs one request, never a re-read;
3. if the write's answer is lost it retries *the same name with the same claim id*, from
   a fresh read, so a write that did land is adopted rather than refused or orphaned;
4. folds the claim's answer into the cache (``PoolView.learn``) so the next choice, by
   this thread or another, already knows;
5. when nothing is claimable, waits for whichever comes first: a watch event, the
   earliest instant something becomes claimable without any event (a holder's
   ``leaseUntil + margin``, a backoff's end — ``PoolView.next_wake``, converted to this
   process's monotonic clock through the server-clock estimate), or the timeout.
   There is no polling period.

Safety never rests on the cache: every claim is a compare-and-swap decided by the same
protocol as ``LeaseClient.claim``; a stale cache only costs a refused write.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from joblease.core.claiming import PooledLease, claim_chosen
from joblease.core.feed import WATCH_SECONDS, LeaseFeed
from joblease.core.presence import Presence
from joblease.core.steps import Stopped, SyncPort, drive
from joblease.domain.errors import LeaseFinishedError, PoolClosedError
from joblease.domain.lease import Observed
from joblease.domain.pool import DEFAULT_SPREAD, PoolView, seconds_until_wake
from joblease.kube.api import ApiError, UnavailableError
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

DEFAULT_SYNC_TIMEOUT = 30.0

log = logging.getLogger(__name__)


class _Sink:
    """What the feed's thread calls (``joblease.core.feed.FeedSink``), kept off Pool's surface."""

    def __init__(self, pool: Pool[Any]) -> None:
        self._pool = pool

    def replace(self, items: list[Observed], resource_version: str) -> None:
        """A complete list: the view starts over."""
        self._pool._replace(items, resource_version)

    def apply(self, event_type: str, obs: Observed) -> None:
        """A watch event."""
        self._pool._apply(event_type, obs)

    def bookmark(self, resource_version: str) -> None:
        """A BOOKMARK: the resume point moved."""
        self._pool._bookmark(resource_version)

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed: a claimer that never saw a list may raise it."""
        self._pool._report(error)

    def workers(self, live: dict[str, datetime]) -> None:
        """The presence records just listed (``joblease.core.presence.PresenceSink``)."""
        self._pool._workers(live)


class Pool(Generic[L]):
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
        feed: The list+watch (its ``counts`` say how often it listed, watched, met 410).
        presence: This worker's presence in the pool (``None`` until the first
            ``claim_next``, or when turned off).
        conflicts: Claims refused since the pool started (409s and refusals decided from
            a stale cache): how often workers collided.
        claims: Claims won.
    """

    def __init__(self, client: PoolClient[L], selector: str, *, spread: int = DEFAULT_SPREAD,
                 watch_seconds: int = WATCH_SECONDS, presence: bool = True) -> None:
        self.selector = selector
        self.spread = spread
        self.conflicts = 0
        self.claims = 0
        self._client = client
        self._view = PoolView()
        self._changed = threading.Condition()
        self._changes = 0
        self._synced = False
        self._trouble: BaseException | None = None
        self._closed = False
        self._claiming: set[str] = set()  # names this pool's threads are claiming now
        self._dead: Exception | None = None  # what stopped the feed's thread, if not close()
        self.feed = LeaseFeed(client.store, client.namespace, selector,
                              watch_seconds=watch_seconds)
        # claims through the public claim(); pauses through this module's time.sleep
        self._port = SyncPort(client.store, claim=client.claim,
                              sleep=lambda seconds: time.sleep(seconds))
        self._thread = threading.Thread(target=self._run_feed, daemon=True,
                                        name=f"joblease-pool[{selector}]")
        self._thread.start()
        self._with_presence = presence
        self.presence: Presence | None = None
        self._presence_names: set[str] = set()
        self._presence_stop = threading.Event()
        self._presence_thread: threading.Thread | None = None

    # -- the public surface ----------------------------------------------------------------

    def claim_next(self, holder: str | None = None, *, timeout: float | None = None,
                   spread: int | None = None, until_empty: bool = False) -> L | None:
        """Claim the next claimable JobLease of the pool, waiting up to ``timeout`` seconds.

        Args:
            holder: As for ``LeaseClient.claim`` (``None``: ``default_holder()``).
            timeout: Seconds to wait for a claimable lease; ``None`` waits forever, ``0``
                tries what the cache holds now and returns.
            spread: How many of the first candidates of the top priority a worker chooses
                among (rendezvous hashing; 1 is strict FIFO, and every worker then races
                for the same lease).
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
        deadline = None if timeout is None else time.monotonic() + timeout
        width = self.spread if spread is None else spread
        while True:
            chosen = self._choose_or_wait(who, deadline, width, until_empty)
            if chosen is None:
                return None
            try:
                lease = self._claim(chosen, who, deadline)
            finally:
                with self._changed:
                    self._claiming.discard(chosen.name)
                    self._bump()  # a sibling thread waiting on this name may choose again
            if lease is not None:
                return lease

    def unfinished(self, timeout: float = DEFAULT_SYNC_TIMEOUT) -> int:
        """How many leases of the pool are not Completed or Failed (after the first list).

        Raises:
            UnavailableError: no list succeeded within ``timeout`` seconds.
        """
        with self._changed:
            self._wait_synced(time.monotonic() + timeout)
            return self._view.unfinished()

    def live_workers(self) -> list[str]:
        """The workers of the pool alive now, as this pool knows them (presence, holders)."""
        now = self._client.api.server_now()
        with self._changed:
            return self._view.live_workers(now)

    def close(self) -> None:
        """Stop the watch and its thread (idempotent); a waiting ``claim_next`` returns."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            self._changed.notify_all()
        self.feed.stop()
        self._thread.join(timeout=5)
        self._leave()

    def __enter__(self) -> Pool[L]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- the feed's side (its own thread) ----------------------------------------------------

    def _replace(self, items: list[Observed], resource_version: str) -> None:
        with self._changed:
            self._view.replace(items, resource_version)
            self._synced, self._trouble = True, None
            self._bump()

    def _apply(self, event_type: str, obs: Observed) -> None:
        with self._changed:
            self._view.apply(event_type, obs)
            self._bump()

    def _bookmark(self, resource_version: str) -> None:
        with self._changed:
            self._view.bookmark(resource_version)

    def _report(self, error: ApiError) -> None:
        with self._changed:
            self._trouble = error
            self._bump()

    def _run_feed(self) -> None:
        try:
            self.feed.run(_Sink(self))
        except Exception as err:  # a bug must not leave claimers waiting on a dead feed
            log.exception("JobLease pool %r: the watch stopped", self.selector)
            with self._changed:
                self._dead = err
                self._closed = True
                self._changed.notify_all()

    # -- presence (its own thread; joblease.core.presence) ------------------------------------

    def _announce(self, who: str) -> None:
        """Start this worker's presence in the pool, once (the first holder names it)."""
        with self._changed:
            if not self._with_presence or self.presence is not None or self._closed:
                return
            self.presence = Presence(self._client.namespace, self.selector, who)
            self._presence_thread = threading.Thread(
                target=self._run_presence, args=(self.presence,), daemon=True,
                name=f"joblease-presence[{self.selector}]")
        self._presence_thread.start()

    def _run_presence(self, presence: Presence) -> None:
        port = SyncPort(self._client.store, stop=self._presence_stop)
        try:
            drive(presence.steps(_Sink(self)), port)
        except Stopped:
            return
        except Exception:  # presence is an optimisation: its failure must not stop claims
            log.exception("JobLease pool %r: presence stopped", self.selector)

    def _leave(self) -> None:
        self._presence_stop.set()
        thread, presence = self._presence_thread, self.presence
        if thread is None or presence is None:
            return
        thread.join(timeout=5)
        with contextlib.suppress(Exception):  # best effort: a record left behind lapses
            drive(presence.leave_steps(), SyncPort(self._client.store))

    def _workers(self, live: dict[str, datetime]) -> None:
        """The pool's workers as just listed: the view notes them, forgets who left."""
        with self._changed:
            for name in self._presence_names - live.keys():
                self._view.forget_worker(name)
            for name, until in live.items():
                self._view.note_worker(name, until)
            self._presence_names = set(live)
            self._bump()  # other workers change the turns: waiting threads choose again

    def _bump(self) -> None:
        self._changes += 1
        self._changed.notify_all()

    # -- choosing and waiting -------------------------------------------------------------

    def _choose_or_wait(self, who: str, deadline: float | None, spread: int,
                        until_empty: bool) -> Observed | None:
        """The cached lease to try now, after waiting for one; ``None``: give up (step 5)."""
        with self._changed:
            self._wait_synced(deadline)
            while True:
                if self._closed:
                    self._raise_if_dead()
                    return None  # closed under a waiting claim: a worker's loop ends
                seen = self._changes
                margin = self._client.margin()
                now = self._client.api.server_now()
                chosen = self._view.choose(who, now, margin, spread, exclude=self._claiming)
                if chosen is not None:
                    self._claiming.add(chosen.name)
                    return chosen
                if until_empty and self._view.unfinished() == 0:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                wait = self._seconds_to_wait(self._view.next_wake(now, margin), deadline)
                self._wait_for_change(seen, wait)

    def _wait_for_change(self, seen: int, timeout: float | None) -> None:
        """Wait (holding the condition) for a change after ``seen``, a close, or ``timeout``."""
        self._changed.wait_for(lambda: self._changes != seen or self._closed, timeout=timeout)

    def _seconds_to_wait(self, wake: datetime | None, deadline: float | None) -> float | None:
        """Until the next wake-up (server time, ``seconds_until_wake``) or the deadline."""
        waits = []
        if deadline is not None:
            waits.append(deadline - time.monotonic())
        if wake is not None:
            api = self._client.api
            waits.append(seconds_until_wake(api.clock, wake, api.monotonic()))
        return max(0.0, min(waits)) if waits else None

    def _wait_synced(self, deadline: float | None) -> None:
        """Block (holding the condition) until the first list arrived (or raise)."""
        while not self._synced and not self._closed:
            if self._trouble is not None and not isinstance(self._trouble, UnavailableError):
                raise self._trouble  # 403, 404 (no CRD), 400 (bad selector): not transient
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if isinstance(self._trouble, UnavailableError):
                    raise self._trouble
                raise UnavailableError(0, "NotSynced", f"JobLease pool {self.selector!r}: no "
                                       "list of its leases within the timeout")
            self._changed.wait(timeout=left)

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise PoolClosedError(f"JobLease pool {self.selector!r}: its watch stopped: "
                                  f"{self._dead!r}") from self._dead

    # -- claiming ---------------------------------------------------------------------------

    def _claim(self, chosen: Observed, who: str, deadline: float | None) -> L | None:
        """Claim ``chosen`` (steps 2-4, ``joblease.core.claiming``); ``None``: choose again."""
        lease: L | Exception = drive(claim_chosen(chosen, who, deadline, time.monotonic),
                                         self._port)
        if isinstance(lease, Exception):
            self._lost(chosen, lease)
            return None
        with self._changed:
            if lease.observed is not None:
                self._view.learn(lease.observed)  # 4
            self.claims += 1
        return lease

    def _lost(self, chosen: Observed, refusal: Exception) -> None:
        with self._changed:
            written = refusal.written if isinstance(refusal, LeaseFinishedError) else None
            if isinstance(written, Observed):  # this claim wrote Failed: the cache learns it
                self._view.learn(written)
                return
            self.conflicts += 1
            self._view.set_aside(chosen.name, chosen.resource_version)
