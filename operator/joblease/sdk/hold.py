"""Hold a lease while work runs: background renewal, and a stop signal the moment it is lost.

A worker that cannot renew must stop producing effects under the old lease. These context
managers renew at a fraction of the lease duration and, as soon as a renewal is refused or
the local deadline passes without a successful renewal, tell the work to stop:

* sync (:class:`Holding`): ``holding.loss`` becomes the ``LeaseLostError`` that says why,
  ``holding.lost`` (a ``threading.Event`` to wait on) is set in the same step, and
  ``holding.check()`` raises the loss at the work's next checkpoint;
* asyncio (:class:`AsyncHolding`): additionally the task running the ``async with`` body is
  cancelled, and the block exits with ``LeaseLostError`` instead of ``CancelledError``.

Neither can stop an effect already in flight (a request on the wire): that is what the
target-side fencing check is for. On a normal exit the lease is released unless the body
completed it; on an exception, or after ``holding.fail()``, it is released as failed (an
attempt is counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from types import TracebackType

from joblease.domain.errors import (
    LeaseError,
    LeaseLostError,
    RenewalStoppedError,
)
from joblease.domain.holder import (
    MAX_RETRY_DELAY,
    RENEW_FRACTION,
    HeldLease,
    HoldingState,
    retry_delay,
)
from joblease.kube.api import ApiError

# The renewal cadence and backoff are the holder's protocol, shared with joblease.aio.
__all__ = ["MAX_RETRY_DELAY", "RENEW_FRACTION", "AsyncHolding", "Holding",
           "RenewalStoppedError", "retry_delay"]
log = logging.getLogger("joblease.sdk")


class Holding(HoldingState[HeldLease]):
    """Keeps ``lease`` renewed from a background thread while the ``with`` body runs.

    Two threads guard the lease (issue 14, items 3 and 4):

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
    next :meth:`check` or renewal.

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
        super().__init__(lease, renew_fraction, stop_before)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._moved = threading.Condition()  # the watchdog waits on it; notified on renew/stop
        self._lose_lock = threading.Lock()
        self._write_lock = threading.Lock()  # a renewal never races the completion
        self._threads = [
            threading.Thread(target=self._guard, args=(self._renew_loop,),
                             name=f"renew-{lease.name}", daemon=True),
            threading.Thread(target=self._guard, args=(self._watchdog,),
                             name=f"deadline-{lease.name}", daemon=True),
        ]

    def check(self) -> None:
        """Raise the loss if the lease is lost; call it before every effect.

        Raises:
            LeaseLostError: the lease is lost (:attr:`loss`); stop producing effects.
        """
        if self._loss is None:
            seen = self._seen_at_check()
            if seen is not None:
                self._lose(seen)
        if self._loss is not None:
            raise self._loss

    def complete(self, result: str = "") -> None:
        """Complete the job under this lease (refused if it was lost).

        Never races a renewal: both take the same lock.

        Raises:
            LeaseLostError: lost before or during the completion (see ``Lease.complete``).
            UnavailableError: no answer; the lease is still held until its deadline, and
                retrying is safe.
        """
        self.check()
        with self._write_lock:
            self.check()
            self.lease.complete(result)
            self.completed = True
        # A completed lease has nothing left to guard: stop both guards now, or the
        # watchdog declares a loss at the old deadline while the body still runs.
        self._stop.set()
        with self._moved:
            self._moved.notify_all()

    def __enter__(self) -> Holding:
        self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop_threads()
        self._finish(failed=exc is not None or self._failed)

    def _start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _stop_threads(self) -> None:
        self._stop.set()
        with self._moved:
            self._moved.notify_all()
        for thread in self._threads:
            thread.join()

    def _finish(self, failed: bool) -> None:
        if self.completed or self._loss is not None:
            return
        with contextlib.suppress(LeaseError, ApiError):
            self._release_on_exit(failed)

    def _release_on_exit(self, failed: bool) -> None:
        """The release made on exit (a hook: the fault suite records it in its history)."""
        self.lease.release(failed=failed)

    def _guard(self, loop: object) -> None:
        """Run one guarding loop; if it ends any other way than stop or loss, declare loss."""
        try:
            loop()  # type: ignore[operator]
        except BaseException as err:
            log.exception("JobLease %s: lease guard failed", self.lease.name)
            self._lose(RenewalStoppedError(self.lease.name, f"renewal of {self.lease.name!r} "
                                           f"stopped by an unexpected error: {err!r}"))
            return
        if not self._stop.is_set() and self._loss is None:
            self._lose(RenewalStoppedError(self.lease.name,
                                           f"renewal of {self.lease.name!r} ended unexpectedly"))

    def _watchdog(self) -> None:
        with self._moved:
            while not self._stop.is_set() and self._loss is None:
                left = self.remaining()
                if left <= 0:
                    break
                self._moved.wait(left)
        if not self._stop.is_set():
            self._lose(self._expired())

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._pace.pause(self.remaining())):
            if self._loss is not None:
                return
            if self.remaining() <= 0:
                self._lose(self._expired())
                return
            try:
                with self._write_lock:
                    if self.completed or self._stop.is_set():
                        return
                    self.lease.renew()
            except LeaseLostError as err:
                self._lose(err)
                return
            except Exception as err:
                delay = self._pace.failed()
                log.warning("JobLease %s: renewal failed (%s: %s); retrying in %.2fs, lost in "
                            "%.2fs unless one succeeds", self.lease.name, type(err).__name__,
                            err, delay, self.remaining())
                continue
            self._pace.renewed()
            with self._moved:
                self._moved.notify_all()
            self.on_renewed()

    def _lose(self, err: LeaseLostError) -> None:
        with self._lose_lock:
            if self._loss is not None:
                return
            self._loss = err
            if self.lease.loss is None:
                self.lease.loss = err
        self.lost.set()
        with self._moved:
            self._moved.notify_all()
        self.on_lost()

    def on_lost(self) -> None:
        """React to the loss (called once, from whichever thread saw it); subclasses override."""

    def on_renewed(self) -> None:
        """React to a successful renewal (from the renewal thread); subclasses override."""


