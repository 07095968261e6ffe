"""Hold a lease while work runs: background renewal, and a stop signal the moment it is lost.

A worker that cannot renew must stop producing effects under the old lease. :class:`Holding`
renews at a fraction of the lease duration and, as soon as a renewal is refused or the local
deadline passes without a successful renewal, tells the work to stop: ``holding.loss``
becomes the ``LeaseLostError`` that says why, ``holding.lost`` (a ``threading.Event`` to
wait on) is set in the same step, and ``holding.check()`` raises the loss at the work's next
checkpoint.

It cannot stop an effect already in flight (a request on the wire): that is what the
target-side fencing check is for. On a normal exit the lease is released unless the body
completed it; on an exception, or after ``holding.fail()``, it is released as failed (an
attempt is counted). What the loop decides is ``joblease.domain.holder.HoldingEngine``'s;
this module only waits (two threads, started when the first renewal is due) and sends.
Asyncio code holds with ``joblease.aio`` (``client.hold(lease)``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

from joblease.domain.errors import LeaseError, LeaseLostError, RenewalStoppedError
from joblease.domain.holder import (
    MAX_RETRY_DELAY,
    RENEW_FRACTION,
    HeldLease,
    HoldingFront,
    retry_delay,
)
from joblease.kube.api import ApiError

# The renewal cadence and backoff are the holder's protocol, shared with joblease.aio.
__all__ = ["MAX_RETRY_DELAY", "RENEW_FRACTION", "Holding", "RenewalStoppedError",
           "retry_delay"]
log = logging.getLogger("joblease.sdk")


class Holding(HoldingFront[HeldLease]):
    """Keeps ``lease`` renewed from a background thread while the ``with`` body runs.

    Two threads drive the engine's two guards (issue 14, items 3 and 4), started when the
    first renewal is due (:class:`GuardStarter` says why that is the same guard):

    1. the *renewer* renews every ``renew_fraction`` of the lease; a refusal declares the
       loss; any other failure — an unreachable server, a 409 storm, an exception of any
       type — is retried with a short backoff, and no request waits past the deadline;
    2. the *watchdog* sleeps until the local deadline (minus ``stop_before``) and declares
       the loss there unless a renewal moved the deadline first. It never sends a request,
       so a hung one cannot delay it.

    Either thread's only exit other than a requested stop is declaring the lease lost.

    Whether the hold is lost, and why, is one value: :attr:`loss` (the ``LeaseLostError``,
    or ``None``). :attr:`lost` is a ``threading.Event`` set in the same step, for code that
    wants to wait rather than poll; the lease's own ``Lease.loss`` gets the same error. A
    loss the lease met outside the holding (a direct ``lease.renew()``) is adopted at the
    next :meth:`check`.

    Attributes:
        lease: The held lease.
        lost: Set once the lease is declared lost (``loss`` is then not ``None``).
        completed: Whether :meth:`complete` succeeded.
        renew_failures: Renewals that failed transiently and were retried.

    Args:
        lease: The held lease.
        renew_fraction: Renew after this fraction of the lease's remaining time.
        stop_before: Declare a lease that could not be renewed lost this many seconds
            before its deadline (``joblease run`` uses its grace period, so the command is
            killed *by* the deadline, not a grace period after it).
    """

    def __init__(self, lease: HeldLease, renew_fraction: float = RENEW_FRACTION, *,
                 stop_before: float = 0.0) -> None:
        self._engine = self._engine_for(lease, renew_fraction, stop_before,
                                        guard=threading.Lock(), log=log)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Condition()  # the watchdog sleeps on it; notified on stop/loss
        self._write_lock = threading.Lock()  # a renewal never races the completion
        self._start_lock = threading.Lock()  # the starter never races the exit
        self._guards_started = False
        self._exited = False
        self._entered = 0.0  # local monotonic time of __enter__: the renewer's first wait
        self._guard_threads: list[threading.Thread] | None = None  # made on first use

    @property
    def _threads(self) -> list[threading.Thread]:
        """The renewer and the watchdog, made when first asked for (by the starter, mostly).

        Most of a pool's jobs end before their first renewal is due, so their guards never
        start (``GuardStarter``); making the two ``Thread`` objects anyway cost a worker
        about 0.1 ms a job (docs/benchmarks.md).
        """
        if self._guard_threads is None:
            name = self.lease.name
            self._guard_threads = [
                threading.Thread(target=self._guarded, args=("renewal", self._renew_loop),
                                 name=f"renew-{name}", daemon=True),
                threading.Thread(target=self._guarded,
                                 args=("deadline watchdog", self._watchdog),
                                 name=f"deadline-{name}", daemon=True),
            ]
        return self._guard_threads

    def complete(self, result: str = "") -> None:
        """Complete the job under this lease (refused if it was lost); renewals then stop.

        Never races a renewal: both take the same lock.

        Raises:
            LeaseLostError: lost before or during the completion (see ``Lease.complete``).
            UnavailableError: no answer; the lease is still held until its deadline, and
                retrying is safe.
        """
        self.check()
        with self._write_lock:
            self.check()
            try:
                self.lease.complete(result)
            except LeaseLostError as err:
                self._engine.completion_done(err)
                raise
            self._engine.completion_done(None)

    def __enter__(self) -> Holding:
        self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop_threads()
        self._finish(raised=exc is not None)

    def _start(self) -> None:
        self._entered = time.monotonic()
        pause = self._engine.renew_pause()
        if pause is None or pause <= 0:
            self._start_guards()
        else:
            STARTER.add(self._entered + pause, self)

    def _start_guards(self) -> None:
        """Start both guard threads, unless the block has exited or stopped guarding."""
        with self._start_lock:
            if self._guards_started or self._exited or self._engine.stopped:
                return
            self._guards_started = True
            for thread in self._threads:
                thread.start()

    def _stop_threads(self) -> None:
        self._engine.stop()
        with self._start_lock:
            self._exited = True
            started = self._guards_started
        STARTER.discard(self)
        if started:
            for thread in self._threads:
                if thread.ident is not None:  # (one that failed to start never ran)
                    thread.join()

    def _finish(self, raised: bool) -> None:
        failed = self._engine.release_on_exit(raised)
        if failed is not None:
            with contextlib.suppress(LeaseError, ApiError):
                self._release_on_exit(failed)

    def _release_on_exit(self, failed: bool) -> None:
        """The release made on exit (a hook: the fault suite records it in its history)."""
        self.lease.release(failed=failed)

    # -- the engine's driver: two threads -------------------------------------------------

    def _guarded(self, guard: str, loop: Callable[[], None]) -> None:
        """Run one guard's loop; however it ends, the engine judges the end."""
        try:
            loop()
        except BaseException as err:
            self._engine.guard_ended(guard, err)
            return
        self._engine.guard_ended(guard)

    def _watchdog(self) -> None:
        while (left := self._engine.deadline_left()) is not None:
            with self._wake:
                if not self._engine.stopped:
                    self._wake.wait(left)

    def _renew_loop(self) -> None:
        waited = time.monotonic() - self._entered  # a deferred start waited its first pause
        while (pause := self._engine.renew_pause()) is not None:
            pause, waited = max(0.0, pause - waited), 0.0
            if self._stop.wait(pause) or not self._engine.renew_due():
                return
            outcome: Exception | None = None
            with self._write_lock:
                if self._engine.stopped:
                    return
                try:
                    self.lease.renew()
                except Exception as err:
                    outcome = err
            if not self._engine.renewal_done(outcome):
                return

    def _lost(self, by_check: bool) -> None:
        self.lost.set()
        self._stand_down()  # the renewer stops waiting, the watchdog wakes to its end

    def _stand_down(self) -> None:
        self._stop.set()
        self._wake_all()

    def _wake_all(self) -> None:
        with self._wake:
            self._wake.notify_all()



