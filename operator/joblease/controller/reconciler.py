"""The operator's time-driven work over the leases it has seen: expire, TTL.

One loop for all leases (not a kopf timer per object, which would add a finalizer to each
and cost a task per object): every pass visits the in-memory view, performs the due
transitions as compare-and-swap writes, and returns how long to sleep until the next one
is due on the API server's clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from functools import partial

from joblease.controller import metrics
from joblease.controller.events import EventPoster
from joblease.domain.clock import ServerNow
from joblease.domain.errors import LeaseError, LeaseNotFoundError
from joblease.domain.lease import (
    Observed,
    Phase,
    Transition,
    add_time,
    decide_expire,
    ttl_expired,
)
from joblease.kube.api import ApiError, NotFoundError
from joblease.kube.leases import LeaseStore
from joblease.kube.transact import ContentionError, transact

log = logging.getLogger("joblease.operator")
IDLE_WAKEUP = 5.0
MAX_WRITES_PER_PASS = 256
URGENCY = {"expire": 0, "delete": 1}  # the order due writes are performed in
EVENT_REASONS = {"claimed": "Claimed", "completed": "Completed", "released": "Released",
                 "expired": "Expired", "failed": "Failed"}


def compact(obs: Observed) -> Observed:
    """What the view keeps of a version: everything but the status's conditions.

    Why: at 100,000 JobLeases the conditions (two dicts of five strings each, their
    messages the longest strings of the object) were the largest part of what the operator
    kept per lease, and no decision from the view reads them: the due times, the Events and
    the metrics need phase, holder, token and times. A write that must carry them (they
    keep ``lastTransitionTime`` across a write) decides from a fresh read instead
    (:func:`write_basis`).
    """
    if not obs.status.conditions:
        return obs
    return replace(obs, status=replace(obs.status, conditions=()))


def write_basis(obs: Observed) -> Observed | None:
    """The version a transition of ``obs`` may be decided from without a read, or ``None``.

    Only a JobLease without status (its initialization) is complete in the view; any other
    transition reads the object first (``transact`` with ``observed=None``): one GET, which
    the write floor does not count, so that conditions are never decided from a copy that
    lacks them.
    """
    return obs if not obs.has_status else None


class LeaseView:
    """The operator's in-memory view of JobLeases, fed by the watch (thread-safe).

    It keeps :func:`compact` versions only (no conditions).
    """

    def __init__(self) -> None:
        self._leases: dict[tuple[str, str], Observed] = {}
        self._lock = threading.Lock()

    def put(self, obs: Observed) -> Observed | None:
        """Store the newest version; return the previous one (or None)."""
        with self._lock:
            key = (obs.namespace, obs.name)
            previous = self._leases.get(key)
            if previous is not None and _rv(previous) > _rv(obs):
                return previous  # an older event arrived late; keep the newer version
            self._leases[key] = compact(obs)
            return previous

    def get(self, namespace: str, name: str) -> Observed | None:
        """The newest known version of one lease (None if never seen)."""
        with self._lock:
            return self._leases.get((namespace, name))

    def drop(self, namespace: str, name: str, uid: str) -> None:
        """Forget a deleted lease — only if the view still holds that very object (``uid``).

        Why the uid: a late DELETED event of an old incarnation must not remove the
        re-created object of the same name from the view (it would never expire).
        """
        with self._lock:
            current = self._leases.get((namespace, name))
            if current is not None and current.uid == uid:
                del self._leases[(namespace, name)]

    def snapshot(self) -> list[Observed]:
        """A copy of every known lease."""
        with self._lock:
            return list(self._leases.values())


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
        """Visit every lease once; return seconds until the next transition may be due.

        1. Decide from the in-memory view which leases have a transition due now.
        2. Perform at most ``max_writes_per_pass`` of them, most urgent first (expiries,
           then initializations, then TTL deletions), each a compare-and-swap through
           ``transact``, on the writer pool when there is more than one, and wait for them.
        3. If more were due, return at once (0.02 s): the next pass decides again.

        Why a bound: at 100,000 new JobLeases one pass held 100,000 initializations, and
        no expiry was looked at until all of them were written (minutes).
        """
        now = self.store.api.server_now()
        wakeup = IDLE_WAKEUP
        counts = dict.fromkeys(Phase, 0)
        due: list[list[Callable[[], None]]] = [[] for _ in URGENCY]
        for obs in self.view.snapshot():
            counts[obs.status.phase] += 1
            try:
                wakeup = min(wakeup, self._visit(obs, now, lambda kind, action: due[
                    URGENCY[kind]].append(action)))
            except Exception as err:
                self.object_failed(obs, "decide", err)
        ordered = [action for actions in due for action in actions]
        self._perform(ordered[:self.max_writes_per_pass])
        for phase, count in counts.items():
            metrics.LEASES.labels(phase.value).set(count)
        if len(ordered) > self.max_writes_per_pass:
            return 0.02  # more is due: the next pass starts at once, expiries first again
        return max(0.02, wakeup)

    def close(self) -> None:
        """Stop the writer pool (after the writes in flight)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _perform(self, due: list[Callable[[], None]]) -> None:
        if self._pool is None or len(due) < 2:
            for action in due:
                action()
            return
        for future in [self._pool.submit(action) for action in due]:
            future.result()

    def object_failed(self, obs: Observed, stage: str, err: BaseException) -> None:
        """Isolate a failure to its object: log it, count it, tell the object's owner.

        The pass goes on with every other object, and the next pass tries this one again.
        """
        metrics.OBJECT_ERRORS.labels(stage).inc()
        log.error("JobLease %s/%s: could not %s it (%s: %s); other leases are unaffected",
                  obs.namespace, obs.name, stage, type(err).__name__, err,
                  exc_info=not isinstance(err, (LeaseError, ApiError)))
        if self.events is not None:
            self.events.post(obs, "Warning", "ProcessingFailed",
                             f"the operator could not {stage} this JobLease: "
                             f"{type(err).__name__}: {err}")

    def _visit(self, obs: Observed, now: ServerNow,
               schedule: Callable[[str, Callable[[], None]], None]) -> float:
        st = obs.status
        if st.phase == Phase.HELD and st.lease_until is not None:
            due = (add_time(st.lease_until, self.margin) - now.earliest).total_seconds()
            if due <= 0:
                schedule("expire", partial(self._write, obs,
                                           lambda o, n: decide_expire(o, n, self.margin)))
                return IDLE_WAKEUP
            return due
        if st.phase.finished and obs.spec.ttl_seconds_after_finished is not None:
            if ttl_expired(obs, now):
                schedule("delete", partial(self._delete, obs))
                return IDLE_WAKEUP
            if st.finish_time is not None:
                ttl = timedelta(seconds=obs.spec.ttl_seconds_after_finished)
                return (add_time(st.finish_time, ttl) - now.earliest).total_seconds()
        return IDLE_WAKEUP

    def _write(self, obs: Observed, decide: object) -> None:
        try:
            outcome = transact(self.store, obs.namespace, obs.name, decide,  # type: ignore[arg-type]
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


def _rv(obs: Observed) -> int:
    try:
        return int(obs.resource_version)
    except ValueError:
        return 0
