"""Kubernetes Events posted from one background thread.

Why: the reconcile loop performs transitions one after another; waiting for an Event's
POST after every expiry doubled the time per transition, so in a burst of expiries the
last leases were marked late (the 10,000-lease benchmark's burst lag). Events are not
state — the JobLease's status is — so they may trail the transition, and when the queue
is full they are dropped and counted (``joblease_operator_events_dropped_total``)
rather than slowing expiry down.

Why a rate as well (issue 24): every Event is a write to the same API server the
transitions are written to. At 100,000 JobLeases the operator's initialization posted one
``Created`` Event per lease, doubling its writes, and a burst of expiries as many
``Expired`` ones. A token bucket (``rate`` Events per second, ``burst`` at once) bounds the
Events' share of the write rate; what exceeds it is dropped at once and counted, like a
full queue, so the Events that are posted stay close to their transitions. A cluster at
rest (a few transitions a second) loses none. Issue 28 removed the ``Created`` Event and
its low-rate bucket: a new JobLease is born initialised by the CRD's default status, and
an Event per creation was still a write per creation.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from joblease.controller import metrics
from joblease.domain.lease import Observed
from joblease.kube.api import ApiError
from joblease.kube.leases import LeaseStore

log = logging.getLogger("joblease.operator")
_STOP = None
EVENTS_PER_SECOND = 100.0
EVENT_BURST = 1_000
QUEUE_CAPACITY = 1_000


class Subject(NamedTuple):
    """What an Event needs of its JobLease: a queued Event keeps only this, not the version.

    Why: with a backlog of 10,000 Events (a burst at 100,000 JobLeases) the queue held
    10,000 whole versions alive besides the view's.
    """

    namespace: str
    name: str
    uid: str


class _Bucket:
    """A token bucket: ``rate`` tokens per second, at most ``burst`` saved."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.filled = rate, burst, burst, now

    def take(self, now: float) -> bool:
        """Take one token if there is one (refilled for the time since the last call)."""
        self.tokens = min(self.burst, self.tokens + (now - self.filled) * self.rate)
        self.filled = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class EventPoster:
    """A bounded queue of Events and the one thread that posts them in order."""

    def __init__(self, store: LeaseStore, capacity: int = QUEUE_CAPACITY,
                 rate: float = EVENTS_PER_SECOND, burst: int = EVENT_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1 or capacity < 1:
            raise ValueError(f"EventPoster needs rate > 0, burst >= 1 and capacity >= 1, "
                             f"not rate={rate}, burst={burst}, capacity={capacity}")
        self.store = store
        self._clock = clock
        self._tokens = _Bucket(rate, float(burst), clock())
        self._bucket = threading.Lock()
        self._queue: queue.Queue[tuple[Subject, str, str, str] | None] = queue.Queue(capacity)
        self._thread = threading.Thread(target=self._run, name="joblease-events", daemon=True)
        self._thread.start()

    def post(self, obs: Observed, type_: str, reason: str, message: str) -> None:
        """Queue one Event (never blocks; over the rate or a full queue: dropped, counted)."""
        if not self._take_token():
            metrics.EVENTS_DROPPED.inc()
            log.debug("Event rate exceeded: dropped %s for %s/%s", reason, obs.namespace,
                      obs.name)
            return
        try:
            self._queue.put_nowait((Subject(obs.namespace, obs.name, obs.uid), type_, reason,
                                    message))
        except queue.Full:
            metrics.EVENTS_DROPPED.inc()
            log.warning("Event queue full: dropped %s for %s/%s", reason, obs.namespace, obs.name)

    def _take_token(self) -> bool:
        with self._bucket:
            return self._tokens.take(self._clock())

    def close(self, timeout: float = 5.0) -> None:
        """Post what is queued (bounded by ``timeout``), then stop the thread."""
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            obs, type_, reason, message = item
            try:
                self.store.post_event(obs, type_, reason, message)
            except ApiError as err:
                log.warning("could not post Event for %s/%s: %s", obs.namespace, obs.name, err)
            except Exception:  # keep posting later Events whatever one of them hit
                log.exception("posting an Event for %s/%s failed", obs.namespace, obs.name)
