"""A holder's side of the protocol: when it must stop, and whether a version is its claim.

Pure, and shared by the two clients that hold leases — the thread-based SDK
(``joblease.sdk``: ``Lease``, ``Holding``) and the asyncio one (``joblease.aio``:
``AsyncLease``, ``AsyncLeaseHolding``) — so that what a holder *concludes* from an answer
is decided once. The clients only move requests and wait.

* :func:`standing`: after a claim, renewal or resume, the lease's end and the holder's
  *local deadline* — the earliest local monotonic instant at which the API server's clock
  may reach ``leaseUntil - margin`` — or the refusal to follow a token it did not claim.
* :func:`for_incarnation`: a decision that refuses another incarnation (uid) of the name.
* :func:`renew_interval`, :func:`retry_delay`, :class:`RenewalPace`: the renewal cadence
  and its backoff, as the renewer of either holding follows them.
* :func:`loss_at_check`, :func:`expired_error`: what a holding declares when it looks
  (``check()``, its watchdog) — written once because the two holdings' copies drifted.
* :class:`HoldingState`: what both holdings know and answer without waiting (the token,
  the loss, ``fail()``, the time left, the renewal pace); only their concurrency skeletons
  (two threads and a condition; a task and a timer) are written twice.
* :func:`seconds_until_claimable`: how long a waiting claimer sleeps.
* :class:`HeldLease`, :class:`AsyncHeldLease`: what a holding (``sdk.hold``, ``aio.hold``)
  needs of the lease it guards — the seam that lets holdings depend on this module
  rather than on the clients, and lets tests hold a scripted lease.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseGoneError,
    LeaseLostError,
)
from joblease.domain.lease import Claim, Observed, Phase, Transition, decide_claim
from joblease.domain.time import DEFAULT_MARGIN as DEFAULT_MARGIN  # (public: the SDK's)
from joblease.domain.time import RENEW_FRACTION as RENEW_FRACTION
from joblease.domain.time import holder_end, seconds_until_expiry
from joblease.domain.token import FencingToken

IDENTITY_HOLDER = "@identity"
MIN_RENEW_INTERVAL = 0.05
MAX_RETRY_DELAY = 1.0

Decide = Callable[[Observed, ServerNow], Transition | None]


class _LeaseState(Protocol):
    """The part of a held lease both holdings read: its claim, its end, its loss."""

    name: str
    holder: str
    token: FencingToken
    lease_until: datetime | None
    deadline: float
    loss: LeaseLostError | None

    @property
    def generation(self) -> int:
        """The claim counter (the token's second part)."""

    def remaining(self) -> float:
        """Seconds until the local deadline (negative once passed)."""

    def valid(self) -> bool:
        """Whether the holder may still produce effects under the lease."""


class HeldLease(_LeaseState, Protocol):
    """What ``joblease.sdk.Holding`` needs of the lease it guards (``Lease`` has it)."""

    def renew(self) -> None:
        """Extend the lease; raise ``LeaseLostError`` if it is lost."""

    def complete(self, result: str = "") -> None:
        """Record the job as done under this claim."""

    def release(self, failed: bool = False) -> None:
        """Give the lease up (``failed`` counts an attempt)."""


class AsyncHeldLease(_LeaseState, Protocol):
    """What ``joblease.aio.AsyncLeaseHolding`` needs of its lease (``AsyncLease`` has it)."""

    async def renew(self) -> None:
        """Extend the lease; raise ``LeaseLostError`` if it is lost."""

    async def complete(self, result: str = "") -> None:
        """Record the job as done under this claim."""

    async def release(self, failed: bool = False) -> None:
        """Give the lease up (``failed`` counts an attempt)."""


@dataclass(frozen=True)
class Standing:
    """What a holder may rely on after an answer about its claim.

    Attributes:
        lease_until: The lease's end on the server's clock, as stored.
        deadline: Local monotonic time after which the holder must stop.
        held: Whether the claim is current: only then are the holder's requests bounded
            by ``deadline`` (past it, the server's answer names who holds the lease now).
    """

    lease_until: datetime | None
    deadline: float
    held: bool


def standing(observed: Observed, claim: Claim, uid: str, *, resumed: bool,
             margin: timedelta, clock: ServerClock, now: float) -> Standing:
    """Follow one answer about the holder's claim.

    A resumed claim (made elsewhere, named by holder, token and claim id) that is not the
    current one gets a deadline of ``now`` and ``held=False``: every operation then asks
    the server, which says why. A held claim's deadline is the earliest local instant at
    which the server's clock may reach ``leaseUntil - margin`` (``ServerClock.monotonic_at``,
    drift included); a claim that is no longer Held (completed, released) ends ``now``.

    Args:
        observed: The JobLease as just read or written.
        claim: The claim the holder holds (fixed when it was made).
        uid: The uid of the JobLease object claimed.
        resumed: Whether ``observed`` was read for a claim made elsewhere.
        margin: The base margin plus the clock estimate's current error bound.
        clock: The server-clock estimate.
        now: The local monotonic time now.

    Raises:
        LeaseGoneError: the answer carries another token or uid than the claim's. The
            decisions never lead here; a guard, not a path: a held lease must never turn
            into a token it did not claim (issue 14, item 1).
    """
    status = observed.status
    if resumed and not (status.phase is Phase.HELD and status.token() == claim.token
                        and status.holder == claim.holder
                        and claim.claim_id in (None, status.claim_id)):
        return Standing(status.lease_until, now, held=False)
    if status.token() != claim.token or observed.uid != uid:
        raise LeaseGoneError(observed.name, observed.namespace,
                             f"the server returned token {status.token()} for a lease "
                             f"held as {claim.token}")
    if status.lease_until is not None and status.phase is Phase.HELD:
        return Standing(status.lease_until,
                        clock.monotonic_at(holder_end(status.lease_until, margin)), held=True)
    return Standing(status.lease_until, now, held=True)


def for_incarnation(uid: str, decide: Decide) -> Decide:
    """``decide``, refusing any other incarnation (uid) of the JobLease than the one claimed.

    A JobLease deleted and re-created under the same name is another lease: its tokens are
    not this holder's, whatever the name says.
    """

    def decide_ours(obs: Observed, now: ServerNow) -> Transition | None:
        if obs.uid != uid:
            raise LeaseGoneError(obs.name, obs.namespace,
                                 f"re-created (uid {uid} is now {obs.uid})")
        return decide(obs, now)

    return decide_ours


@dataclass
class ClaimDecider:
    """``decide_claim`` for one claim, remembering its last decision.

    Why remember: a claim that finds the attempts used up decides to write ``Failed``
    without raising the generation, and under the chart's holder-only admission policy
    only the holder (or the operator) may write that, so the write comes back 403. For the
    claimer that refusal means exactly what the decision meant — the lease cannot be claimed
    again — and :meth:`exhaustion_refused` turns it into that ``LeaseFinishedError``
    instead of a ``ForbiddenError`` that would stop a work pool. The operator records
    ``Failed`` on its next pass (simulator finding, docs/safety.md).
    """

    holder: str
    margin: timedelta
    claim_id: str | None
    last: Transition | None = None
    observed: Observed | None = None
    reassign: bool = False  # a dispatcher taking back an unadopted claim (decide_claim)

    def __call__(self, obs: Observed, now: ServerNow) -> Transition | None:
        """Decide (``transact``'s step 3) and remember the decision and what it read."""
        self.observed = obs
        self.last = decide_claim(obs, self.holder, now, self.margin, self.claim_id,
                                 reassign=self.reassign)
        return self.last

    def exhaustion_refused(self) -> LeaseFinishedError | None:
        """The error for a refused write that only recorded used-up attempts (else ``None``)."""
        if self.last is None or self.last.kind != "failed" or self.observed is None:
            return None
        st = self.observed.status
        return LeaseFinishedError(
            self.observed.name, st.phase.value, st.token(),
            f"{self.last.message}; this identity may not record it (holder-only admission "
            "policy): the operator marks it Failed")


def finished_error(observed: Observed, transition: Transition) -> LeaseFinishedError:
    """The error for a write that turned the lease Failed (``maxAttempts`` used up)."""
    status = observed.status
    return LeaseFinishedError(observed.name, status.phase.value, status.token(),
                              transition.message, written=observed)


def renew_interval(remaining: float, fraction: float = RENEW_FRACTION) -> float:
    """Seconds between renewals: ``fraction`` of the time the lease has left (at least 50 ms).

    The holding's form of ``joblease.domain.time.renew_at``: a holding counts on its own
    monotonic clock from a renewal, when the time left is the whole lease, so ``fraction``
    of what is left is the same point as ``fraction`` of the duration on the server's clock.
    """
    return max(MIN_RENEW_INTERVAL, remaining * fraction)


def retry_delay(failures: int) -> float:
    """Seconds before retrying a renewal after ``failures`` transient failures in a row.

    Short (50 ms doubling to 1 s): the lease's remaining time, not the server's health, is
    what is scarce; the watchdog bounds the whole episode at the deadline anyway.
    """
    return min(MAX_RETRY_DELAY, 0.05 * 2.0 ** min(failures, 5))


@dataclass
class RenewalPace:
    """When a holding's renewer tries next: one schedule for the thread and the task.

    The full interval after a success, a backoff after a transient failure, and never a
    wait past the deadline.

    Attributes:
        interval: Seconds between successful renewals (:func:`renew_interval`).
        failures: Transient failures so far (``renew_failures`` of the holdings).
        delay: The wait before the next attempt, before the deadline's bound.
    """

    interval: float
    failures: int = 0
    delay: float = field(init=False)

    def __post_init__(self) -> None:
        self.delay = self.interval

    def pause(self, remaining: float) -> float:
        """Seconds to wait before the next attempt, given ``remaining`` before the deadline."""
        return max(0.0, min(self.delay, remaining))

    def renewed(self) -> None:
        """A renewal succeeded: the next one after the full interval."""
        self.delay = self.interval

    def failed(self) -> float:
        """A renewal failed transiently: count it and back off; returns the new delay."""
        self.failures += 1
        self.delay = retry_delay(self.failures)
        return self.delay


LeaseT = TypeVar("LeaseT", bound=_LeaseState)


class HoldingState(Generic[LeaseT]):
    """The state of a holding that needs no waiting, shared by both holdings.

    ``joblease.sdk.Holding`` (threads) and ``joblease.aio.AsyncLeaseHolding`` (a task and a
    timer) add how they wait, renew and stop; what they know and answer is here, once.

    Args:
        lease: The held lease.
        renew_fraction: Renew after this fraction of the lease's remaining time.
        stop_before: Declare a lease that could not be renewed lost this many seconds
            before its deadline.
    """

    def __init__(self, lease: LeaseT, renew_fraction: float, stop_before: float) -> None:
        self.lease = lease
        self.completed = False
        self._loss: LeaseLostError | None = None
        self._failed = False  # fail(): release as failed (an attempt) on exit
        self._pace = RenewalPace(renew_interval(lease.remaining(), renew_fraction))
        self._stop_before = max(0.0, stop_before)

    @property
    def token(self) -> FencingToken:
        """The fencing token of the held claim (unchanged by renewals)."""
        return self.lease.token

    @property
    def renew_failures(self) -> int:
        """Renewals that failed transiently and were retried."""
        return self._pace.failures

    @property
    def loss(self) -> LeaseLostError | None:
        """Why the lease is lost (``StaleLeaseError``, ``LeaseExpiredError``, …), or ``None``.

        The one answer to "is this hold lost, and why": set once, by whichever guard saw the
        loss first, and never cleared. Read-only: a loss is declared, never assigned.
        """
        return self._loss

    def fail(self) -> None:
        """Mark the work as failed: on exit the lease is released as failed.

        Counts an attempt towards ``spec.maxAttempts``, as an exception escaping the body
        does; use it when the work failed without raising (``joblease run`` calls it for a
        non-zero exit). No effect if the body completes the lease or it is lost.
        """
        self._failed = True

    def remaining(self) -> float:
        """Seconds until this holding declares the lease lost unless it is renewed."""
        return self.lease.remaining() - self._stop_before

    def _seen_at_check(self) -> LeaseLostError | None:
        """The loss a ``check()`` must declare now (:func:`loss_at_check`), or ``None``."""
        return loss_at_check(self.lease, self.remaining())

    def _expired(self) -> LeaseExpiredError:
        return expired_error(self.lease)


def expired_error(lease: _LeaseState) -> LeaseExpiredError:
    """The loss a holding declares once its local deadline passed without a renewal."""
    return LeaseExpiredError(lease.name, lease.holder, lease.token, lease.lease_until)


def loss_at_check(lease: _LeaseState, remaining: float) -> LeaseLostError | None:
    """What a holding's ``check()`` must declare now, or ``None``.

    The loss the lease met outside the holding (a direct ``renew()`` refused) keeps its
    reason; otherwise a lease no longer valid, or no time ``remaining`` for the holding
    (``stop_before`` taken off), is an expiry.
    """
    if lease.loss is not None:
        return lease.loss
    if not lease.valid() or remaining <= 0:
        return expired_error(lease)
    return None


def seconds_until_claimable(lease_until: datetime | None, margin: timedelta, now: ServerNow
                            ) -> float:
    """Seconds until a lease held until ``lease_until`` may certainly be taken over.

    The earliest possible server time must pass ``leaseUntil + margin``; ``0`` when that
    has already happened, or when the end is unknown.
    """
    if lease_until is None:
        return 0.0
    return max(0.0, seconds_until_expiry(lease_until, margin, now))
