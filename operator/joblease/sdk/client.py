"""The worker SDK: claim a JobLease, renew it, complete or release it.

A :class:`Lease` is what a successful claim returns: the fencing token to hand to every
target, the server-time end of the lease, and a *local deadline* on this process's
monotonic clock after which the holder must consider the lease lost, whatever happens.
The deadline is the earliest local instant at which the API server's clock may reach
``leaseUntil - margin``, so a holder stops before anyone may take over.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from joblease.core.ops import ClientCore, LeaseCore
from joblease.core.steps import SyncPort, drive
from joblease.core.transaction import MAX_CONFLICTS, Outcome
from joblease.domain.clock import ServerNow
from joblease.domain.holder import DEFAULT_MARGIN, IDENTITY_HOLDER
from joblease.domain.lease import Observed, Phase
from joblease.domain.pool import DEFAULT_SPREAD
from joblease.domain.token import FencingToken
from joblease.kube.api import KubeApi
from joblease.kube.identity import default_holder, new_claim_id
from joblease.kube.leases import LeaseStore
from joblease.kube.transport import Transport
from joblease.sdk.pool import Pool


class LeaseClient(ClientCore["Lease"]):
    """Claims JobLeases in one namespace as one identity.

    Its operations are ``joblease.core.ops.ClientCore``'s, written once as sans-IO steps
    and shared with ``joblease.aio.AsyncLeaseClient``; this class performs them blocking
    (``joblease.core.steps.drive``) and owns what is concurrency, not protocol: the
    calibration lock and the pools' threads.

    Close it when done (``close()`` or ``with LeaseClient(...) as client:``): it closes the
    ``KubeApi`` it built itself. A ``KubeApi`` passed in as ``api`` belongs to the caller
    and is left open, because callers share one connection pool and clock estimate across
    several clients (a holder and its admin, a benchmark's workers); closing it under them
    would break the others.

    Calibration: with ``calibrate=True`` (the default) the first ``claim``, ``wait_claim``
    or ``resume`` first calls :meth:`calibrate` (about one second, once per client), so a
    worker's first lease gets a margin of milliseconds instead of about half a second.
    Call :meth:`calibrate` yourself to pay that second when you choose (at start-up, before
    recording anything); ``calibrate=False`` skips it, which only costs availability — the
    estimate's error is part of every margin, so an uncalibrated client is as safe, it just
    stops earlier and waits longer. :meth:`margin` never calibrates.

    Args:
        namespace: Namespace of the JobLeases.
        api: A ``KubeApi`` to use (and not close); by default one is built from
            ``kubeconfig``/``context`` (or in-cluster) and closed by :meth:`close`.
        kubeconfig: Path of a kubeconfig file (default ``$KUBECONFIG``, then in-cluster).
        context: The kubeconfig context (default: its current context).
        margin: Safety margin added to the server-clock error bound; see ``joblease.domain.lease``.
        calibrate: Calibrate lazily before the first claim or resume (see above).
        max_server_skew: The assumed maximum difference between API servers' clocks in an
            HA control plane (overrides ``JOBLEASE_MAX_SERVER_SKEW``; see ``docs/ha.md``).
            It widens the error bound, hence the margin, on both the holder's and the
            claimer's side.
    """

    def __init__(self, namespace: str = "default", *, api: Transport | None = None,
                 kubeconfig: str | None = None, context: str | None = None,
                 margin: timedelta = DEFAULT_MARGIN, calibrate: bool = True,
                 max_server_skew: timedelta | None = None) -> None:
        self.namespace = namespace
        self._owns_api = api is None
        self.api: Transport = api or KubeApi.from_kubeconfig(kubeconfig, context)
        if max_server_skew is not None:
            self.api.clock.max_skew = max_server_skew.total_seconds()
        self.store = LeaseStore(self.api)
        self.base_margin = margin
        self._calibration_due = calibrate
        self._calibration_lock = threading.Lock()
        self._identity: str | None = None
        self._closed = False
        self._pools: dict[str, Pool[Lease]] = {}
        self._pools_lock = threading.Lock()
        self._port = SyncPort(self.store, calibrate=self.calibrate_if_due)

    def calibrate(self) -> timedelta:
        """Narrow the server-clock estimate to about a round trip; return the error bound.

        Samples the API server's ``Date`` header around one tick of its second (up to about
        1.5 s; ``KubeApi.calibrate``). Worth it once per process before the first claim:
        the error bound is part of every margin, so a narrow one means a holder may work
        closer to ``leaseUntil`` and a claimer takes over sooner. It also cancels the lazy
        calibration of a client built with ``calibrate=True``.

        Raises:
            UnavailableError: the API server did not answer, or sent no usable ``Date``.
        """
        with self._calibration_lock:
            self._calibration_due = False
            self.api.calibrate()
        return self.api.server_now().error

    def calibrate_if_due(self) -> None:
        """The documented lazy step: calibrate once, unless done or turned off.

        What the first ``claim``, ``wait_claim``, ``resume`` or ``claim_next`` does by
        itself with ``calibrate=True``; a pool calls it before its first choice.
        """
        if self._calibration_due:
            with self._calibration_lock:
                if self._calibration_due:  # another thread may have done it meanwhile
                    self.api.calibrate()
                    self._calibration_due = False

    def margin(self) -> timedelta:
        """The margin in force now: the base margin plus the clock estimate's error bound.

        A read of the current estimate: it never calibrates. Only a client that has never
        heard from the API server sends one ``GET /version`` first, because without any
        ``Date`` header there is no estimate to read.

        Raises:
            UnavailableError: the API server did not answer, or sent no usable ``Date``.
        """
        return self.base_margin + self.api.server_now().error

    def close(self) -> None:
        """Close the ``KubeApi`` this client built (one passed in is left to its owner).

        Idempotent. Stop every :class:`Holding` over this client's leases first: a holding
        whose renewals cannot be sent declares its lease lost at the deadline.
        """
        with self._pools_lock:
            if self._closed:
                return
            self._closed = True
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        if self._owns_api:
            self.api.close()

    def __enter__(self) -> LeaseClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def _clocks(self) -> Transport:
        """The transport's clocks (local monotonic and the server-clock estimate)."""
        return self.api

    def resolve_holder(self, holder: str | None) -> str:
        """Turn a requested holder into the one written.

        ``None`` means :func:`default_holder`; ``"@identity"`` means the username the API
        server authenticates this client as — what the holder-only admission policy
        requires. Replicas sharing one identity then share a holder name, so the policy
        cannot tell them apart; give each its own ServiceAccount, or use pod delegation.
        """
        return drive(self._holder_steps(holder), self._port)

    def get(self, name: str) -> Observed:
        """Read a JobLease."""
        return self.store.get(self.namespace, name)

    def get_object(self, name: str) -> dict[str, Any]:
        """The JobLease as the API server stores it (metadata, spec, status), for displays.

        Raises:
            LeaseNotFoundError: no such JobLease.
        """
        return self.store.get_object(self.namespace, name)

    def events(self, lease: Observed) -> list[dict[str, Any]]:
        """The Kubernetes Events about this very JobLease (its name and uid), oldest first."""
        return self.store.events_for(lease)

    def list_objects(self, selector: str | None = None, *, all_namespaces: bool = False
                     ) -> list[dict[str, Any]]:
        """Every JobLease of the label ``selector`` as stored, in this namespace or in all.

        Read in pages of 500, stitched by the API server into one consistent snapshot.
        """
        namespace = None if all_namespaces else self.namespace
        return self.store.list_objects(namespace, selector)

    def count(self, selector: str | None = None, *, phase: Phase | None = None) -> int:
        """How many JobLeases of the label ``selector`` are in ``phase`` (any phase if None).

        The phase is a field selector: only the matches travel (``work --until-empty``
        counts a 10,000-job batch's Failed ones this way).
        """
        fields = None if phase is None else f"status.phase={phase.value}"
        return self.store.count(self.namespace, selector, fields)

    def server_now(self) -> ServerNow:
        """The API server's time now, as an interval (the estimate; no request if known)."""
        return self.api.server_now()

    def claim(self, name: str, holder: str | None = None, *,
              observed: Observed | None = None, claim_id: str | None = None,
              max_conflicts: int = MAX_CONFLICTS) -> Lease:
        """Claim ``name`` for ``holder`` once; raise if someone else holds it.

        ``observed`` is an optional recent version of the JobLease (from ``get``, a list or
        a watch). Deciding from it saves the read; it is safe even when stale, because the
        write is conditional on its resourceVersion: a 409 sends the claim back to a fresh
        read, and a refusal decided from it is confirmed from a fresh read.

        ``claim_id`` names this claim (default: a new random id). Retrying with the same id
        after an ``UnavailableError`` is safe: if the lost attempt's write landed, the retry
        adopts that claim instead of being refused by it.

        ``max_conflicts`` bounds the 409s absorbed by re-reading before giving up with
        ``ContentionError``; a work pool passes 1 with its cached version (its watch brings
        the news, and it chooses another lease meanwhile).

        Raises:
            LeaseHeldError: held by someone else and not expired (names holder, generation, end).
            LeaseNotReadyError: resting in its backoff after a failed attempt.
            LeaseFinishedError: Completed or Failed.
            LeaseNotFoundError: no such JobLease.
            UnavailableError: no answer (the claim may have landed: retry with ``claim_id``);
                ``ContentionError``, one of its kinds, if every attempt met a 409.
            ApiError: refused for another reason (``ForbiddenError`` by RBAC or the
                holder-only admission policy, ``InvalidError`` by the CRD's rules).
        """
        return drive(self._leased_steps(self._claim_steps(
            name, holder, claim_id, observed=observed, max_conflicts=max_conflicts)),
            self._port)

    def pool(self, selector: str, *, spread: int = DEFAULT_SPREAD,
             slots: int | None = None) -> Pool[Lease]:
        """A work pool: the JobLeases of this namespace matching the label ``selector``.

        The pool lists them once and then watches them, in a thread of its own, so that
        :meth:`Pool.claim_next <joblease.sdk.pool.Pool.claim_next>` chooses without asking
        the API server and wakes up as soon as something becomes claimable. Share one pool
        between the threads of a worker; close it when done (``with client.pool(s) as p:``).
        The identity needs ``list`` and ``watch`` on jobleases besides ``get`` and
        ``patch`` on their status. ``slots``: announce that many slots to the pool's
        dispatcher, if it has one (docs/pools.md); ``None``: not dispatched to.
        """
        return Pool(self, selector, spread=spread, slots=slots)

    def claim_next(self, selector: str, holder: str | None = None, *,
                   timeout: float | None = None, spread: int = DEFAULT_SPREAD,
                   until_empty: bool = False) -> Lease | None:
        """Claim the next claimable JobLease matching ``selector``; ``None`` after ``timeout``.

        A convenience over one :meth:`pool` per selector, kept open (and shared by the
        client's threads) until :meth:`close`. Semantics: ``Pool.claim_next`` and
        docs/sdk.md.
        """
        with self._pools_lock:
            if self._closed:
                raise RuntimeError("the LeaseClient is closed")
            pool = self._pools.get(selector)
            if pool is None:
                pool = self._pools[selector] = self.pool(selector)
        return pool.claim_next(holder, timeout=timeout, spread=spread,
                               until_empty=until_empty)

    def resume(self, name: str, holder: str | None, token: FencingToken,
               claim_id: str | None = None, *, observed: Observed | None = None) -> Lease:
        """A :class:`Lease` for a claim made elsewhere (another process, ``joblease claim``).

        What ``joblease renew/complete/release`` use, and what a worker that persisted its
        token uses after a restart: the claim is named by what the claimer printed (holder,
        token ``EPOCH/GENERATION`` and claim id). Nothing is written. Its operations succeed
        only while that very claim — holder, token and, if given, claim id — is current;
        otherwise they raise ``StaleLeaseError`` naming the current holder and token. Its
        deadline is the lease's end as now read (a lease that is not current gets a deadline
        of now, so ``valid()`` is false). Without ``claim_id`` two holders sharing a name
        and token cannot be told apart; pass it when you have it.

        With ``calibrate=True`` the client's first ``resume`` (or claim) calibrates first.

        Args:
            name: The JobLease.
            holder: The holder the claim was made for (``None``: :func:`default_holder`;
                ``"@identity"``: this client's username).
            token: The claim's fencing token.
            claim_id: The claim's id, as ``joblease claim`` prints it.
            observed: A recent version of the JobLease (a work pool's watch): saves the
                read. Safe when stale: the lease's first operation is conditional on that
                version, and a 409 sends it to a fresh read and decision.

        Raises:
            LeaseNotFoundError: no such JobLease.
            UnavailableError: the API server did not answer.
        """
        return drive(self._resumed_steps(name, holder, token, claim_id, observed), self._port)

    def wait_claim(self, name: str, holder: str | None = None, timeout: float = 60.0,
                   poll: float = 0.5, *, retry_unavailable: float | None = None) -> Lease:
        """Claim ``name``, waiting up to ``timeout`` seconds while someone else holds it.

        Sleeps until just after the current lease can end, but at most ``poll`` seconds,
        so a release is noticed quickly. Every attempt carries the same claim id, so an
        attempt whose answer was lost is adopted by the next one, never refused by it.
        ``retry_unavailable`` (default ``timeout``) bounds how long an unreachable API server
        is retried.

        A lease resting after a failed attempt (``LeaseNotReadyError``, ``spec.backoff``)
        is waited for like a held one: until its ``notBefore`` has certainly passed.

        Raises:
            LeaseHeldError: still held when ``timeout`` ran out.
            LeaseNotReadyError: still resting when ``timeout`` ran out.
            LeaseFinishedError: the lease finished meanwhile.
            UnavailableError: the API server did not answer within ``retry_unavailable``.
        """
        return drive(self._leased_steps(self._wait_claim_steps(
            name, holder, timeout, poll, retry_unavailable)), self._port)

    def _seconds_until(self, until: datetime | None, margin: bool = True) -> float:
        """Seconds until ``until`` (plus the margin) has certainly passed on the server."""
        return drive(self._until_steps(until, margin=margin), self._port)

    def _new_lease(self, holder: str, claim_id: str | None, outcome: Outcome, now: ServerNow,
                   token: FencingToken | None = None) -> Lease:
        return Lease(self, holder, claim_id, outcome, now, token=token)


