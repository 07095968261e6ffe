"""Hold a lease from asyncio code: one renewing task, a watchdog timer, the body cancelled on loss.

``async with client.hold(lease) as holding:`` keeps the lease renewed while the body runs
and stops the body the moment the lease is lost — with the rules of ``joblease.sdk``'s
``Holding`` (``docs/safety.md``, "The holder's loop"), and without threads:

1. the *renewer*, one asyncio task, renews every ``renew_fraction`` of the time left; a
   refusal declares the loss; any other failure — an unreachable server, a 409 storm, an
   exception of any type — is retried with a short backoff (``domain.holder.retry_delay``),
   and no request waits past the deadline (the renewal's steps carry the lease's deadline:
   ``joblease.core.ops``, each request's timeout is what is left of it);
2. the *watchdog* is a ``loop.call_at`` timer at the local deadline (minus ``stop_before``),
   moved by every renewal. It sends nothing, so a hung request cannot delay it; when it
   fires it declares the loss and cancels the renewer, whose request is abandoned at once.

Their only exits other than a requested stop (the block's exit, or a completion) are
declaring the lease lost: a renewer that ends any other way — an unplanned
``BaseException``, a cancellation from outside — becomes ``RenewalStoppedError``.

On a loss the body's task is cancelled and the block exits with the ``LeaseLostError``
instead of ``CancelledError``. Neither can stop an effect already in flight: that is the
target's fencing check. On a normal exit the lease is released unless the body completed
it; after an exception or ``fail()`` it is released as failed (an attempt is counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from joblease.domain.errors import (
    LeaseError,
    LeaseLostError,
    RenewalStoppedError,
)
from joblease.domain.holder import RENEW_FRACTION, AsyncHeldLease, HoldingState
from joblease.kube.api import ApiError

log = logging.getLogger("joblease.aio")


class AsyncLeaseHolding(HoldingState[AsyncHeldLease]):
    """Keeps an :class:`~joblease.aio.AsyncLease` renewed while an ``async with`` body runs.

    Whether the hold is lost, and why, is one value: :attr:`loss` (the ``LeaseLostError``,
    or ``None``); :attr:`lost` is an ``asyncio.Event`` set in the same step, and the lease's
    own ``loss`` gets the same error.

    Attributes:
        lease: The held lease.
        lost: Set once the lease is declared lost.
        completed: Whether :meth:`complete` succeeded.
        renew_failures: Renewals that failed transiently and were retried.

    Args:
        lease: The held lease.
        renew_fraction: Renew after this fraction of the lease's remaining time.
        stop_before: Declare a lease that could not be renewed lost this many seconds
            before its deadline.
    """

    def __init__(self, lease: AsyncHeldLease, renew_fraction: float = RENEW_FRACTION, *,
                 stop_before: float = 0.0) -> None:
        super().__init__(lease, renew_fraction, stop_before)
        self.lost = asyncio.Event()
        self._stopping = False  # the block is exiting: guards stand down, nothing is cancelled
        self._write_lock = asyncio.Lock()  # a renewal never races the completion
        self._body: asyncio.Task[object] | None = None
        self._body_cancelled = False
        self._renewer: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def check(self) -> None:
        """Raise the loss if the lease is lost; call it before every effect.

        Raises:
            LeaseLostError: the lease is lost (:attr:`loss`); stop producing effects.
        """
        if self._loss is None:
            seen = self._seen_at_check()
            if seen is not None:
                self._lose(seen, cancel_body=False)  # raised here instead
        if self._loss is not None:
            raise self._loss

    async def complete(self, result: str = "") -> None:
        """Complete the job under this lease (refused if it was lost); renewals then stop.

        Raises:
            LeaseLostError: lost before or during the completion.
            UnavailableError: no answer; the lease is still held until its deadline, and
                retrying is safe.
        """
        self.check()
        async with self._write_lock:
            self.check()
            try:
                await self.lease.complete(result)
            except LeaseLostError as err:
                self._lose(err, cancel_body=False)
                raise
        self.completed = True
        self._stand_down()

    async def __aenter__(self) -> AsyncLeaseHolding:
        self._loop = asyncio.get_running_loop()
        self._body = asyncio.current_task()
        self._renewer = self._loop.create_task(self._renew_loop(),
                                               name=f"joblease-renew-{self.lease.name}")
        self._renewer.add_done_callback(self._renewer_ended)
        self._arm_watchdog()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        self._stopping = True
        self._stand_down()
        if self._renewer is not None:
            await asyncio.wait([self._renewer])  # never raises: the renewer's end is its own
        if self._body_cancelled and self._body is not None:
            # our own cancellation is answered with the loss; a caller's is left standing
            others = self._body.uncancel()
            if isinstance(exc, asyncio.CancelledError) and others == 0:
                assert self._loss is not None  # the body is cancelled only by a loss
                raise self._loss from exc
        if not self.completed and self._loss is None:
            with contextlib.suppress(LeaseError, ApiError):
                await self.lease.release(failed=exc is not None or self._failed)
        return False

    def on_lost(self) -> None:
        """React to the loss (called once, on the event loop); subclasses override."""

    def on_renewed(self) -> None:
        """React to a successful renewal (in the renewer task); subclasses override."""

    # -- the guards --------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._pace.pause(self.remaining()))
            if self._loss is not None or self.completed:
                return
            if self.remaining() <= 0:
                self._lose(self._expired())
                return
            try:
                async with self._write_lock:
                    if self.completed:
                        return
                    await self.lease.renew()
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
            self._arm_watchdog()
            self.on_renewed()

    def _renewer_ended(self, task: asyncio.Task[None]) -> None:
        """The renewer's guard: any end but a requested stop or a declared loss is a loss."""
        if self._stopping or self.completed or self._loss is not None:
            return
        why = "was cancelled" if task.cancelled() else (
            f"stopped by an unexpected error: {task.exception()!r}" if task.exception()
            else "ended unexpectedly")
        log.error("JobLease %s: lease guard failed: the renewal %s", self.lease.name, why)
        self._lose(RenewalStoppedError(self.lease.name,
                                       f"renewal of {self.lease.name!r} {why}"))

    def _arm_watchdog(self) -> None:
        """(Re)start the timer at the deadline; the loop's clock, measured from now."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._loop is None or self._stopping or self._loss is not None:
            return
        self._watchdog = self._loop.call_at(self._loop.time() + max(0.0, self.remaining()),
                                            self._on_deadline)

    def _on_deadline(self) -> None:
        """The watchdog's timer: its only exit is the loss (an error in it declares one).

        A loop callback that raised would only be logged by asyncio, and the body would
        run on past its deadline; the thread holding's guard turns the same into a loss.
        """
        try:
            self._deadline_reached()
        except Exception as err:
            log.exception("JobLease %s: lease guard failed: the deadline watchdog",
                          self.lease.name)
            self._lose(RenewalStoppedError(self.lease.name, f"the deadline watchdog of "
                                           f"{self.lease.name!r} failed: {err!r}"))

    def _deadline_reached(self) -> None:
        self._watchdog = None
        if self._stopping or self.completed or self._loss is not None:
            return
        if self.remaining() > 0:  # moved by a renewal the timer did not see
            self._arm_watchdog()
            return
        self._lose(self._expired())

    def _stand_down(self) -> None:
        """Stop guarding (a requested stop): no more timer, no more renewals."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._renewer is not None and asyncio.current_task() is not self._renewer:
            self._renewer.cancel()

    def _lose(self, err: LeaseLostError, cancel_body: bool = True) -> None:
        """Declare the loss once: record it, stop both guards, stop the body."""
        if self._loss is not None:
            return
        self._loss = err
        if self.lease.loss is None:
            self.lease.loss = err
        self.lost.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._renewer is not None and asyncio.current_task() is not self._renewer:
            self._renewer.cancel()  # its request, if any, is abandoned now
        if cancel_body and not self._stopping and self._body is not None \
                and asyncio.current_task() is not self._body:
            self._body_cancelled = True
            self._body.cancel()
        self.on_lost()
