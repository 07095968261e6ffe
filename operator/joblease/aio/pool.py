"""A work pool from asyncio code: one list+watch feeding the pure ``PoolView``, many claimers.

``joblease.domain.pool.PoolView`` decides what to claim next and when to look again (its
docstring: candidates by priority then age, rendezvous choice among the first few, a name
set aside after a refused claim until a newer version of it arrives, the next wake-up).
This module only keeps the view fed — one task lists the pool once, then watches it from
the list's resourceVersion, resuming after each watch ends and listing again after a 410 —
and drives the claims:

1. the candidate the view chooses for this holder is claimed from its cached version (safe
   when stale: the write is conditional, a refusal is confirmed from a fresh read);
2. a refused claim (held, finished, backing off, gone) sets the name aside;
3. a claim whose answer was lost (``UnavailableError``, contention) is retried on the same
   name with the same claim id, so a claim that landed is adopted, never refused;
4. with nothing to claim, wait for a watch event, the view's next wake-up, or the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import TYPE_CHECKING, Any

from joblease.domain.errors import LeaseNotFoundError, LeaseUnavailableError
from joblease.domain.holder import retry_delay
from joblease.domain.lease import Observed
from joblease.domain.pool import DEFAULT_SPREAD, PoolView
from joblease.kube.api import GoneError, UnavailableError
from joblease.kube.identity import new_claim_id

if TYPE_CHECKING:
    from joblease.aio.client import AsyncLease, AsyncLeaseClient

log = logging.getLogger("joblease.aio")
MIN_WAIT = 0.01


class AsyncPool:
    """The JobLeases of one label selector in the client's namespace, claimed one at a time.

    ``async with client.pool(selector) as pool:`` starts the list+watch task (and stops it
    on exit); any number of coroutines may then ``await pool.claim_next(...)``.

    Attributes:
        view: The pure view of the pool (``PoolView``) the watch keeps current.
        watch_errors: Lists or watches that failed and were retried (with backoff).
    """

    def __init__(self, client: AsyncLeaseClient, selector: str | None, *,
                 spread: int = DEFAULT_SPREAD) -> None:
        self.client = client
        self.selector = selector
        self.spread = spread
        self.view = PoolView()
        self.watch_errors = 0
        self._changed = asyncio.Event()
        self._synced = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.view)

    def unfinished(self) -> int:
        """How many JobLeases of the pool are not Completed or Failed (as last seen)."""
        return self.view.unfinished()

    async def __aenter__(self) -> AsyncPool:
        self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop watching (idempotent)."""
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            await asyncio.wait([follower])

    async def claim_next(self, holder: str | None = None, *, timeout: float | None = None
                         ) -> AsyncLease | None:
        """Claim the best candidate for ``holder``; ``None`` if none was claimed in ``timeout``.

        ``timeout=None`` waits until one is claimed. Steps 1-4 of the module doc.

        Raises:
            UnavailableError: ``timeout`` ran out while a claim whose answer was lost was
                being retried (it may have landed, and then expires unheld).
            ApiError: a claim was refused for another reason (``ForbiddenError``, …).
        """
        self._start()
        client = self.client
        await client._calibrate_if_due()
        who = await client.resolve_holder(holder)
        end = None if timeout is None else client.api.monotonic() + timeout
        retry: tuple[str, str] | None = None  # a claim whose answer was lost: name, claim id
        lost: UnavailableError | None = None
        while True:
            changed, wait = self._changed, None  # before looking: no event slips in between
            if self._synced.is_set():
                now = await client.api.server_now()
                margin = await client.margin()
                obs = self.view.get(retry[0]) if retry else self.view.choose(
                    who, now, margin, self.spread)
                if obs is None:
                    retry = None  # the name left the pool (deleted): nothing to adopt
                if obs is not None:
                    claim_id = retry[1] if retry else new_claim_id()
                    retry = None
                    try:
                        lease = await client.claim(obs.name, who, observed=obs,
                                                   claim_id=claim_id)
                    except (LeaseUnavailableError, LeaseNotFoundError):
                        self.view.set_aside(obs.name)  # 2
                        continue
                    except UnavailableError as err:
                        retry, lost = (obs.name, claim_id), err  # 3
                        wait = retry_delay(1)
                    else:
                        self.view.learn(lease.observed)
                        return lease
                else:
                    wake = self.view.next_wake(now, margin)
                    if wake is not None:
                        wait = max(MIN_WAIT, (wake - now.earliest).total_seconds())
            left = None if end is None else end - client.api.monotonic()
            if left is not None and left <= 0:
                if retry is not None and lost is not None:
                    raise lost
                return None
            await _until(changed, _least(wait, left))  # 4

    # -- the watch ------------------------------------------------------------------------

    def _start(self) -> None:
        if self._follower is None:
            self._follower = asyncio.get_running_loop().create_task(
                self._follow(), name=f"joblease-pool-{self.selector}")

    async def _follow(self) -> None:
        """List, then watch from the list's version; resume after each end; list after 410."""
        store, namespace = self.client.store, self.client.namespace
        failures = 0
        while True:
            try:
                if self.view.resource_version is None:
                    items, version = await store.list_pool(namespace, self.selector)
                    self.view.replace(items, version)
                    self._synced.set()
                    self._signal()
                await store.watch_pool(namespace, self.selector,
                                       self.view.resource_version or "", self._on_event)
                failures = 0
            except GoneError:
                self.view.resource_version = None  # the watch's history is gone: list again
            except Exception as err:
                failures += 1
                self.watch_errors += 1
                log.warning("pool %s: list/watch failed (%s: %s); retrying in %.2fs",
                            self.selector, type(err).__name__, err, retry_delay(failures))
                await asyncio.sleep(retry_delay(failures))

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                obs = Observed.from_object(obj)
            except (KeyError, TypeError, ValueError) as err:  # never stall on one object
                log.warning("pool %s: skipping an unreadable JobLease (%s)", self.selector, err)
            else:
                self.view.apply(kind, obs)
                self._signal()
        if version:
            self.view.resource_version = version

    def _signal(self) -> None:
        """Wake every claimer waiting on the view (each captured the event before looking)."""
        self._changed.set()
        self._changed = asyncio.Event()


def _least(*seconds: float | None) -> float | None:
    known = [s for s in seconds if s is not None]
    return min(known) if known else None


async def _until(event: asyncio.Event, seconds: float | None) -> None:
    """Wait for ``event``, at most ``seconds`` (``None``: without a bound)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
