"""Hold a lease from asyncio code: one renewing task, a watchdog timer, the body cancelled on loss.

``async with client.hold(lease) as holding:`` keeps the lease renewed while the body runs
and stops the body the moment the lease is lost. What the loop decides — when to renew,
what a refusal or an unreachable server means, when the lease is lost — is
``joblease.domain.holder.HoldingEngine``'s, the same engine ``joblease.sdk.Holding`` drives
with threads (``docs/safety.md``, "The holder's loop"). This module only waits and sends:

1. the *renewer*, one asyncio task, sleeps as the engine says and sends the renewal (its
   steps carry the lease's deadline: ``joblease.core.ops``, each request's timeout is what
   is left of it);
2. the *watchdog* is a ``loop.call_later`` timer at the local deadline (minus
   ``stop_before``). It sends nothing, so a hung request cannot delay it; when the engine
   declares the loss there, the renewer is cancelled and its request abandoned at once.

A renewer that ends any other way than a requested stop or a declared loss — an unplanned
``BaseException``, a cancellation from outside — is ``RenewalStoppedError``, and so is an
exception in the timer. On a loss the body's task is cancelled and the block exits with the
``LeaseLostError`` instead of ``CancelledError``. Neither can stop an effect already in
flight: that is the target's fencing check. On a normal exit the lease is released unless
the body completed it; after an exception or ``fail()`` it is released as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from joblease.domain.errors import LeaseError, LeaseLostError
from joblease.domain.holder import RENEW_FRACTION, AsyncHeldLease, HoldingFront
from joblease.kube.api import ApiError

log = logging.getLogger("joblease.aio")


class AsyncLeaseHolding(HoldingFront[AsyncHeldLease]):
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
        self._engine = self._engine_for(lease, renew_fraction, stop_before, log=log)
        self.lost = asyncio.Event()
        self._write_lock = asyncio.Lock()  # a renewal never races the completion
        self._body: asyncio.Task[object] | None = None
        self._body_cancelled = False
        self._renewer: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

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
                self._engine.completion_done(err)
                raise
            self._engine.completion_done(None)

    async def __aenter__(self) -> AsyncLeaseHolding:
        self._loop = asyncio.get_running_loop()
        self._body = asyncio.current_task()
        self._arm_watchdog()  # first: should it raise, no renewer is left running unowned
        self._renewer = self._loop.create_task(self._renew_loop(),
                                               name=f"joblease-renew-{self.lease.name}")
        self._renewer.add_done_callback(self._renewer_ended)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        self._engine.stop()
        if self._renewer is not None:
            await asyncio.wait([self._renewer])  # never raises: the renewer's end is its own
        if self._body_cancelled and self._body is not None:
            # our own cancellation is answered with the loss; a caller's is left standing
            others = self._body.uncancel()
            if isinstance(exc, asyncio.CancelledError) and others == 0:
                assert self.loss is not None  # the body is cancelled only by a loss
                raise self.loss from exc
        failed = self._engine.release_on_exit(exc is not None)
        if failed is not None:
            with contextlib.suppress(LeaseError, ApiError):
                await self.lease.release(failed=failed)
        return False

    # -- the engine's driver: a task and a timer ------------------------------------------

    async def _renew_loop(self) -> None:
        while (pause := self._engine.renew_pause()) is not None:
            await asyncio.sleep(pause)
            if not self._engine.renew_due():
                return
            outcome: Exception | None = None
            async with self._write_lock:
                if self._engine.stopped:
                    return
                try:
                    await self.lease.renew()
                except Exception as err:
                    outcome = err
            if not self._engine.renewal_done(outcome):
                return

    def _renewer_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            self._engine.guard_ended("renewal", cancelled=True)
        else:
            self._engine.guard_ended("renewal", task.exception())

    def _arm_watchdog(self) -> None:
        """(Re)start the timer for what the engine says is left; it ends the watch itself."""
        left = self._engine.deadline_left()
        if left is not None and self._loop is not None:
            self._watchdog = self._loop.call_later(left, self._on_deadline)

    def _on_deadline(self) -> None:
        """The timer's callback: an error in it is the engine's to judge (#27).

        A loop callback that raised would only be logged by asyncio, and the body would run
        on past its deadline.
        """
        self._watchdog = None
        try:
            self._arm_watchdog()
        except Exception as err:
            self._engine.guard_ended("deadline watchdog", err)

    def _stand_down(self) -> None:
        """No more timer, no more renewals (the renewer's request, if any, is abandoned)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._renewer is not None and asyncio.current_task() is not self._renewer:
            self._renewer.cancel()

    def _lost(self, by_check: bool) -> None:
        """Set the event, stop both guards, and cancel the body unless it raises the loss."""
        self.lost.set()
        self._stand_down()
        if by_check or self._body is None:
            return
        if asyncio.current_task() is self._body and self._loop is not None:
            # declared on the body's own task (entering with a lease already expired): a
            # cancel now would hit whatever it awaits next, its exit included; from the loop,
            # it hits the body's next await, unless the body raised the loss by then
            self._loop.call_soon(self._cancel_body)
        else:
            self._cancel_body()

    def _cancel_body(self) -> None:
        if not self._engine.stopping and self._body is not None:
            self._body_cancelled = True
            self._body.cancel()