class Lease(LeaseCore):
    """A held JobLease: its token, its end, and the operations its holder may perform.

    The claim it stands for — holder, fencing token ``(epoch, generation)``, claim id and
    the object's uid — is fixed when the claim succeeds and never changes: renewals only
    move ``lease_until`` and ``deadline``. A renewal, completion or release succeeds only
    while that very claim is current on the API server. The state and the operations are
    ``joblease.core.ops.LeaseCore``'s, shared with ``joblease.aio.AsyncLease``; this class
    only performs them, blocking.

    Attributes: as ``LeaseCore`` (``name``, ``namespace``, ``uid``, ``holder``, ``token``,
    ``claim_id``, ``lease_until``, ``deadline``, ``loss``, ``observed``); a loss is also
    what a :class:`~joblease.sdk.hold.Holding` over it declared, and once set it never
    clears (later operations still ask the server, so their refusals name the current claim).
    """

    def __init__(self, client: LeaseClient, holder: str, claim_id: str | None,
                 outcome: Outcome, now: ServerNow, token: FencingToken | None = None) -> None:
        self._client = client
        super().__init__(client.api, client.base_margin, holder, claim_id, outcome, now,
                         token=token)

    def renew(self) -> None:
        """Extend the lease (one conditional write from the last known version).

        No request waits past the local deadline: a hung API server ends in
        ``UnavailableError`` by then, never in a renewal that blocks beyond it. Past the
        deadline (or for a resumed claim that is not current) the server is asked without
        that bound, so the refusal names who holds the lease now.

        Raises:
            StaleLeaseError: someone else claimed it (names the current holder and token).
            LeaseExpiredError: it ran out on the server's clock before the renewal.
            LeaseGoneError: the JobLease was deleted or re-created.
            UnavailableError: no answer before the deadline (the lease is not lost yet).
        """
        drive(self._renew_steps(), self._client._port)

    def complete(self, result: str = "") -> None:
        """Record the job as done under this claim; the lease is never claimed again.

        Raises:
            StaleLeaseError: a newer claim exists; the completion is refused.
            LeaseExpiredError: the lease ran out first.
            LeaseGoneError: the JobLease was deleted or re-created.
            UnavailableError: no answer (retrying is safe: a completion whose answer was
                lost is recognised as done).
        """
        drive(self._complete_steps(result), self._client._port)

    def release(self, failed: bool = False) -> None:
        """Give the lease up so another worker can claim it now (``failed`` counts an attempt).

        Raises:
            StaleLeaseError, LeaseExpiredError, LeaseGoneError: as for :meth:`complete`.
            LeaseFinishedError: ``failed`` used up the last of ``maxAttempts``: the lease is
                now Failed.
            UnavailableError: no answer (retrying is safe, as for :meth:`complete`).
        """
        drive(self._release_steps(failed), self._client._port)


__all__ = ["DEFAULT_MARGIN", "IDENTITY_HOLDER", "FencingToken", "Lease", "LeaseClient",
           "default_holder", "new_claim_id"]
