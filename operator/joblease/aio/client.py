"""The asyncio worker client: claim a JobLease, renew it, complete or release it — awaited.

The same protocol as ``joblease.sdk`` with nothing decided twice: the decisions are
``joblease.domain.lease``'s, the read–decide–write loop is ``joblease.kube.transact``'s
(driven by :func:`~joblease.kube.transact.atransact`), the requests are
``joblease.kube.leases``' calls, and what a holder concludes from an answer (the local
deadline, the token guard) is ``joblease.domain.holder``'s. What differs is only how the
requests travel (``AsyncKubeApi``, aiohttp) and how waiting is done (``asyncio.sleep``,
never ``time.sleep``): no call here blocks the event loop, and no thread is started per
lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from types import TracebackType

from joblease.aio.hold import AsyncLeaseHolding
from joblease.aio.pool import AsyncPool
from joblease.domain.clock import ServerNow
from joblease.domain.errors import (
    LeaseGoneError,
    LeaseHeldError,
    LeaseLostError,
    LeaseNotFoundError,
)
from joblease.domain.holder import (
    DEFAULT_MARGIN,
    IDENTITY_HOLDER,
    RENEW_FRACTION,
    ClaimDecider,
    finished_error,
    for_incarnation,
    seconds_until_claimable,
    standing,
)
from joblease.domain.lease import (
    Claim,
    Observed,
    Transition,
    decide_complete,
    decide_release,
    decide_renew,
)
from joblease.domain.pool import DEFAULT_SPREAD
from joblease.domain.token import FencingToken
from joblease.kube.aioapi import AsyncKubeApi
from joblease.kube.aioleases import AsyncLeaseStore
from joblease.kube.api import ForbiddenError, UnavailableError
from joblease.kube.identity import default_holder, new_claim_id
from joblease.kube.transact import MAX_CONFLICTS, Outcome, atransact


class AsyncLeaseClient:
    """Claims JobLeases in one namespace as one identity, from asyncio code.

    Use it as ``async with AsyncLeaseClient(...) as client:`` (or ``await client.close()``):
    it closes the ``AsyncKubeApi`` it built itself; one passed in as ``api`` belongs to the
    caller and is left open. Building it does no I/O: the kubeconfig is read, in a worker
    thread, by the first request.

    Calibration works as in ``LeaseClient``: with ``calibrate=True`` the first claim,
    ``wait_claim``, ``resume`` or ``claim_next`` first calls :meth:`calibrate` (about one
    second, once per client, awaited with ``asyncio.sleep``); ``margin()`` never does.

    Args:
        namespace: Namespace of the JobLeases.
        api: An ``AsyncKubeApi`` to use (and not close).
        kubeconfig: Path of a kubeconfig file (default ``$KUBECONFIG``, then in-cluster).
        context: The kubeconfig context (default: its current context).
        margin: Safety margin added to the server-clock error bound.
        calibrate: Calibrate lazily before the first claim or resume.
        max_server_skew: The assumed maximum difference between API servers' clocks
            (overrides ``JOBLEASE_MAX_SERVER_SKEW``; see ``docs/ha.md``).
    """

    def __init__(self, namespace: str = "default", *, api: AsyncKubeApi | None = None,
                 kubeconfig: str | None = None, context: str | None = None,
                 margin: timedelta = DEFAULT_MARGIN, calibrate: bool = True,
                 max_server_skew: timedelta | None = None) -> None:
        self.namespace = namespace
        self._owns_api = api is None
        self.api = api or AsyncKubeApi(kubeconfig=kubeconfig, context=context)
        if max_server_skew is not None:
            self.api.clock.max_skew = max_server_skew.total_seconds()
        self.store = AsyncLeaseStore(self.api)
        self.base_margin = margin
        self._calibration_due = calibrate
        self._calibration_lock = asyncio.Lock()
        self._identity: str | None = None
        self._pools: dict[str | None, AsyncPool] = {}
        self._closed = False

    async def calibrate(self) -> timedelta:
        """Narrow the server-clock estimate to about a round trip; return the error bound.

        Raises:
            UnavailableError: the API server did not answer, or sent no usable ``Date``.
        """
        async with self._calibration_lock:
            self._calibration_due = False
            await self.api.calibrate()
        return (await self.api.server_now()).error

    async def _calibrate_if_due(self) -> None:
        """The documented lazy step: calibrate once, before the first claim or resume."""
        if self._calibration_due:
            async with self._calibration_lock:
                if self._calibration_due:  # another coroutine may have done it meanwhile
                    await self.api.calibrate()
                    self._calibration_due = False

    async def margin(self) -> timedelta:
        """The margin in force now: the base margin plus the clock estimate's error bound.

        Never calibrates; only a client that has never heard from the API server sends one
        ``GET /version`` first.

        Raises:
            UnavailableError: the API server did not answer, or sent no usable ``Date``.
        """
        return self.base_margin + (await self.api.server_now()).error

    async def close(self) -> None:
        """Close the ``AsyncKubeApi`` this client built (idempotent).

        Let every holding over this client's leases exit first.
        """
        if self._closed:
            return
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()
        if self._owns_api:
            await self.api.close()

    async def __aenter__(self) -> AsyncLeaseClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def resolve_holder(self, holder: str | None) -> str:
        """The holder written: ``None`` → ``default_holder()``; ``"@identity"`` → our username."""
        requested = holder or default_holder()
        if requested == IDENTITY_HOLDER:
            if self._identity is None:
                self._identity = await self.api.whoami()
            return self._identity
        return requested

    async def get(self, name: str) -> Observed:
        """Read a JobLease.

        Raises:
            LeaseNotFoundError: no such JobLease.
        """
        return await self.store.get(self.namespace, name)

    async def claim(self, name: str, holder: str | None = None, *,
                    observed: Observed | None = None, claim_id: str | None = None
                    ) -> AsyncLease:
        """Claim ``name`` for ``holder`` once; raise if someone else holds it.

        As ``LeaseClient.claim``: ``observed`` (a recent version) saves the read and is safe
        when stale; the same ``claim_id`` on a retry after ``UnavailableError`` adopts a
        claim whose answer was lost.

        Raises:
            LeaseHeldError: held by someone else and not expired.
            LeaseFinishedError: Completed or Failed.
            LeaseNotFoundError: no such JobLease.
            UnavailableError: no answer (retry with ``claim_id``); ``ContentionError``.
            ApiError: refused for another reason (``ForbiddenError``, ``InvalidError``).
        """
        await self._calibrate_if_due()
        who = await self.resolve_holder(holder)
        return await self._claim(name, who, claim_id or new_claim_id(), observed=observed)

    async def _claim(self, name: str, who: str, claim_id: str, *,
                     observed: Observed | None = None, max_conflicts: int = MAX_CONFLICTS
                     ) -> AsyncLease:
        """One claim as ``who`` under ``claim_id`` (a pool passes ``max_conflicts=1``)."""
        decide = ClaimDecider(who, await self.margin(), claim_id)
        try:
            outcome = await atransact(self.store, self.namespace, name, decide,
                                      observed=observed, max_conflicts=max_conflicts)
        except ForbiddenError as err:
            refusal = decide.exhaustion_refused()
            if refusal is None:
                raise
            raise refusal from err
        if outcome.transition is not None and outcome.transition.kind == "failed":
            raise finished_error(outcome.observed, outcome.transition)
        return AsyncLease(self, who, claim_id, outcome, await self.margin())

    async def resume(self, name: str, holder: str | None, token: FencingToken,
                     claim_id: str | None = None) -> AsyncLease:
        """An :class:`AsyncLease` for a claim made elsewhere (as ``LeaseClient.resume``).

        Nothing is written; the lease's operations succeed only while that very claim is
        current, and a claim that is not current gets a deadline of now.

        Raises:
            LeaseNotFoundError: no such JobLease.
            UnavailableError: the API server did not answer.
        """
        await self._calibrate_if_due()
        who = await self.resolve_holder(holder)
        obs = await self.get(name)
        outcome = Outcome(obs, None, self.api.monotonic())
        return AsyncLease(self, who, claim_id, outcome, await self.margin(), token=token)

    async def wait_claim(self, name: str, holder: str | None = None, timeout: float = 60.0,
                         poll: float = 0.5, *, retry_unavailable: float | None = None
                         ) -> AsyncLease:
        """Claim ``name``, waiting up to ``timeout`` seconds while someone else holds it.

        As ``LeaseClient.wait_claim``: sleeps until just after the current lease can end (at
        most ``poll`` seconds), one claim id across attempts, an unreachable server retried
        for ``retry_unavailable`` seconds (default ``timeout``).

        Raises:
            LeaseHeldError: still held when ``timeout`` ran out.
            LeaseFinishedError: the lease finished meanwhile.
            UnavailableError: the API server did not answer within ``retry_unavailable``.
        """
        start = self.api.monotonic()
        deadline = start + timeout
        unavailable_deadline = start + (timeout if retry_unavailable is None
                                        else retry_unavailable)
        cid = new_claim_id()
        while True:
            try:
                return await self.claim(name, holder, claim_id=cid)
            except LeaseHeldError as held:
                left = deadline - self.api.monotonic()
                if left <= 0:
                    raise
                until = await self._seconds_until(held.lease_until)
                await asyncio.sleep(max(0.01, min(poll, left, until)))
            except UnavailableError:
                if self.api.monotonic() >= unavailable_deadline:
                    raise
                await asyncio.sleep(min(poll, 1.0))

    async def _seconds_until(self, until: datetime | None) -> float:
        if until is None:
            return 0.0
        return seconds_until_claimable(until, await self.margin(), await self.api.server_now())

    def hold(self, lease: AsyncLease, renew_fraction: float = RENEW_FRACTION, *,
             stop_before: float = 0.0) -> AsyncLeaseHolding:
        """Hold ``lease`` while an ``async with client.hold(lease) as holding:`` body runs.

        Renews it, and cancels the body the moment it is lost (:class:`AsyncLeaseHolding`).
        """
        return AsyncLeaseHolding(lease, renew_fraction, stop_before=stop_before)

    def pool(self, selector: str | None, *, spread: int = DEFAULT_SPREAD) -> AsyncPool:
        """The work pool of JobLeases matching the label ``selector`` in this namespace.

        ``async with client.pool("team=batch") as pool:`` lists and watches once for every
        coroutine that calls ``await pool.claim_next(...)`` (:class:`AsyncPool`).
        """
        return AsyncPool(self, selector, spread=spread)

    async def claim_next(self, selector: str | None, holder: str | None = None, *,
                         timeout: float | None = None, spread: int = DEFAULT_SPREAD,
                         until_empty: bool = False) -> AsyncLease | None:
        """Claim the next claimable JobLease of a pool; ``None`` if none was claimed in time.

        A convenience over one :meth:`pool` per selector, kept open (and shared by the
        client's coroutines) until :meth:`close`. Semantics: :meth:`AsyncPool.claim_next`.
        """
        if self._closed:
            raise RuntimeError("the AsyncLeaseClient is closed")
        pool = self._pools.get(selector)
        if pool is None:
            pool = self._pools[selector] = self.pool(selector)
        return await pool.claim_next(holder, timeout=timeout, spread=spread,
                                     until_empty=until_empty)


class AsyncLease:
    """A held JobLease, from asyncio code: its token, its end, and its holder's operations.

    The same attributes and rules as ``joblease.sdk.Lease`` (``name``, ``namespace``,
    ``uid``, ``holder``, ``token``, ``claim_id``, ``lease_until``, ``deadline``, ``loss``):
    the claim is fixed when it succeeds; renewals only move ``lease_until`` and
    ``deadline``; an operation succeeds only while that very claim is current.
    """

    def __init__(self, client: AsyncLeaseClient, holder: str, claim_id: str | None,
                 outcome: Outcome, margin: timedelta, token: FencingToken | None = None
                 ) -> None:
        self._client = client
        self.holder = holder
        obs = outcome.observed
        self.name, self.namespace, self.uid = obs.name, obs.namespace, obs.uid
        self.token: FencingToken = token or obs.status.token()
        self.claim_id = claim_id
        self.loss: LeaseLostError | None = None
        self._apply(outcome, margin, resumed=token is not None)

    @property
    def claim(self) -> Claim:
        """The claim this lease stands for, as the protocol's decisions take it."""
        return Claim(self.holder, self.token, self.claim_id)

    @property
    def generation(self) -> int:
        """The claim counter (the token's second part)."""
        return self.token.generation

    @property
    def observed(self) -> Observed:
        """The JobLease as this lease last read or wrote it."""
        return self._observed

    def remaining(self) -> float:
        """Seconds until the local deadline (negative once passed)."""
        return self.deadline - self._client.api.monotonic()

    def valid(self) -> bool:
        """Whether this holder may still produce effects: no loss, deadline not passed."""
        return self.loss is None and self.remaining() > 0

    async def renew(self) -> None:
        """Extend the lease (one conditional write from the last known version).

        No request waits past the local deadline while there is one to keep.

        Raises:
            StaleLeaseError, LeaseExpiredError, LeaseGoneError: lost (``loss`` is set).
            UnavailableError: no answer before the deadline (the lease is not lost yet).
        """
        claim = self.claim
        await self._do(lambda obs, now, m: decide_renew(obs, claim, now, m),
                       until_deadline=self.remaining() > 0)

    async def complete(self, result: str = "") -> None:
        """Record the job as done under this claim; the lease is never claimed again.

        Raises:
            StaleLeaseError, LeaseExpiredError, LeaseGoneError: refused (``loss`` is set).
            UnavailableError: no answer (retrying is safe).
        """
        claim = self.claim
        await self._do(lambda obs, now, m: decide_complete(obs, claim, result, now, m))

    async def release(self, failed: bool = False) -> None:
        """Give the lease up now (``failed`` counts an attempt).

        Raises:
            StaleLeaseError, LeaseExpiredError, LeaseGoneError: as :meth:`complete`.
            LeaseFinishedError: ``failed`` used up the last of ``maxAttempts``.
            UnavailableError: no answer (retrying is safe).
        """
        claim = self.claim
        await self._do(lambda obs, now, m: decide_release(obs, claim, now, m, failed))

    async def _do(self, decide: Callable[[Observed, ServerNow, timedelta], Transition | None],
                  until_deadline: bool = False) -> None:
        margin = await self._client.margin()
        decide_ours = for_incarnation(self.uid, lambda obs, now: decide(obs, now, margin))
        try:
            outcome = await atransact(
                self._client.store, self.namespace, self.name, decide_ours,
                observed=self._observed,
                deadline=self.deadline if until_deadline and self._held else None)
        except LeaseNotFoundError as err:
            self.loss = LeaseGoneError(self.name, self.namespace, "deleted")
            raise self.loss from err
        except LeaseLostError as err:
            self.loss = err
            raise
        if outcome.transition is not None and outcome.transition.kind == "failed":
            raise finished_error(outcome.observed, outcome.transition)
        self._apply(outcome, await self._client.margin())

    def _apply(self, outcome: Outcome, margin: timedelta, resumed: bool = False) -> None:
        """Follow an answer: the lease's end and the local deadline (``domain.holder``)."""
        self._observed = outcome.observed
        api = self._client.api
        view = standing(outcome.observed, self.claim, self.uid, resumed=resumed,
                        margin=margin, clock=api.clock, now=api.monotonic())
        self.lease_until, self.deadline, self._held = view.lease_until, view.deadline, view.held

    def __repr__(self) -> str:
        until = self.lease_until.isoformat() if self.lease_until else None
        return (f"AsyncLease({self.namespace}/{self.name}, holder={self.holder!r}, "
                f"token={self.token}, lease_until={until})")
