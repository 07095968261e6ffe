"""The worker SDK: claim a JobLease, renew it, complete or release it.

A :class:`Lease` is what a successful claim returns: the fencing token to hand to every
target, the server-time end of the lease, and a *local deadline* on this process's
monotonic clock after which the holder must consider the lease lost, whatever happens.
The deadline is the earliest local instant at which the API server's clock may reach
``leaseUntil - margin``, so a holder stops before anyone may take over.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from joblease.domain.clock import ServerNow
from joblease.domain.errors import LeaseFinishedError, LeaseHeldError, LeaseLostError
from joblease.domain.lease import (
    Observed,
    Transition,
    decide_claim,
    decide_complete,
    decide_release,
    decide_renew,
)
from joblease.domain.token import FencingToken
from joblease.kube.api import KubeApi, UnavailableError
from joblease.kube.leases import LeaseStore
from joblease.kube.transact import Outcome, transact

DEFAULT_MARGIN = timedelta(milliseconds=250)


IDENTITY_HOLDER = "@identity"


def default_holder() -> str:
    """The holder used when none is given: ``$JOBLEASE_HOLDER``, else ``host-pid``."""
    return os.environ.get("JOBLEASE_HOLDER") or f"{socket.gethostname()}-{os.getpid()}"


class LeaseClient:
    """Claims JobLeases in one namespace as one identity.

    Args:
        namespace: Namespace of the JobLeases.
        api: A ``KubeApi``; by default built from ``kubeconfig``/``context`` (or in-cluster).
        margin: Safety margin added to the server-clock error bound; see ``joblease.domain.lease``.
        calibrate: Narrow the server-clock estimate to milliseconds on first use (about 1 s).
        max_server_skew: The assumed maximum difference between API servers' clocks in an
            HA control plane (overrides ``JOBLEASE_MAX_SERVER_SKEW``; see ``docs/ha.md``).
            It widens the error bound, hence the margin, on both the holder's and the
            claimer's side.
    """

    def __init__(self, namespace: str = "default", *, api: KubeApi | None = None,
                 kubeconfig: str | None = None, context: str | None = None,
                 margin: timedelta = DEFAULT_MARGIN, calibrate: bool = True,
                 max_server_skew: timedelta | None = None) -> None:
        self.namespace = namespace
        self.api = api or KubeApi.from_kubeconfig(kubeconfig, context)
        if max_server_skew is not None:
            self.api.clock.max_skew = max_server_skew.total_seconds()
        self.store = LeaseStore(self.api)
        self.base_margin = margin
        self._calibrate = calibrate
        self._identity: str | None = None

    def margin(self) -> timedelta:
        """The margin in force now: the base margin plus the clock estimate's error bound."""
        if self._calibrate:
            self._calibrate = False
            self.api.calibrate()
        now = self.api.server_now()
        return self.base_margin + now.error

    def resolve_holder(self, holder: str | None) -> str:
        """Turn a requested holder into the one written.

        ``None`` means :func:`default_holder`; ``"@identity"`` means the username the API
        server authenticates this client as — what the holder-only admission policy
        requires. Replicas sharing one identity then share a holder name, so the policy
        cannot tell them apart; give each its own ServiceAccount, or use pod delegation.
        """
        requested = holder or default_holder()
        if requested == IDENTITY_HOLDER:
            if self._identity is None:
                self._identity = self.api.whoami()
            return self._identity
        return requested

    def get(self, name: str) -> Observed:
        """Read a JobLease."""
        return self.store.get(self.namespace, name)

    def claim(self, name: str, holder: str | None = None, *,
              observed: Observed | None = None) -> Lease:
        """Claim ``name`` for ``holder`` once; raise if someone else holds it.

        ``observed`` is an optional recent version of the JobLease (from ``get``, a list or
        a watch). Deciding from it saves the read; it is safe even when stale, because the
        write is conditional on its resourceVersion: a 409 sends the claim back to a fresh
        read, and a refusal decided from it is confirmed from a fresh read.

        Raises:
            LeaseHeldError: held by someone else and not expired (names holder, generation, end).
            LeaseFinishedError: Completed or Failed.
            LeaseNotFoundError: no such JobLease.
        """
        who = self.resolve_holder(holder)
        margin = self.margin()
        outcome = transact(self.store, self.namespace, name,
                           lambda obs, now: decide_claim(obs, who, now, margin),
                           observed=observed)
        if outcome.transition is not None and outcome.transition.kind == "failed":
            raise _failed(outcome)
        return Lease(self, who, outcome)

    def wait_claim(self, name: str, holder: str | None = None, timeout: float = 60.0,
                   poll: float = 0.5) -> Lease:
        """Claim ``name``, waiting up to ``timeout`` seconds while someone else holds it.

        Sleeps until just after the current lease can end, but at most ``poll`` seconds,
        so a release is noticed quickly.

        Raises:
            LeaseHeldError: still held when ``timeout`` ran out.
            LeaseFinishedError: the lease finished meanwhile.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.claim(name, holder)
            except LeaseHeldError as held:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(max(0.01, min(poll, left, self._seconds_until(held.lease_until))))
            except UnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(poll, 1.0))

    def _seconds_until(self, until: datetime | None) -> float:
        if until is None:
            return 0.0
        margin = self.margin()
        return max(0.0, (until + margin - self.api.server_now().earliest).total_seconds())


class Lease:
    """A held JobLease: its token, its end, and the operations its holder may perform.

    Attributes:
        name: The job id (the JobLease's name).
        holder: Who holds it.
        token: The fencing token ``(epoch, generation)`` to present to every target.
        lease_until: End of the lease on the API server's clock.
        deadline: Local monotonic time after which this holder must stop (see module doc).
    """

    def __init__(self, client: LeaseClient, holder: str, outcome: Outcome) -> None:
        self._client = client
        self.holder = holder
        self.name = outcome.observed.name
        self.namespace = outcome.observed.namespace
        self.lost: BaseException | None = None
        self._apply(outcome)

    @property
    def generation(self) -> int:
        """The claim counter (the token's second part)."""
        return self.token.generation

    def remaining(self) -> float:
        """Seconds until the local deadline (negative once passed)."""
        return self.deadline - self._client.api.monotonic()

    def valid(self) -> bool:
        """Whether this holder may still produce effects under the lease."""
        return self.lost is None and self.remaining() > 0

    def renew(self) -> None:
        """Extend the lease (one conditional write from the last known version).

        Raises:
            StaleLeaseError: someone else claimed it (names the current holder and generation).
            LeaseExpiredError: it ran out on the server's clock before the renewal.
        """
        gen = self.generation
        self._do(lambda obs, now, m: decide_renew(obs, self.holder, gen, now, m))

    def complete(self, result: str = "") -> None:
        """Record the job as done under this generation; the lease is never claimed again.

        Raises:
            StaleLeaseError: a newer generation exists; the completion is refused.
            LeaseExpiredError: the lease ran out first.
        """
        gen = self.generation
        self._do(lambda obs, now, m: decide_complete(obs, self.holder, gen, result, now, m))

    def release(self, failed: bool = False) -> None:
        """Give the lease up so another worker can claim it now (``failed`` counts an attempt)."""
        gen = self.generation
        self._do(lambda obs, now, m: decide_release(obs, self.holder, gen, now, m, failed))

    def _do(self, decide: Callable[[Observed, ServerNow, timedelta], Transition]) -> None:
        margin = self._client.margin()
        try:
            outcome = transact(self._client.store, self.namespace, self.name,
                               lambda obs, now: decide(obs, now, margin),
                               observed=self._observed)
        except LeaseLostError as err:
            self.lost = err
            raise
        if outcome.transition is not None and outcome.transition.kind == "failed":
            raise _failed(outcome)
        self._apply(outcome)

    def _apply(self, outcome: Outcome) -> None:
        obs = outcome.observed
        self._observed: Observed | None = obs
        status = obs.status
        self.token = status.token()
        self.lease_until = status.lease_until
        if status.lease_until is not None:
            margin = self._client.base_margin + self._client.api.server_now().error
            self.deadline = self._client.api.clock.monotonic_at(status.lease_until - margin)
        else:
            self.deadline = self._client.api.monotonic()

    def __repr__(self) -> str:
        until = self.lease_until.isoformat() if self.lease_until else None
        return (f"Lease({self.namespace}/{self.name}, holder={self.holder!r}, "
                f"token={self.token}, lease_until={until})")


def _failed(outcome: Outcome) -> LeaseFinishedError:
    st = outcome.observed.status
    message = outcome.transition.message if outcome.transition else ""
    return LeaseFinishedError(outcome.observed.name, st.phase.value, st.generation, message)


__all__ = ["DEFAULT_MARGIN", "FencingToken", "Lease", "LeaseClient", "default_holder"]