class GuardStarter:
    """Starts each holding's two guard threads when its first renewal is due: one thread.

    Why: most jobs of a pool end long before a third of their lease, so they never renew,
    yet each started, woke and joined two threads (about 0.4 ms of CPU per job on the
    bench's host, ``python -m bench.jobcost``). Until the first renewal is due neither
    guard has anything to do: the renewer would be waiting for exactly that moment, and
    the watchdog for the deadline, which is never earlier (the renewer's pause never
    exceeds the time left before the deadline: ``HoldingEngine.renew_pause``). So both
    start then, and a block that exits first starts neither. ``check()`` guards the body
    meanwhile as always, and ``joblease work``'s supervisor enforces the deadline from
    another process whatever this process does.

    It only computes and starts threads, never sends a request, so a hung request cannot
    delay it. A holding whose guards cannot be started (no thread to be had) is declared
    lost (``guard_ended``); the others are not affected. A child made by ``fork`` starts
    afresh (:meth:`reset`): the parent's thread is not in it, and its lock may have been
    held at the fork.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every entry and the thread (in a child after ``fork``; see the class)."""
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, Holding]] = {}  # key → (when, holding)
        self._heap: list[tuple[float, int]] = []  # (when, key); stale keys are skipped
        self._keys: dict[int, int] = {}  # id(holding) → key
        self._count = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, when: float, holding: Holding) -> None:
        """Start ``holding``'s guards at local monotonic time ``when``."""
        with self._cond:
            key = next(self._count)
            self._due[key] = (when, holding)
            self._keys[id(holding)] = key
            earliest = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, key))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="joblease-guard-starter",
                                                daemon=True)
                self._thread.start()
            elif earliest:
                self._cond.notify()

    def discard(self, holding: Holding) -> None:
        """``holding``'s block exited: forget it (started or not)."""
        with self._cond:
            key = self._keys.pop(id(holding), None)
            if key is not None:
                self._due.pop(key, None)
            if len(self._heap) > 2 * len(self._due) + 64:  # many exited before their time
                self._heap = [(when, k) for k, (when, _) in self._due.items()]
                heapq.heapify(self._heap)

    def pending(self) -> int:
        """Holdings whose guards are still to start."""
        with self._cond:
            return len(self._due)

    def _run(self) -> None:
        while True:
            for holding in self._next_due():
                self._start(holding)

    def _next_due(self) -> list[Holding]:
        """Wait until some holding is due; pop and return every one due by then."""
        with self._cond:
            while True:
                now = time.monotonic()
                due: list[Holding] = []
                while self._heap and self._heap[0][0] <= now:
                    _, key = heapq.heappop(self._heap)
                    entry = self._due.pop(key, None)
                    if entry is not None:
                        self._keys.pop(id(entry[1]), None)
                        due.append(entry[1])
                if due:
                    return due
                self._cond.wait(self._heap[0][0] - now if self._heap else None)

    @staticmethod
    def _start(holding: Holding) -> None:
        try:
            holding._start_guards()
        except BaseException as err:  # no thread to be had: this holding is lost, not the rest
            holding._engine.guard_ended("guard start", err)


STARTER = GuardStarter()
os.register_at_fork(after_in_child=STARTER.reset)
