"""The asyncio worker client: claim a JobLease, renew it, complete or release it — awaited.

The same protocol as ``joblease.sdk`` with nothing decided twice: the operations are
``joblease.core.ops``' (``ClientCore``, ``LeaseCore``), written once as sans-IO steps that
this module only awaits (``joblease.core.steps.adrive``), so the two clients cannot drift
apart. What differs is only how the requests travel (``AsyncKubeApi``, aiohttp) and how
waiting is done (``asyncio.sleep``, never ``time.sleep``): no call here blocks the event
loop, and no thread is started per lease.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import TracebackType
from typing import Any

from joblease.aio.hold import AsyncLeaseHolding
from joblease.aio.pool import AsyncPool
from joblease.core.asteps import AsyncPort, adrive
from joblease.core.ops import ClientCore, LeaseCore
from joblease.core.transaction import MAX_CONFLICTS, Outcome
from joblease.domain.clock import ServerNow
from joblease.domain.holder import DEFAULT_MARGIN, RENEW_FRACTION
from joblease.domain.lease import Observed, Phase
from joblease.domain.pool import DEFAULT_SPREAD
from joblease.domain.token import FencingToken
from joblease.kube.aioapi import AsyncKubeApi
from joblease.kube.aioleases import AsyncLeaseStore
from joblease.kube.transport import AsyncTransport


class AsyncLeaseClient(ClientCore["AsyncLease"]):
    """Claims JobLeases in one namespace as one identity, from asyncio code.

    Its operations are ``joblease.core.ops.ClientCore``'s, shared with ``LeaseClient``;
    this class awaits them and owns what is concurrency: the calibration lock and pools.

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

    def __init__(self, namespace: str = "default", *, api: AsyncTransport | None = None,
                 kubeconfig: str | None = None, context: str | None = None,
                 margin: timedelta = DEFAULT_MARGIN, calibrate: bool = True,
                 max_server_skew: timedelta | None = None) -> None:
        self.namespace = namespace
        self._owns_api = api is None
        self.api: AsyncTransport = api or AsyncKubeApi(kubeconfig=kubeconfig, context=context)
        if max_server_skew is not None:
            self.api.clock.max_skew = max_server_skew.total_seconds()
        self.store = AsyncLeaseStore(self.api)
        self.base_margin = margin
        self._calibration_due = calibrate
        self._calibration_lock = asyncio.Lock()
        self._identity: str | None = None
        self._pools: dict[str | None, AsyncPool[AsyncLease]] = {}
        self._closed = False
        self._port = AsyncPort(self.store, calibrate=self.calibrate_if_due)

    async def calibrate(self) -> timedelta:
        """Narrow the server-clock estimate to about a round trip; return the error bound.

        Raises:
            UnavailableError: the API server did not answer, or sent no usable ``Date``.
        """
        async with self._calibration_lock:
            self._calibration_due = False
            await self.api.calibrate()
        return (await self.api.server_now()).error

    async def calibrate_if_due(self) -> None:
        """The documented lazy step: calibrate once, unless done or turned off.

        What the first ``claim``, ``wait_claim``, ``resume`` or ``claim_next`` does by
        itself with ``calibrate=True``; a pool calls it before its first choice.
        """
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

    @property
    def _clocks(self) -> AsyncTransport:
        """The transport's clocks (local monotonic and the server-clock estimate)."""
        return self.api

    async def resolve_holder(self, holder: str | None) -> str:
        """The holder written: ``None`` → ``default_holder()``; ``"@identity"`` → our username."""
        return await adrive(self._holder_steps(holder), self._port)

    async def get(self, name: str) -> Observed:
        """Read a JobLease.

        Raises:
            LeaseNotFoundError: no such JobLease.
        """
        return await self.store.get(self.namespace, name)

    async def get_object(self, name: str) -> dict[str, Any]:
        """The JobLease as the API server stores it (metadata, spec, status), for displays.

        Raises:
            LeaseNotFoundError: no such JobLease.
        """
        return await self.store.get_object(self.namespace, name)

    async def events(self, lease: Observed) -> list[dict[str, Any]]:
        """The Kubernetes Events about this very JobLease (its name and uid), oldest first."""
        return await self.store.events_for(lease)

    async def list_objects(self, selector: str | None = None, *, all_namespaces: bool = False
                           ) -> list[dict[str, Any]]:
        """Every JobLease of the label ``selector`` as stored, in this namespace or in all."""
        namespace = None if all_namespaces else self.namespace
        return await self.store.list_objects(namespace, selector)

    async def count(self, selector: str | None = None, *, phase: Phase | None = None) -> int:
        """How many JobLeases of the label ``selector`` are in ``phase`` (any phase if None)."""
        fields = None if phase is None else f"status.phase={phase.value}"
        return len(await self.store.list_objects(self.namespace, selector,
                                                 field_selector=fields))

    async def server_now(self) -> ServerNow:
        """The API server's time now, as an interval (the estimate; no request if known)."""
        return await self.api.server_now()

    async def claim(self, name: str, holder: str | None = None, *,
                    observed: Observed | None = None, claim_id: str | None = None,
                    max_conflicts: int = MAX_CONFLICTS) -> AsyncLease:
        """Claim ``name`` for ``holder`` once; raise if someone else holds it.

        As ``LeaseClient.claim`` (the same operation, ``ClientCore._claim_steps``):
        ``observed`` (a recent version) saves the read and is safe when stale; the same
        ``claim_id`` on a retry after ``UnavailableError`` adopts a claim whose answer was
        lost; ``max_conflicts`` bounds the 409s absorbed by re-reading.

        Raises:
            LeaseHeldError: held by someone else and not expired.
            LeaseNotReadyError: resting in its backoff after a failed attempt.
            LeaseFinishedError: Completed or Failed.
            LeaseNotFoundError: no such JobLease.
            UnavailableError: no answer (retry with ``claim_id``); ``ContentionError``.
            ApiError: refused for another reason (``ForbiddenError``, ``InvalidError``).
        """
        return await adrive(self._leased_steps(self._claim_steps(
            name, holder, claim_id, observed=observed, max_conflicts=max_conflicts)),
            self._port)

    async def resume(self, name: str, holder: str | None, token: FencingToken,
                     claim_id: str | None = None, *, observed: Observed | None = None
                     ) -> AsyncLease:
        """An :class:`AsyncLease` for a claim made elsewhere (as ``LeaseClient.resume``).

        Nothing is written; the lease's operations succeed only while that very claim is
        current, and a claim that is not current gets a deadline of now. ``observed``: a
        recent version, which saves the read (safe when stale: the first operation is
        conditional on it).

        Raises:
            LeaseNotFoundError: no such JobLease.
            UnavailableError: the API server did not answer.
        """
        return await adrive(self._resumed_steps(name, holder, token, claim_id, observed),
                            self._port)

    async def wait_claim(self, name: str, holder: str | None = None, timeout: float = 60.0,
                         poll: float = 0.5, *, retry_unavailable: float | None = None
                         ) -> AsyncLease:
        """Claim ``name``, waiting up to ``timeout`` seconds while someone else holds it.

        As ``LeaseClient.wait_claim`` (the same operation, ``ClientCore._wait_claim_steps``):
        sleeps until just after the current lease can end (at most ``poll`` seconds) or
        until a backoff's ``notBefore`` has certainly passed, one claim id across
        attempts, an unreachable server retried for ``retry_unavailable`` seconds.

        Raises:
            LeaseHeldError: still held when ``timeout`` ran out.
            LeaseNotReadyError: still resting when ``timeout`` ran out.
            LeaseFinishedError: the lease finished meanwhile.
            UnavailableError: the API server did not answer within ``retry_unavailable``.
        """
        return await adrive(self._leased_steps(self._wait_claim_steps(
            name, holder, timeout, poll, retry_unavailable)), self._port)

    def _new_lease(self, holder: str, claim_id: str | None, outcome: Outcome, now: ServerNow,
                   token: FencingToken | None = None) -> AsyncLease:
        return AsyncLease(self, holder, claim_id, outcome, now, token=token)

    def hold(self, lease: AsyncLease, renew_fraction: float = RENEW_FRACTION, *,
             stop_before: float = 0.0) -> AsyncLeaseHolding:
        """Hold ``lease`` while an ``async with client.hold(lease) as holding:`` body runs.

        Renews it, and cancels the body the moment it is lost (:class:`AsyncLeaseHolding`).
        """
        return AsyncLeaseHolding(lease, renew_fraction, stop_before=stop_before)

    def pool(self, selector: str | None, *, spread: int = DEFAULT_SPREAD,
             slots: int | None = None) -> AsyncPool[AsyncLease]:
        """The work pool of JobLeases matching the label ``selector`` in this namespace.

        ``async with client.pool("team=batch") as pool:`` lists and watches once for every
        coroutine that calls ``await pool.claim_next(...)`` (:class:`AsyncPool`).
        """
        return AsyncPool(self, selector, spread=spread, slots=slots)

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


