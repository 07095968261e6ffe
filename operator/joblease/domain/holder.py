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
* :class:`HoldingEngine`: the renewal loop, decided once — when to renew, what a refusal,
  a timeout or an unreachable server means, when the lease is lost, what the exit
  releases; :class:`HoldingFront`: what a holding answers from it. The thread and asyncio
  holdings are its drivers: they only wait and send.
* :func:`seconds_until_claimable`: how long a waiting claimer sleeps.
* :class:`HeldLease`, :class:`AsyncHeldLease`: what a holding (``sdk.hold``, ``aio.hold``)
  needs of the lease it guards — the seam that lets holdings depend on this module
  rather than on the clients, and lets tests hold a scripted lease.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseGoneError,
    LeaseLostError,
    RenewalStoppedError,
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


class HoldingEngine(Generic[LeaseT]):
    """The renewal loop of a holding, decided once: when to renew, what an answer means.

    ``joblease.sdk.Holding`` (two threads and a condition) and
    ``joblease.aio.AsyncLeaseHolding`` (a task and a timer) are its drivers: they wait and
    send the renewal; every decision is here, so the two cannot drift (they did: the
    watchdog's error, the completion, a renewal answered after the loss). It performs no
    I/O and never waits:

    * the **renewer** asks :meth:`renew_pause` how long to wait (``None``: stand down),
      then :meth:`renew_due` whether to send (a passed deadline is declared here, never
      renewed), then folds the answer in with :meth:`renewal_done`: a refusal
      (``LeaseLostError``) is the loss, any other ``Exception`` a retry after a backoff;
    * the **watchdog** asks :meth:`deadline_left`, which declares the expiry once the local
      deadline (minus ``stop_before``) has passed and otherwise says how long to sleep;
      a renewal that moved the deadline is seen when it wakes, so it needs no signal;
    * :meth:`guard_ended` is every guard's last word. The safety rule: a loop that guards
      safety fails safe. Its only exit other than a requested stop is the declared loss,
      so a guard that ends while still guarding — it returned, it was cancelled, an
      exception nobody planned for — declares ``RenewalStoppedError``, never a silent stop.

    A loss is declared once (under ``guard``: the thread holding's guards and its body race
    for it) and never cleared; the driver is then told through ``lost``.

    Args:
        lease: The held lease.
        renew_fraction: Renew after this fraction of the lease's remaining time.
        stop_before: Declare a lease that could not be renewed lost this many seconds
            before its deadline.
        lost: The driver, told once that the loss is declared: it sets its event, wakes or
            cancels what waits, and runs ``on_lost``. Its argument says whether the body
            itself declared it (``check()``, a refused completion) and raises it, so must
            not be cancelled.
        stand_down: The driver, told to stop both guards now (completion, requested stop).
        renewed: The driver, told of each successful renewal (``on_renewed``).
        guard: Held around declaring the loss (a lock for threads; none for one loop).
        log: The driver's logger (``joblease.sdk``, ``joblease.aio``): one text, two names.
    """

    def __init__(self, lease: LeaseT, renew_fraction: float, stop_before: float, *,
                 lost: Callable[[bool], None], stand_down: Callable[[], None],
                 renewed: Callable[[], None],
                 guard: AbstractContextManager[object] | None = None,
                 log: logging.Logger | None = None) -> None:
        self.lease = lease
        self.completed = False
        self.failed = False  # fail(): release as failed (an attempt) on exit
        self.stopping = False  # a requested stop: the block is exiting
        self._loss: LeaseLostError | None = None
        self._pace = RenewalPace(renew_interval(lease.remaining(), renew_fraction))
        self._stop_before = max(0.0, stop_before)
        self._lost, self._stand_down, self._renewed = lost, stand_down, renewed
        self._guard = guard if guard is not None else contextlib.nullcontext()
        self._log = log or logging.getLogger("joblease")

    @property
    def loss(self) -> LeaseLostError | None:
        """The declared loss, or ``None``: set once, never cleared."""
        return self._loss

    @property
    def renew_failures(self) -> int:
        """Renewals that failed transiently and were retried."""
        return self._pace.failures

    @property
    def stopped(self) -> bool:
        """Whether the guards stand down: a stop was requested, the job completed, or lost."""
        return self.stopping or self.completed or self._loss is not None

    def remaining(self) -> float:
        """Seconds until the lease is declared lost unless it is renewed."""
        return self.lease.remaining() - self._stop_before

    def check(self) -> None:
        """Raise the loss, declaring first what the body can see itself (:func:`loss_at_check`).

        A loss the lease met outside the holding (a direct ``renew()`` refused) is adopted
        with its reason; a deadline passed is declared here, without waiting for the
        watchdog. The body is not cancelled: the raise is the signal.
        """
        if self._loss is None:
            try:
                seen = loss_at_check(self.lease, self.remaining())
            except Exception as err:  # the body's guard fails safe too: a loss, not a bug
                self._log.exception("JobLease %s: lease guard failed: the check",
                                    self.lease.name)
                seen = RenewalStoppedError(self.lease.name, f"check of {self.lease.name!r} "
                                           f"stopped by an unexpected error: {err!r}")
            if seen is not None:
                self.declare(seen, by_check=True)
        if self._loss is not None:
            raise self._loss

    # -- the renewer --------------------------------------------------------------------

    def renew_pause(self) -> float | None:
        """Seconds to wait before the next renewal, never past the deadline; ``None``: stop."""
        return None if self.stopped else self._pace.pause(self.remaining())

    def renew_due(self) -> bool:
        """After the pause: whether to send a renewal now.

        No renewal is sent past the deadline: that is the expiry (a clock that jumped, a
        renewer that overslept), declared here, and the renewer stops.
        """
        if self.stopped:
            return False
        if self.remaining() <= 0:
            self.declare(expired_error(self.lease))
            return False
        return True

    def renewal_done(self, error: Exception | None) -> bool:
        """Fold in one renewal's outcome (``None``: it succeeded); whether the renewer goes on.

        A refusal is the loss. Any other exception is transient — an unreachable server, a
        409 storm, a lost answer, a bug in a credential plugin — and retried after a short
        backoff until one succeeds or the deadline passes. A success answered after the
        loss was declared (a hung request that came back) changes nothing: a loss is never
        cleared, and the driver is not told of a renewal.
        """
        if isinstance(error, LeaseLostError):
            self.declare(error)
            return False
        if error is not None:
            delay = self._pace.failed()
            self._log.warning("JobLease %s: renewal failed (%s: %s); retrying in %.2fs, lost "
                              "in %.2fs unless one succeeds", self.lease.name,
                              type(error).__name__, error, delay, self.remaining())
            return not self.stopped
        if self.stopped:
            return False
        self._pace.renewed()
        self._renewed()
        return True

    # -- the watchdog -------------------------------------------------------------------

    def deadline_left(self) -> float | None:
        """Seconds the watchdog sleeps before it looks again; ``None``: its watch is over.

        Declares the expiry once the deadline has passed; over too once stopped.
        """
        if self.stopped:
            return None
        left = self.remaining()
        if left > 0:
            return left
        self.declare(expired_error(self.lease))
        return None

    # -- every guard's end, the completion, the exit --------------------------------------

    def guard_ended(self, guard: str, error: BaseException | None = None, *,
                    cancelled: bool = False) -> None:
        """A guard's loop ended: unless the holding stopped guarding, that is the loss.

        Args:
            guard: Which guard ("renewal", "deadline watchdog"), for the error's text.
            error: What ended it, if it raised.
            cancelled: Whether it was cancelled (an asyncio task).
        """
        why = ("was cancelled" if cancelled else "ended unexpectedly" if error is None
               else f"stopped by an unexpected error: {error!r}")
        if self.stopped:
            if error is not None:
                self._log.error("JobLease %s: the %s %s after the holding stopped guarding",
                                self.lease.name, guard, why, exc_info=error)
            return
        self._log.error("JobLease %s: lease guard failed: the %s %s", self.lease.name, guard,
                        why, exc_info=error)
        self.declare(RenewalStoppedError(self.lease.name,
                                         f"{guard} of {self.lease.name!r} {why}"))

    def completion_done(self, error: Exception | None) -> None:
        """Fold in the completion's outcome: done, the guards stop; a refusal is the loss."""
        if isinstance(error, LeaseLostError):
            self.declare(error, by_check=True)  # the body raises it
        elif error is None:
            self.completed = True
            self._stand_down()

    def stop(self) -> None:
        """The block is exiting: stop guarding (nothing is declared any more)."""
        self.stopping = True
        self._stand_down()

    def release_on_exit(self, raised: bool) -> bool | None:
        """On the block's exit: ``None`` (nothing to release), else whether as failed.

        A completed lease is done; a lost one is not ours to release. Failed work (it
        raised, or called ``fail()``) counts an attempt.
        """
        if self.completed or self._loss is not None:
            return None
        return raised or self.failed

    def declare(self, err: LeaseLostError, by_check: bool = False) -> None:
        """Declare the loss once: record it, on the lease too, then tell the driver."""
        with self._guard:
            if self._loss is not None:
                return
            self._loss = err
            if self.lease.loss is None:
                self.lease.loss = err
        self._lost(by_check)


