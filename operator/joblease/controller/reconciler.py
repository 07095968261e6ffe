"""The operator's time-driven work over the leases it has seen: expire, TTL.

One loop for all leases (not a kopf timer per object, which would add a finalizer to each
and cost a task per object). Issue 28: a pass works only on what is due. The view keeps
two heaps of due times, client-go's delaying queue as the model:

* **expiry**, keyed by ``leaseUntil`` of every Held lease (due at ``leaseUntil + margin``
  on the API server's clock, the earliest it may be);
* **TTL**, keyed by ``finishTime + ttlSecondsAfterFinished`` of every finished lease that
  has one.

A version only pushes an entry when its due time is *earlier* than its previous
version's (or it had none): a renewal, which moves ``leaseUntil`` later, pushes nothing.
The heaps learn lazily: a pass pops the entries whose time has come, re-checks each
against the lease's current record, and re-pushes it at the current due time if it
moved, drops it if the lease is gone or no longer due at all, and acts otherwise. So
every entry is at or before its lease's real due time (never late), a pass costs
O(due · log N), and an idle pass at 100,000 leases costs nothing but a look at two heap
tops. The phase gauges (``joblease_leases``) are kept as versions come and go.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta

from joblease.controller import metrics
from joblease.controller.events import EventPoster
from joblease.core.steps import transact
from joblease.core.transaction import ContentionError
from joblease.domain.clock import ServerNow
from joblease.domain.errors import LeaseError, LeaseNotFoundError
from joblease.domain.lease import (
    Observed,
    Phase,
    Transition,
    decide_expire,
    epoch_of,
    ttl_due,
)
from joblease.domain.time import add_time, expiry_at, expiry_due
from joblease.kube.api import ApiError, NotFoundError
from joblease.kube.leases import LeaseStore

log = logging.getLogger("joblease.operator")
MAX_WRITES_PER_PASS = 256
MAX_IDLE = 1.0  # the longest a pass waits: the heartbeat and the last-pass gauge's cadence
SOON = 0.02  # the wait when more is due than one pass may write
RETRY = timedelta(seconds=1)  # a due write that failed is tried again this much later
EVENT_REASONS = {"claimed": "Claimed", "completed": "Completed", "released": "Released",
                 "expired": "Expired", "failed": "Failed"}

Key = tuple[str, str]
Entry = tuple[datetime, Key]


def compact(obs: Observed) -> Observed:
    """What the view keeps of a version: everything but the status's conditions.

    Why: at 100,000 JobLeases the conditions (two dicts of five strings each, their
    messages the longest strings of the object) were the largest part of what the operator
    kept per lease, and no decision from the view reads them: the due times, the Events and
    the metrics need phase, holder, token and times. A write that must carry them (they
    keep ``lastTransitionTime`` across a write) decides from a fresh read instead
    (:func:`write_basis`). The operator's feed shrinks further as it decodes
    (``joblease.core.feed.compact_lease``); this is the view's own guarantee.
    """
    if not obs.status.conditions:
        return obs
    return replace(obs, status=replace(obs.status, conditions=()))


def write_basis(obs: Observed) -> Observed | None:
    """The version a transition of ``obs`` may be decided from without a read, or ``None``.

    Only a JobLease read without any status (through a CRD without the status default) is
    complete in the view; any other transition reads the object first (``transact`` with
    ``observed=None``): one GET, which the write floor does not count, so that conditions
    are never decided from a copy that lacks them.
    """
    return obs if not obs.has_status else None


def expiry_base(obs: Observed) -> datetime | None:
    """When a Held lease ends (its expiry is due ``margin`` later); ``None`` if not Held."""
    st = obs.status
    return st.lease_until if st.phase == Phase.HELD and st.lease_until is not None else None


class LeaseView:
    """The operator's in-memory view of JobLeases, fed by its watch (thread-safe).

    It keeps :func:`compact` versions, the due-time heaps of the module doc and the count
    of leases per phase. ``on_sooner`` is called (from the thread that stored the version)
    when a version makes something due earlier than anything scheduled before, so that the
    reconcile loop can wake up instead of sleeping until its planned time.

    After a (re-)list, :meth:`forget_unlisted` drops what the list no longer showed.
    """

    def __init__(self, on_sooner: Callable[[], None] = lambda: None) -> None:
        self._leases: dict[Key, Observed] = {}
        self._expiries: list[Entry] = []
        self._ttls: list[Entry] = []
        self._phases: Counter[Phase] = Counter()
        # the Held ones again: the overdue gauges read them at every scrape, and a scan of
        # every lease per scrape cost the operator about a quarter of its CPU per creation
        # at 100,000 (the bench scrapes once a second while it waits; issue 28)
        self._held: dict[Key, Observed] = {}
        self._lock = threading.Lock()
        self.on_sooner = on_sooner

    def put(self, obs: Observed) -> Observed | None:
        """Store the newest version; return the previous one (or None)."""
        with self._lock:
            key = (obs.namespace, obs.name)
            previous = self._leases.get(key)
            if previous is not None and epoch_of(previous) > epoch_of(obs):
                return previous  # an older event arrived late; keep the newer version
            kept = self._leases[key] = compact(obs)
            sooner = (self._schedule(self._expiries, key, expiry_base(kept),
                                     expiry_base(previous) if previous else None)
                      | self._schedule(self._ttls, key, ttl_due(kept),
                                       ttl_due(previous) if previous else None))
            self._count(previous, kept)
        if sooner:
            self.on_sooner()
        return previous

    def get(self, namespace: str, name: str) -> Observed | None:
        """The newest known version of one lease (None if never seen)."""
        with self._lock:
            return self._leases.get((namespace, name))

    def drop(self, namespace: str, name: str, uid: str) -> None:
        """Forget a deleted lease — only if the view still holds that very object (``uid``).

        Why the uid: a late DELETED event of an old incarnation must not remove the
        re-created object of the same name from the view (it would never expire). Its
        heap entries stay and are discarded when they come up.
        """
        with self._lock:
            current = self._leases.get((namespace, name))
            if current is not None and current.uid == uid:
                del self._leases[(namespace, name)]
                self._count(current, None)

    def snapshot(self) -> list[Observed]:
        """A copy of every known lease (O(N): metrics at scrape time and tests only)."""
        with self._lock:
            return list(self._leases.values())

    def held(self) -> list[Observed]:
        """A copy of the Held leases (O(Held): the overdue gauges at scrape time)."""
        with self._lock:
            return list(self._held.values())

    def phases(self) -> dict[Phase, int]:
        """How many known leases are in each phase (kept as versions come and go)."""
        with self._lock:
            return {phase: self._phases[phase] for phase in Phase}

    def forget_unlisted(self, listed: set[Key], in_scope: Callable[[str], bool]
                        ) -> list[Observed]:
        """After a complete list: forget and return the leases in scope it did not show.

        ``in_scope`` tells which namespaces the list covered (one feed lists one namespace,
        or all). Why: a lease deleted while no watch was open (a 410, a watch restarted
        after an outage) sends no DELETED event; only its absence from the new list tells.
        """
        with self._lock:
            gone = [obs for key, obs in self._leases.items()
                    if key not in listed and in_scope(key[0])]
            for obs in gone:
                del self._leases[(obs.namespace, obs.name)]
                self._count(obs, None)
            return gone

    def take_due(self, now: ServerNow, margin: timedelta, limit: int
                 ) -> tuple[list[Observed], list[Observed], bool]:
        """Pop what is due at ``now`` (expiries first, then TTLs), at most ``limit`` in all.

        Returns ``(expiries, deletions, more)``: the current versions of the leases whose
        transition is due, and whether more was due than ``limit``. Entries that turn out
        not to be due (a renewal moved the end, the lease finished or is gone) are
        re-pushed at their current due time or discarded. Each lease taken is also pushed
        again :data:`RETRY` later: if its write fails, or decides nothing because the view
        was behind (the watch event of a renewal still on its way), it is looked at again
        then, and an entry of a lease whose write succeeded is discarded when it comes up.
        """
        with self._lock:
            expiries = self._pop_due(self._expiries, expiry_base, now, margin, limit)
            deletions = self._pop_due(self._ttls, ttl_due, now, timedelta(0),
                                      limit - len(expiries))
            more = (self._first_due(self._expiries, now, margin)
                    or self._first_due(self._ttls, now, timedelta(0)))
        return expiries, deletions, more

    def seconds_until_due(self, now: ServerNow, margin: timedelta) -> float | None:
        """Seconds until the earliest scheduled entry (``None``: nothing scheduled).

        An entry may be earlier than its lease's real due time (lazy heaps), never later.
        """
        with self._lock:
            tops = [expiry_at(self._expiries[0][0], margin)] if self._expiries else []
            tops += [self._ttls[0][0]] if self._ttls else []
        if not tops:
            return None
        return (min(tops) - now.earliest).total_seconds()

    def _schedule(self, heap: list[Entry], key: Key, due: datetime | None,
                  before: datetime | None) -> bool:
        """Push ``key`` at ``due`` unless an entry at or before it exists; True if now first."""
        if due is None or (before is not None and before <= due):
            return False
        heapq.heappush(heap, (due, key))
        return heap[0][1] == key and heap[0][0] == due

    def _pop_due(self, heap: list[Entry], due_of: Callable[[Observed], datetime | None],
                 now: ServerNow, margin: timedelta, limit: int) -> list[Observed]:
        taken: list[Observed] = []
        taken_keys: set[Key] = set()
        while heap and len(taken) < limit and expiry_due(heap[0][0], margin, now):
            _, key = heapq.heappop(heap)
            obs = self._leases.get(key)
            due = due_of(obs) if obs is not None else None
            if due is None or key in taken_keys:
                continue  # gone, no longer due at all, or a duplicate entry
            if not expiry_due(due, margin, now):
                heapq.heappush(heap, (due, key))  # moved later (a renewal): look again then
                continue
            taken.append(obs)  # type: ignore[arg-type]  # due is None when obs is None
            taken_keys.add(key)
        again = add_time(now.earliest, RETRY - margin)
        for key in taken_keys:
            heapq.heappush(heap, (again, key))
        return taken

    @staticmethod
    def _first_due(heap: list[Entry], now: ServerNow, margin: timedelta) -> bool:
        return bool(heap) and expiry_due(heap[0][0], margin, now)

    def _count(self, before: Observed | None, after: Observed | None) -> None:
        if before is not None:
            self._phases[before.status.phase] -= 1
            if before.status.phase is Phase.HELD:
                self._held.pop((before.namespace, before.name), None)
        if after is not None:
            self._phases[after.status.phase] += 1
            if after.status.phase is Phase.HELD:
                self._held[(after.namespace, after.name)] = after


class Reconciler:
    """Performs due transitions over a ``LeaseView``."""

    def __init__(self, store: LeaseStore, view: LeaseView, margin: timedelta,
                 events: EventPoster | None = None, writers: int = 1) -> None:
        self.store, self.view, self.margin = store, view, margin
        self.events = events  # where Events go; None: post none
        self.max_writes_per_pass = MAX_WRITES_PER_PASS
        # Due transitions of one pass are independent compare-and-swap writes on different
        # objects, so a burst of expiries may be written by several threads at once.
        self._pool = (ThreadPoolExecutor(writers, thread_name_prefix="joblease-write")
                      if writers > 1 else None)

    def pass_once(self) -> float:
        """Perform what is due now; return seconds until the next pass should look.

        The pass's CPU in this thread goes to ``joblease_reconcile_pass_cpu_seconds``:
        issue 28 promises that an idle pass at 100,000 leases costs at most 1 ms, and the
        operator's whole-process CPU cannot show that (the feed and kopf share it).
        """
        started = time.thread_time()
        try:
            return self._pass()
        finally:
            metrics.PASS_CPU.observe(time.thread_time() - started)

    def _pass(self) -> float:
        """The steps of one pass.

        1. Take from the view's heaps what is due now on the server's clock (the earliest
           it may be): at most ``max_writes_per_pass``, expiries before TTL deletions.
        2. Perform them, each a compare-and-swap through ``transact`` (expiries) or a
           conditional delete, on the writer pool when there is more than one, and wait.
        3. If more was due, return at once (:data:`SOON`): the next pass takes again,
           expiries first. Otherwise return the time until the earliest scheduled entry,
           at most :data:`MAX_IDLE` (the runtime also wakes the loop when a new version
           makes something due sooner: ``LeaseView.on_sooner``).

        Why a bound: at 100,000 new JobLeases one pass held 100,000 initializations, and
        no expiry was looked at until all of them were written (minutes; issue 24).
        """
        now = self.store.api.server_now()
        view = self.view
        expiries, deletions, more = view.take_due(now, self.margin, self.max_writes_per_pass)
        self._perform([*(lambda o=obs: self._expire(o) for obs in expiries),
                       *(lambda o=obs: self._delete(o) for obs in deletions)])
        for phase, count in view.phases().items():
            metrics.LEASES.labels(phase.value).set(count)
        if more:
            return SOON
        wait = view.seconds_until_due(self.store.api.server_now(), self.margin)
        return MAX_IDLE if wait is None else max(SOON, min(wait, MAX_IDLE))

    def close(self) -> None:
        """Stop the writer pool (after the writes in flight)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _perform(self, due: list[Callable[[], None]]) -> None:
        if self._pool is None or len(due) < 2:
            for action in due:
                self._isolated(action)
            return
        for future in [self._pool.submit(self._isolated, action) for action in due]:
            future.result()

    def _isolated(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception:  # _expire and _delete isolate their own; this is the last guard
            metrics.OBJECT_ERRORS.labels("decide").inc()
            log.exception("a due transition failed; other leases are unaffected")

    def object_failed(self, obs: Observed, stage: str, err: BaseException) -> None:
        """Isolate a failure to its object: log it, count it, tell the object's owner.

        The pass goes on with every other object, and the lease is looked at again
        :data:`RETRY` later.
        """
        metrics.OBJECT_ERRORS.labels(stage).inc()
        log.error("JobLease %s/%s: could not %s it (%s: %s); other leases are unaffected",
                  obs.namespace, obs.name, stage, type(err).__name__, err,
                  exc_info=not isinstance(err, (LeaseError, ApiError)))
        if self.events is not None:
            self.events.post(obs, "Warning", "ProcessingFailed",
                             f"the operator could not {stage} this JobLease: "
                             f"{type(err).__name__}: {err}")

    def _expire(self, obs: Observed) -> None:
        margin = self.margin
        try:
            outcome = transact(self.store, obs.namespace, obs.name,
                               lambda o, n: decide_expire(o, n, margin),
                               observed=write_basis(obs))
        except LeaseNotFoundError:
            self.view.drop(obs.namespace, obs.name, obs.uid)  # deleted during a watch gap
            return
        except (LeaseError, ContentionError, ApiError) as err:
            log.warning("JobLease %s/%s: %s", obs.namespace, obs.name, err)
            return
        except Exception as err:
            self.object_failed(obs, "write", err)
            return
        if outcome.transition is None:
            return
        self.view.put(outcome.observed)
        metrics.OPERATOR_WRITES.labels(outcome.transition.kind).inc()
        if outcome.transition.kind == "expired" and obs.status.lease_until is not None:
            lag = self.store.api.server_now().midpoint - obs.status.lease_until
            metrics.EXPIRY_LAG.observe(max(0.0, lag.total_seconds()))
        log.info("JobLease %s/%s: %s", obs.namespace, obs.name, outcome.transition.message)
        self.announce(outcome.observed, outcome.transition)

    def _delete(self, obs: Observed) -> None:
        try:
            self.store.delete_if_unchanged(obs)
        except NotFoundError:
            pass
        except ApiError as err:  # 409: changed meanwhile; the next pass decides again
            log.info("JobLease %s/%s: TTL delete skipped: %s", obs.namespace, obs.name, err)
            return
        except Exception as err:
            self.object_failed(obs, "delete", err)
            return
        metrics.OPERATOR_WRITES.labels("deleted").inc()
        self.view.drop(obs.namespace, obs.name, obs.uid)
        log.info("JobLease %s/%s: deleted %ss after it finished", obs.namespace, obs.name,
                 obs.spec.ttl_seconds_after_finished)

    def announce(self, obs: Observed, transition: Transition) -> None:
        """Post a Kubernetes Event for a transition (best effort: Events are not state)."""
        reason = EVENT_REASONS.get(transition.kind)
        if self.events is None or reason is None:
            return
        type_ = "Warning" if transition.kind in ("expired", "failed") else "Normal"
        self.events.post(obs, type_, reason, transition.message)


def observed_transition(before: Observed | None, after: Observed) -> Transition | None:
    """Name the transition between two versions seen on the watch (for Events and metrics)."""
    old, new = (before.status if before else None), after.status
    if old is None or not after.has_status:
        return None
    if new.generation > old.generation and new.phase == Phase.HELD:
        return Transition("claimed", new, f"claimed by {new.holder!r} at generation "
                                          f"{new.generation}")
    if new.phase == old.phase and new.generation == old.generation:
        return Transition("renewed", new, "renewed") if new.renew_time != old.renew_time else None
    if new.phase == Phase.COMPLETED:
        return Transition("completed", new, f"completed by {new.holder!r} at generation "
                                            f"{new.generation}")
    if new.phase == Phase.AVAILABLE and old.phase == Phase.HELD:
        return Transition("released", new, f"released by {old.holder!r} at generation "
                                           f"{old.generation}")
    return None
