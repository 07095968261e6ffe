"""The steps a client operation yields, and the two drivers that perform them.

An operation (``joblease.core.ops``, ``joblease.core.feed``, ``joblease.core.claiming``)
is a generator. It yields a step and receives the step's answer — or, thrown back into
it, the exception the request raised — so its retry and refusal logic sees failures
exactly as it would see them from a direct call. The steps:

========================  ===================================================  =========
step                      what the driver does                                 answer
========================  ===================================================  =========
``Read``                  read one JobLease (``transact``'s step 1)            Observed
``ServerTime``            the API server's time now, as an interval            ServerNow
``Write``                 conditional status write (``transact``'s step 4)     Observed
``Call``                  send one ``LeaseCall`` (a list page, a create)       its value
``Watch``                 stream one watch into ``on_event`` until it ends     ``None``
``Sleep``                 wait (a stopping feed ends during the wait)          ``None``
``Calibrate``             calibrate the clock estimate once, if still due      ``None``
``Whoami``                the username the API server authenticates us as      str
``ClaimBy``               a claim through the client's public ``claim()``      the lease
========================  ===================================================  =========

:func:`drive` performs them with a thread-safe ``LeaseStore`` (``joblease.sdk``),
``joblease.core.asteps.adrive`` with an ``AsyncLeaseStore`` (``joblease.aio``; a module
of its own, so that the blocking path — the CLI's one-shot verbs — never imports asyncio).
A driver decides nothing: the two clients differ only in how a request travels and how a
wait is done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from joblease.core.transaction import (
    MAX_CONFLICTS,
    Decide,
    Outcome,
    Read,
    ServerTime,
    Write,
    run_steps,
    transaction,
)
from joblease.domain.errors import JobleaseError
from joblease.domain.lease import Observed
from joblease.kube.api import DEFAULT_TIMEOUT
from joblease.kube.leases import LeaseCall, LeaseStore
from joblease.kube.transport import EventStream

T = TypeVar("T")
EventHandler = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Call:
    """Send one :class:`~joblease.kube.leases.LeaseCall`; the answer is its parsed value."""

    call: LeaseCall[Any]
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class Watch:
    """Stream a watch of ``path`` (``query`` without ``watch=``) until the server ends it.

    Every event goes to ``on_event(type, object)`` as it arrives; the step's answer is
    ``None`` when the stream ends normally. An ``ERROR`` event is thrown back as the
    ``ApiError`` it names (410: ``GoneError``).
    """

    path: str
    query: dict[str, str]
    on_event: EventHandler = field(compare=False)
    seconds: int


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds`` (a feed being stopped ends here instead)."""

    seconds: float


@dataclass(frozen=True)
class Calibrate:
    """Calibrate the client's server-clock estimate, once, if it is still due."""


@dataclass(frozen=True)
class Whoami:
    """The username the API server authenticates this client as."""


@dataclass(frozen=True)
class ClaimBy:
    """Claim through the client's public ``claim()`` (a work pool's one conditional write).

    A pool builds its leases the way any caller does, so a claim made by a pool is the
    same operation — and the same recorded event in the fault suite — as a direct one.
    """

    name: str
    holder: str
    claim_id: str
    observed: Observed | None
    max_conflicts: int


Step = Read | ServerTime | Write | Call | Watch | Sleep | Calibrate | Whoami | ClaimBy
Steps = Generator[Step, Any, T]

WATCH_SLACK = 30.0  # a watch's client-side bound beyond the server's timeoutSeconds
WATCH_IDLE_SLACK = 15.0  # silence beyond the watch's own length means a dead connection


class Stopped(JobleaseError):  # noqa: N818 - a signal, not an error
    """Thrown into an operation whose driver was asked to stop (a pool being closed)."""