class AsyncHolding(Holding):
    """The asyncio flavour: the body's task is cancelled when the lease is lost.

    Why it stays beside ``joblease.aio.AsyncLeaseHolding``: it guards a lease of the
    *thread* client (``joblease.sdk.Lease``, renewed by this class's thread) while the body
    is asyncio code — a program that claims with ``LeaseClient`` and runs its work in an
    event loop. Its cross-loop cancel and its renewal thread are the price of that mix.
    New asyncio code should claim with ``joblease.aio.AsyncLeaseClient`` and hold with
    ``client.hold(lease)``: one task and one timer, no thread (docs/sdk.md).
    """

    def __init__(self, lease: HeldLease, renew_fraction: float = RENEW_FRACTION, *,
                 stop_before: float = 0.0) -> None:
        super().__init__(lease, renew_fraction, stop_before=stop_before)
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    async def __aenter__(self) -> AsyncHolding:
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        await asyncio.to_thread(self._stop_threads)
        if self._loss is not None and isinstance(exc, asyncio.CancelledError):
            if self._task is not None:
                self._task.uncancel()
            raise self._loss from exc
        await asyncio.to_thread(self._finish, exc is not None or self._failed)
        return False

    async def complete_async(self, result: str = "") -> None:
        """Complete from async code without blocking the loop."""
        await asyncio.to_thread(self.complete, result)

    def on_lost(self) -> None:
        """Cancel the body's task from the loop's thread.

        Not when the loss was seen on the loop's thread itself: then ``check()`` raises in
        the body, and a cancel would hit the ``async with`` exit instead.
        """
        if self._loop is None or self._task is None:
            return
        if threading.get_ident() == self._loop_thread:
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing to cancel
            self._loop.call_soon_threadsafe(self._task.cancel)