class AsyncLease(LeaseCore):
    """A held JobLease, from asyncio code: its token, its end, and its holder's operations.

    The same state and operations as ``joblease.sdk.Lease`` (``joblease.core.ops.LeaseCore``:
    ``name``, ``namespace``, ``uid``, ``holder``, ``token``, ``claim_id``, ``lease_until``,
    ``deadline``, ``loss``), awaited: the claim is fixed when it succeeds; renewals only
    move ``lease_until`` and ``deadline``; an operation succeeds only while that very claim
    is current.
    """

    def __init__(self, client: AsyncLeaseClient, holder: str, claim_id: str | None,
                 outcome: Outcome, now: ServerNow, token: FencingToken | None = None
                 ) -> None:
        self._client = client
        super().__init__(client.api, client.base_margin, holder, claim_id, outcome, now,
                         token=token)

    async def renew(self) -> None:
        """Extend the lease (one conditional write from the last known version).

        No request waits past the local deadline while there is one to keep.

        Raises:
            StaleLeaseError, LeaseExpiredError, LeaseGoneError: lost (``loss`` is set).
            UnavailableError: no answer before the deadline (the lease is not lost yet).
        """
        await adrive(self._renew_steps(), self._client._port)

    async def complete(self, result: str = "") -> None:
        """Record the job as done under this claim; the lease is never claimed again.

        Raises:
            StaleLeaseError, LeaseExpiredError, LeaseGoneError: refused (``loss`` is set).
            UnavailableError: no answer (retrying is safe).
        """
        await adrive(self._complete_steps(result), self._client._port)

    async def release(self, failed: bool = False) -> None:
        """Give the lease up now (``failed`` counts an attempt).

        Raises:
            StaleLeaseError, LeaseExpiredError, LeaseGoneError: as :meth:`complete`.
            LeaseFinishedError: ``failed`` used up the last of ``maxAttempts``.
            UnavailableError: no answer (retrying is safe).
        """
        await adrive(self._release_steps(failed), self._client._port)
