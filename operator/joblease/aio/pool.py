"""A work pool from asyncio code: one list+watch feeding the pure ``PoolView``, many claimers.

``joblease.domain.pool.PoolView`` decides what to claim next and when to look again (its
docstring: candidates by priority then age, rendezvous choice among the first few, a name
set aside after a refused claim until a newer version of it arrives, the next wake-up).
This module keeps the view fed — one task lists the pool once, then watches it from the
list's resourceVersion, resuming after each watch ends and listing again after a 410 —
and drives the claims, with the semantics of the thread-based pool (``docs/sdk.md``):

1. choose from the cache (no request to find work);
2. claim the chosen lease with one conditional write decided from the cached version; if
   it is refused (409, held, resting, finished, gone) set the name aside and choose again
   at once: a lost race costs one request;
3. if the write's answer is lost, retry the same name with the same claim id from a fresh
   read, so a claim that landed is adopted, never refused or orphaned;
4. fold the claim's answer into the view, so the next choice already knows;
5. with nothing claimable, wait for a watch event, the view's next wake-up, or the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import TYPE_CHECKING, Any

from joblease.domain.errors import (
    LeaseNotFoundError,
    LeaseUnavailableError,
    PoolClosedError,
)
from joblease.domain.holder import retry_delay
from joblease.domain.lease import Observed
from joblease.domain.pool import DEFAULT_SPREAD, PoolView, seconds_until_wake
from joblease.kube.api import ApiError, ConflictError, GoneError, UnavailableError
from joblease.kube.identity import new_claim_id
from joblease.kube.transact import MAX_CONFLICTS, ContentionError

if TYPE_CHECKING:
    from joblease.aio.client import AsyncLease, AsyncLeaseClient

log = logging.getLogger("joblease.aio")
MIN_WAIT = 0.01
FIRST_PAUSE = 0.05
LOST_ANSWER_PAUSE_MAX = 2.0


class AsyncPool:
    """The JobLeases of one label selector in the client's namespace, claimed one at a time.

    ``async with client.pool(selector) as pool:`` starts the list+watch task (and stops it
    on exit); any number of coroutines may then ``await pool.claim_next(...)``.

    Attributes:
        view: The pure view of the pool (``PoolView``) the watch keeps current.
        watch_errors: Lists or watches that failed and were retried (with backoff).
        conflicts: Claims refused (how often claimers collided).
        claims: Claims won.
    """

    def __init__(self, client: AsyncLeaseClient, selector: str | None, *,
                 spread: int = DEFAULT_SPREAD) -> None:
        self.client = client
        self.selector = selector
        self.spread = spread
        self.view = PoolView()
        self.watch_errors = 0
        self.conflicts = 0
        self.claims = 0
        self._claiming: set[str] = set()  # names this pool's coroutines are claiming now
        self._changed = asyncio.Event()
        self._synced = False
        self._trouble: ApiError | None = None
        self._dead: Exception | None = None
        self._closed = False
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
        """Stop watching (idempotent); a waiting ``claim_next`` returns ``None``."""
        self._closed = True
        self._signal()
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            await asyncio.wait([follower])

    async def claim_next(self, holder: str | None = None, *, timeout: float | None = None,
                         spread: int | None = None, until_empty: bool = False
                         ) -> AsyncLease | None:
        """Claim the next claimable JobLease of the pool, waiting up to ``timeout`` seconds.

        Args:
            holder: As for ``claim`` (``None``: ``default_holder()``).
            timeout: Seconds to wait; ``None`` waits until one is claimed, ``0`` tries what
                the view holds now.
            spread: How many of the first candidates of the top priority to choose among.
            until_empty: Return ``None`` at once when no unfinished lease is left.

        Returns:
            The held lease, or ``None``: the timeout passed, the pool was closed, or (with
            ``until_empty``) it is empty.

        Raises:
            UnavailableError: no list arrived before the timeout, or a claim's answer was
                lost and the server stayed unreachable until then (it may have landed: it
                expires on its own).
            ApiError: the list, watch or a claim was refused (``ForbiddenError``: RBAC must
                allow ``list`` and ``watch`` on jobleases).
            PoolClosedError: the pool's watch stopped on an unexpected error.
        """
        self._start()
        client = self.client
        await client._calibrate_if_due()
        who = await client.resolve_holder(holder)
        end = None if timeout is None else client.api.monotonic() + timeout
        width = self.spread if spread is None else spread
        while True:
            chosen = await self._choose_or_wait(who, end, width, until_empty)
            if chosen is None:
                return None
            try:
                lease = await self._claim(chosen, who, end)
            finally:
                self._claiming.discard(chosen.name)
            if lease is not None:
                return lease

    # -- choosing and waiting ---------------------------------------------------------------

    async def _choose_or_wait(self, who: str, end: float | None, spread: int,
                              until_empty: bool) -> Observed | None:
        """The cached lease to try now, after waiting for one; ``None``: give up (step 5)."""
        await self._wait_synced(end)
        api = self.client.api
        while True:
            if self._closed:
                self._raise_if_dead()
                return None  # closed under a waiting claim: a worker's loop ends
            changed = self._changed  # before looking: no event slips in between
            now = await api.server_now()
            margin = await self.client.margin()
            chosen = self.view.choose(who, now, margin, spread, exclude=self._claiming)  # 1
            if chosen is not None:
                self._claiming.add(chosen.name)  # sibling coroutines choose others meanwhile
                return chosen
            if until_empty and self.view.unfinished() == 0:
                return None
            left = None if end is None else end - api.monotonic()
            if left is not None and left <= 0:
                return None
            wake = self.view.next_wake(now, margin)
            wait = None if wake is None else max(
                MIN_WAIT, seconds_until_wake(api.clock, wake, api.monotonic()))
            await _until(changed, _least(wait, left))  # 5

    async def _wait_synced(self, end: float | None) -> None:
        """Wait for the first list; raise a refusal (403, no CRD, bad selector) at once."""
        api = self.client.api
        while not self._synced and not self._closed:
            if self._trouble is not None and not isinstance(self._trouble, UnavailableError):
                raise self._trouble
            left = None if end is None else end - api.monotonic()
            if left is not None and left <= 0:
                if self._trouble is not None:
                    raise self._trouble
                raise UnavailableError(0, "NotSynced", f"JobLease pool {self.selector!r}: no "
                                       "list of its leases within the timeout")
            await _until(self._changed, left)

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise PoolClosedError(f"JobLease pool {self.selector!r}: its watch stopped: "
                                  f"{self._dead!r}") from self._dead

    # -- claiming -----------------------------------------------------------------------------

    async def _claim(self, chosen: Observed, who: str, end: float | None) -> AsyncLease | None:
        """Claim ``chosen`` (steps 2-4); ``None``: lost it, choose again."""
        claim_id = new_claim_id()
        observed: Observed | None = chosen
        pause = FIRST_PAUSE
        while True:
            try:
                lease = await self.client._claim(
                    chosen.name, who, claim_id, observed=observed,
                    max_conflicts=1 if observed is not None else MAX_CONFLICTS)
            except (LeaseUnavailableError, LeaseNotFoundError, ConflictError, ContentionError):
                self.conflicts += 1
                self.view.set_aside(chosen.name, chosen.resource_version)  # 2
                return None
            except UnavailableError:
                if end is not None and self.client.api.monotonic() + pause >= end:
                    raise
                await asyncio.sleep(pause)  # 3: same name, same claim id, fresh read
                pause = min(LOST_ANSWER_PAUSE_MAX, pause * 2)
                observed = None
                continue
            self.view.learn(lease.observed)  # 4
            self.claims += 1
            return lease

    # -- the watch ------------------------------------------------------------------------

    def _start(self) -> None:
        if self._follower is None and not self._closed:
            self._follower = asyncio.get_running_loop().create_task(
                self._follow(), name=f"joblease-pool-{self.selector}")

    async def _follow(self) -> None:
        """List, then watch from the list's version; resume after each end; list after 410."""
        try:
            await self._feed()
        except Exception as err:  # a bug must not leave claimers waiting on a dead watch
            log.exception("JobLease pool %r: the watch stopped", self.selector)
            self._dead, self._closed = err, True
            self._signal()

    async def _feed(self) -> None:
        store, namespace = self.client.store, self.client.namespace
        failures = 0
        while True:
            try:
                if self.view.resource_version is None:
                    items, version = await store.list_pool(namespace, self.selector)
                    self.view.replace(items, version)
                    self._synced, self._trouble = True, None
                    self._signal()
                await store.watch_pool(namespace, self.selector,
                                       self.view.resource_version or "", self._on_event)
                failures = 0
            except GoneError:
                self.view.resource_version = None  # the watch's history is gone: list again
            except ApiError as err:
                failures += 1
                self.watch_errors += 1
                self._trouble = err
                self._signal()
                log.warning("JobLease pool %r: list/watch failed (%s); retrying in %.2fs",
                            self.selector, err, retry_delay(failures))
                await asyncio.sleep(retry_delay(failures))

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                obs = Observed.from_object(obj)
            except (KeyError, TypeError, ValueError) as err:  # never stall on one object
                log.warning("JobLease pool %r: skipping an unreadable JobLease (%s)",
                            self.selector, err)
            else:
                self.view.apply(kind, obs)
                self._signal()
        if version:
            self.view.resource_version = version

    def _signal(self) -> None:
        """Wake every coroutine waiting on the pool (each captured the event before looking)."""
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