class HoldingFront(Generic[LeaseT]):
    """What a holding answers without waiting, read from its engine; shared by both drivers.

    A driver (``sdk.Holding``, ``aio.AsyncLeaseHolding``) builds its :class:`HoldingEngine`
    with :meth:`_engine_for`, and adds only how it waits, sends and stops.
    """

    lease: LeaseT
    _engine: HoldingEngine[LeaseT]

    def _engine_for(self, lease: LeaseT, renew_fraction: float, stop_before: float, *,
                    guard: AbstractContextManager[object] | None = None,
                    log: logging.Logger | None = None) -> HoldingEngine[LeaseT]:
        self.lease = lease
        return HoldingEngine(lease, renew_fraction, stop_before, lost=self._declared,
                             stand_down=self._stand_down, renewed=self._renewed, guard=guard,
                             log=log)

    @property
    def token(self) -> FencingToken:
        """The fencing token of the held claim (unchanged by renewals)."""
        return self.lease.token

    @property
    def completed(self) -> bool:
        """Whether :meth:`complete` succeeded (the guards then stop)."""
        return self._engine.completed

    @property
    def renew_failures(self) -> int:
        """Renewals that failed transiently and were retried."""
        return self._engine.renew_failures

    @property
    def loss(self) -> LeaseLostError | None:
        """Why the lease is lost (``StaleLeaseError``, ``LeaseExpiredError``, …), or ``None``.

        The one answer to "is this hold lost, and why": set once, by whichever guard saw the
        loss first, and never cleared. Read-only: a loss is declared, never assigned.
        """
        return self._engine.loss

    def fail(self) -> None:
        """Mark the work as failed: on exit the lease is released as failed.

        Counts an attempt towards ``spec.maxAttempts``, as an exception escaping the body
        does; use it when the work failed without raising (``joblease run`` calls it for a
        non-zero exit). No effect if the body completes the lease or it is lost.
        """
        self._engine.failed = True

    def remaining(self) -> float:
        """Seconds until this holding declares the lease lost unless it is renewed."""
        return self._engine.remaining()

    def check(self) -> None:
        """Raise the loss if the lease is lost; call it before every effect.

        Raises:
            LeaseLostError: the lease is lost (:attr:`loss`); stop producing effects.
        """
        self._engine.check()

    def on_lost(self) -> None:
        """React to the loss (called once, by whichever guard saw it); subclasses override."""

    def on_renewed(self) -> None:
        """React to a successful renewal (from the renewer); subclasses override."""

    def _declared(self, by_check: bool) -> None:
        self._lost(by_check)
        self.on_lost()

    def _renewed(self) -> None:
        self.on_renewed()

    def _lost(self, by_check: bool) -> None:
        """The driver: set its event, wake or cancel what waits.

        ``by_check``: the body declared it and raises it; cancelling the body would hit its
        exit instead.
        """

    def _stand_down(self) -> None:
        """The driver: stop both guards now (a completion, or a requested stop)."""


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
