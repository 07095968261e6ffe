"""Hold a lease while work runs: background renewal, and a stop signal the moment it is lost.

A worker that cannot renew must stop producing effects under the old lease. These context
managers renew at a fraction of the lease duration and, as soon as a renewal is refused or
the local deadline passes without a successful renewal, tell the work to stop:

* sync (:class:`Holding`): ``holding.lost`` (a ``threading.Event``) is set, and
  ``holding.check()`` raises ``LeaseLostError`` at the work's next checkpoint;
* asyncio (:class:`AsyncHolding`): additionally the task running the ``async with`` body is
  cancelled, and the block exits with ``LeaseLostError`` instead of ``CancelledError``.

Neither can stop an effect already in flight (a request on the wire): that is what the
target-side fencing check is for. On a normal exit the lease is released unless the body
completed it; on an exception it is released as failed (an attempt is counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

from joblease.domain.errors import LeaseError, LeaseExpiredError, LeaseLostError
from joblease.kube.api import ApiError
from joblease.sdk.client import Lease

RENEW_FRACTION = 1 / 3


class Holding:
    """Keeps ``lease`` renewed from a background thread while the ``with`` body runs."""

    def __init__(self, lease: Lease, renew_fraction: float = RENEW_FRACTION) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self.error: LeaseLostError | None = None
        self.completed = False
        self.failed = False  # set by the work to release as failed (an attempt) on exit
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # a renewal never races the completion
        self._interval = max(0.05, lease.remaining() * renew_fraction)
        self._thread = threading.Thread(target=self._renew_loop, name=f"renew-{lease.name}",
                                        daemon=True)

    @property
    def token(self) -> object:
        """The current fencing token (unchanged by renewals)."""
        return self.lease.token

    def check(self) -> None:
        """Raise ``LeaseLostError`` if the lease is lost; call it before every effect."""
        if self.error is not None:
            raise self.error
        if not self.lease.valid():
            self._lose(LeaseExpiredError(self.lease.name, self.lease.holder,
                                         self.lease.generation, self.lease.lease_until))
            raise self.error  # type: ignore[misc]

    def complete(self, result: str = "") -> None:
        """Complete the job under this lease (refused if it was lost)."""
        self.check()
        with self._write_lock:
            self.lease.complete(result)
        self.completed = True

    def __enter__(self) -> Holding:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._finish(failed=exc is not None or self.failed)

    def _finish(self, failed: bool) -> None:
        if self.completed or self.error is not None:
            return
        with contextlib.suppress(LeaseError, ApiError):
            self._release_on_exit(failed)

    def _release_on_exit(self, failed: bool) -> None:
        """The release made on exit (a hook: the fault suite records it in its history)."""
        self.lease.release(failed=failed)

    def _renew_loop(self) -> None:
        while not self._stop.is_set():
            wait = min(self._interval, max(0.0, self.lease.remaining()))
            if self._stop.wait(wait):
                return
            if self.lease.remaining() <= 0:
                self._lose(LeaseExpiredError(self.lease.name, self.lease.holder,
                                             self.lease.generation, self.lease.lease_until))
                return
            try:
                with self._write_lock:
                    if self.completed or self._stop.is_set():
                        return
                    self.lease.renew()
            except LeaseLostError as err:
                self._lose(err)
                return
            except (ApiError, LeaseError):
                continue  # transient (server unavailable): retry until the local deadline

    def _lose(self, err: LeaseLostError) -> None:
        if self.error is None:
            self.error = err
        self.lost.set()
        self.on_lost()

    def on_lost(self) -> None:
        """React to the loss (called once, from the renewal thread); subclasses override."""


class AsyncHolding(Holding):
    """The asyncio flavour: the body's task is cancelled when the lease is lost."""

    def __init__(self, lease: Lease, renew_fraction: float = RENEW_FRACTION) -> None:
        super().__init__(lease, renew_fraction)
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> AsyncHolding:
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._thread.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        self._stop.set()
        await asyncio.to_thread(self._thread.join)
        if self.error is not None and isinstance(exc, asyncio.CancelledError):
            if self._task is not None:
                self._task.uncancel()
            raise self.error from exc
        await asyncio.to_thread(self._finish, exc is not None or self.failed)
        return False

    async def complete_async(self, result: str = "") -> None:
        """Complete from async code without blocking the loop."""
        await asyncio.to_thread(self.complete, result)

    def on_lost(self) -> None:
        """Cancel the body's task, from the loop's thread."""
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