class SyncPort:
    """Performs steps with a thread-safe ``LeaseStore`` (the sync client's I/O).

    Args:
        store: The store, and through it the ``KubeApi``.
        calibrate: Performs ``Calibrate`` (the client's lazy, locked calibration).
        stop: Set to end a long-running operation (a feed): a ``Sleep`` returns early and
            ``Stopped`` is thrown into the operation; :meth:`interrupt` closes the watch.
        claim: Performs ``ClaimBy``: the client's public ``claim()``.
        sleep: Performs ``Sleep`` without a ``stop`` (default ``time.sleep``, looked up at
            each call: the injection point for a test's clock).
    """

    def __init__(self, store: LeaseStore, calibrate: Callable[[], None] | None = None,
                 stop: threading.Event | None = None,
                 claim: Callable[..., Any] | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.store = store
        self.api = store.api
        self._calibrate = calibrate or (lambda: None)
        self._claim = claim
        self._sleeper = sleep
        self.stop = stop
        self._stream: EventStream | None = None
        self._interrupted = False  # an interrupt that came while no watch was open
        self._lock = threading.Lock()

    def perform(self, step: Step) -> Any:
        """Perform one step and return its answer (its exception propagates)."""
        if isinstance(step, Read):
            return self.store.get(step.namespace, step.name, step.timeout)
        if isinstance(step, Write):
            return self.store.write_status(step.observed, step.status, step.timeout)
        if isinstance(step, ServerTime):
            return self.api.server_now()
        if isinstance(step, Call):
            return self.store.call(step.call, step.timeout)
        if isinstance(step, Watch):
            return self._watch(step)
        if isinstance(step, Sleep):
            return self._sleep(step.seconds)
        if isinstance(step, Calibrate):
            return self._calibrate()
        if isinstance(step, ClaimBy):
            return claim_by(self._claim, step)
        if isinstance(step, Whoami):
            return self.api.whoami()
        raise unknown_step(step)

    def interrupt(self) -> None:
        """Close the open watch now, from any thread; the operation decides what follows.

        Between two watches (a list, a pause, a watch being opened) the interrupt is kept
        and ends the next watch as soon as it opens, so it is never lost.
        """
        with self._lock:
            stream = self._stream
            self._interrupted = stream is None
        if stream is not None:
            stream.close()

    def _sleep(self, seconds: float) -> None:
        if self.stop is None:
            (self._sleeper or time.sleep)(max(0.0, seconds))
        elif self.stop.wait(max(0.0, seconds)):
            raise Stopped()

    def _watch(self, step: Watch) -> None:
        stream = self.api.watch(step.path, step.query, timeout=step.seconds + WATCH_SLACK)
        with self._lock:
            self._stream = stream
            interrupted, self._interrupted = self._interrupted, False
        try:
            if interrupted or (self.stop is not None and self.stop.is_set()):
                stream.close()
            for event in stream:
                step.on_event(str(event.get("type")), event["object"])
        finally:
            with self._lock:
                self._stream = None
        if self.stop is not None and self.stop.is_set():
            raise Stopped()


def claim_by(claim: Callable[..., Any] | None, step: ClaimBy) -> Any:
    """Perform ``ClaimBy`` with a client's ``claim()`` (both ports; awaited by the async one)."""
    if claim is None:
        raise TypeError("this port was built without a client's claim() to perform ClaimBy")
    return claim(step.name, step.holder, observed=step.observed, claim_id=step.claim_id,
                 max_conflicts=step.max_conflicts)


def unknown_step(step: object) -> TypeError:
    """The error for a step no driver knows: a bug, never a request to guess at.

    Why raise: both drivers used to treat any step they did not recognise as ``Whoami``,
    so a new step type without a performer would have sent the wrong request (issue 31).
    """
    return TypeError(f"no driver performs {type(step).__name__} steps: {step!r}")


def drive(steps: Steps[T], port: SyncPort) -> T:
    """Run an operation to its end, performing each step with ``port`` (blocking)."""
    return run_steps(steps, port.perform)


def transact(store: LeaseStore, namespace: str, name: str, decide: Decide, *,
             observed: Observed | None = None, max_conflicts: int = MAX_CONFLICTS,
             deadline: float | None = None) -> Outcome:
    """Perform one ``joblease.core.transaction.transaction`` with a thread-safe store.

    The operator's entry point (its reconciler and pod delegation write through it); the
    clients drive the same loop inside their operations.

    Raises:
        LeaseError, ApiError, ContentionError: as ``transaction``.
    """
    steps = transaction(namespace, name, decide, store.api.monotonic, observed=observed,
                        max_conflicts=max_conflicts, deadline=deadline)
    return drive(steps, SyncPort(store))
