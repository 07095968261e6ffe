"""``AsyncHolding``: deprecated; hold from asyncio code with ``joblease.aio``.

It guards a lease of the *thread* client (``joblease.sdk.Lease``, renewed by
``Holding``'s threads) while the body is asyncio code, and cancels the body's task across
threads when the lease is lost. ``joblease.aio`` does the same with one task and one timer
and no thread: ``AsyncLeaseClient.claim`` and ``async with client.hold(lease)``
(docs/sdk.md). Kept, with a ``DeprecationWarning``, for programs that still mix the two;
it lives apart from ``joblease.sdk.hold`` so that the thread client imports no asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import warnings
from types import TracebackType

from joblease.domain.holder import RENEW_FRACTION, HeldLease
from joblease.sdk.hold import Holding


class AsyncHolding(Holding):
    """The asyncio flavour of :class:`Holding`: the body's task is cancelled on a loss.

    Deprecated (warns on construction): use ``joblease.aio`` — ``AsyncLeaseClient``
    claims, ``client.hold(lease)`` holds.
    """

    def __init__(self, lease: HeldLease, renew_fraction: float = RENEW_FRACTION, *,
                 stop_before: float = 0.0) -> None:
        warnings.warn("joblease.AsyncHolding is deprecated: claim with "
                      "joblease.aio.AsyncLeaseClient and hold with `async with "
                      "client.hold(lease)` (docs/sdk.md)", DeprecationWarning, stacklevel=2)
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
        if self.loss is not None and isinstance(exc, asyncio.CancelledError):
            if self._task is not None:
                self._task.uncancel()
            raise self.loss from exc
        await asyncio.to_thread(self._finish, exc is not None)
        return False

    async def complete_async(self, result: str = "") -> None:
        """Complete from async code without blocking the loop."""
        await asyncio.to_thread(self.complete, result)

    def _lost(self, by_check: bool) -> None:
        """Wake the threads, and cancel the body's task from the loop's thread.

        Not when the loss was seen on the loop's thread itself: then ``check()`` raises in
        the body, and a cancel would hit the ``async with`` exit instead.
        """
        super()._lost(by_check)
        if self._loop is None or self._task is None or by_check:
            return
        if threading.get_ident() == self._loop_thread:
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing to cancel
            self._loop.call_soon_threadsafe(self._task.cancel)
