"""A client's and a lease's operations, written once as sans-IO steps.

:class:`ClientCore` is what ``LeaseClient`` and ``AsyncLeaseClient`` share: the
namespace, the base margin, the identity, the lazy calibration flag, and the operations
``claim``, ``resume`` and ``wait_claim`` as generators of :mod:`joblease.core.steps`.
:class:`LeaseCore` is what ``Lease`` and ``AsyncLease`` share: the claim (fixed when it
is made), the lease's end, the local deadline, the loss, and ``renew``, ``complete`` and
``release`` as generators. The public classes only drive them (``drive``/``adrive``).

``wait_claim``, in numbered steps (one claim id across all attempts, so an attempt whose
answer was lost is adopted by the next one, never refused by it):

1. claim once (``transact``: read, decide with the server's time, conditional write);
2. held by someone else: sleep until its ``leaseUntil + margin`` has certainly passed on
   the server's clock, at most ``poll`` seconds (a release is noticed soon), then go to 1;
3. resting in its backoff (``LeaseNotReadyError``): sleep until ``notBefore`` has
   certainly passed — nothing but the server's clock ends a backoff — then go to 1;
4. the API server did not answer: sleep ``min(poll, 1 s)`` and go to 1, until
   ``retry_unavailable`` seconds have passed;
5. ``timeout`` ran out in 2 or 3: raise the last refusal (it names holder and end).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from joblease.core.steps import Calibrate, Sleep, Steps, Whoami
from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import (
    LeaseGoneError,
    LeaseHeldError,
    LeaseLostError,
    LeaseNotFoundError,
    LeaseNotReadyError,
)
from joblease.domain.holder import (
    IDENTITY_HOLDER,
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
from joblease.domain.token import FencingToken
from joblease.kube.api import DEFAULT_TIMEOUT, ForbiddenError, UnavailableError
from joblease.kube.identity import default_holder, new_claim_id
from joblease.kube.transact import MAX_CONFLICTS, Outcome, Read, ServerTime, transaction

L = TypeVar("L", bound="LeaseCore")
LeaseDecision = Callable[[Observed, ServerNow, timedelta], Transition | None]
MIN_SLEEP = 0.01


class Clocks(Protocol):
    """The non-I/O part of a transport the operations read: the local and server clocks."""

    clock: ServerClock

    def monotonic(self) -> float:
        """The local monotonic clock (every deadline is on it)."""


class ClientCore(Generic[L]):
    """What the sync and the asyncio client share: state and operations, without I/O.

    ``L`` is the client's lease class (``Lease`` or ``AsyncLease``), built by
    :meth:`_new_lease` at the end of the operations that return a lease.

    Attributes:
        namespace: Namespace of the JobLeases.
        base_margin: The safety margin before the clock estimate's error is added.
    """

    namespace: str
    base_margin: timedelta
    _identity: str | None
    _calibration_due: bool

    @property
    def _clocks(self) -> Clocks:
        """The transport's clocks (``KubeApi`` and ``AsyncKubeApi`` both have them)."""
        raise NotImplementedError

    def _new_lease(self, holder: str, claim_id: str | None, outcome: Outcome, now: ServerNow,
                   token: FencingToken | None = None) -> L:
        """A lease of this client's kind over ``outcome`` (the factory the operations call)."""
        raise NotImplementedError

    def _leased_steps(self, claiming: Steps[tuple[str, str, Outcome]]) -> Steps[L]:
        """Run a claim (``_claim_steps``, ``_wait_claim_steps``) and wrap it in a lease."""
        who, cid, outcome = yield from claiming
        return self._new_lease(who, cid, outcome, (yield ServerTime()))

    def _resumed_steps(self, name: str, holder: str | None, token: FencingToken,
                       claim_id: str | None, observed: Observed | None = None) -> Steps[L]:
        """A lease for a claim made elsewhere; its operations succeed only while it is current."""
        who, outcome = yield from self._resume_steps(name, holder, observed)
        return self._new_lease(who, claim_id, outcome, (yield ServerTime()), token=token)

    def _prepare_steps(self) -> Steps[None]:
        """The documented lazy step: calibrate once, before the first claim or resume."""
        if self._calibration_due:
            yield Calibrate()

    def _holder_steps(self, holder: str | None) -> Steps[str]:
        """The holder written: ``None`` → ``default_holder()``; ``"@identity"`` → our username.

        Replicas sharing one identity then share a holder name, so the holder-only policy
        cannot tell them apart; give each its own ServiceAccount, or use pod delegation.
        """
        requested = holder or default_holder()
        if requested != IDENTITY_HOLDER:
            return requested
        if self._identity is None:
            self._identity = str((yield Whoami()))
        return self._identity

    def _margin_steps(self) -> Steps[timedelta]:
        """The margin in force now: the base margin plus the clock estimate's error bound."""
        now: ServerNow = yield ServerTime()
        return self.base_margin + now.error

    def _claim_steps(self, name: str, holder: str | None, claim_id: str | None = None, *,
                     observed: Observed | None = None,
                     max_conflicts: int = MAX_CONFLICTS) -> Steps[tuple[str, str, Outcome]]:
        """Claim ``name`` once: ``(holder, claim id, outcome)``, or the refusal raised.

        ``observed`` (a recent version) saves the read and is safe when stale: the write
        is conditional, and a refusal decided from it is confirmed from a fresh read.

        Raises:
            LeaseHeldError, LeaseNotReadyError, LeaseFinishedError: not claimable now
                (a claim that found the attempts used up wrote Failed, or was refused
                the right to: ``LeaseFinishedError`` either way).
            LeaseNotFoundError: no such JobLease.
            UnavailableError: no answer; ``ContentionError`` after ``max_conflicts`` 409s.
            ApiError: refused for another reason (``ForbiddenError``, ``InvalidError``).
        """
        yield from self._prepare_steps()
        who = yield from self._holder_steps(holder)
        cid = claim_id or new_claim_id()
        decide = ClaimDecider(who, (yield from self._margin_steps()), cid)
        try:
            outcome = yield from transaction(self.namespace, name, decide,
                                             self._clocks.monotonic, observed=observed,
                                             max_conflicts=max_conflicts)
        except ForbiddenError as err:
            refusal = decide.exhaustion_refused()
            if refusal is None:
                raise
            raise refusal from err
        if outcome.transition is not None and outcome.transition.kind == "failed":
            raise finished_error(outcome.observed, outcome.transition)
        return who, cid, outcome

    def _resume_steps(self, name: str, holder: str | None, observed: Observed | None = None
                      ) -> Steps[tuple[str, Outcome]]:
        """Read ``name`` for a claim made elsewhere: ``(holder, outcome)``; nothing is written.

        Raises:
            LeaseNotFoundError: no such JobLease.
            UnavailableError: the API server did not answer.
        """
        yield from self._prepare_steps()
        who = yield from self._holder_steps(holder)
        if observed is None:
            observed = yield Read(self.namespace, name, DEFAULT_TIMEOUT)
        return who, Outcome(observed, None, self._clocks.monotonic())

    def _wait_claim_steps(self, name: str, holder: str | None, timeout: float, poll: float,
                          retry_unavailable: float | None
                          ) -> Steps[tuple[str, str, Outcome]]:
        """Claim ``name``, waiting up to ``timeout`` (steps 1-5 of the module doc).

        Raises:
            LeaseHeldError: still held when ``timeout`` ran out.
            LeaseNotReadyError: still resting when ``timeout`` ran out.
            LeaseFinishedError: the lease finished meanwhile.
            UnavailableError: the API server did not answer within ``retry_unavailable``.
        """
        mono = self._clocks.monotonic
        start = mono()
        deadline = start + timeout
        unavailable_until = start + (timeout if retry_unavailable is None
                                     else retry_unavailable)
        cid = new_claim_id()
        while True:
            try:
                return (yield from self._claim_steps(name, holder, cid))  # 1
            except LeaseHeldError as held:  # 2
                left = deadline - mono()
                if left <= 0:
                    raise  # 5
                wait = yield from self._until_steps(held.lease_until, margin=True)
                yield Sleep(max(MIN_SLEEP, min(poll, left, wait)))
            except LeaseNotReadyError as resting:  # 3
                left = deadline - mono()
                if left <= 0:
                    raise  # 5
                wait = yield from self._until_steps(resting.not_before, margin=False)
                yield Sleep(max(MIN_SLEEP, min(left, wait)))
            except UnavailableError:  # 4
                if mono() >= unavailable_until:
                    raise
                yield Sleep(min(poll, 1.0))

    def _until_steps(self, until: datetime | None, *, margin: bool) -> Steps[float]:
        """Seconds until ``until`` (plus the margin) has certainly passed on the server."""
        if until is None:
            return 0.0
        now: ServerNow = yield ServerTime()
        extra = self.base_margin + now.error if margin else timedelta(0)
        return seconds_until_claimable(until, extra, now)


class LeaseCore:
    """What ``Lease`` and ``AsyncLease`` share: the claim, its end, its deadline, its loss.

    The claim — holder, fencing token ``(epoch, generation)``, claim id and the object's
    uid — is fixed when it succeeds and never changes: renewals only move ``lease_until``
    and ``deadline``. An operation succeeds only while that very claim is current.

    Attributes:
        name: The job id (the JobLease's name).
        namespace: Its namespace.
        uid: The uid of the JobLease object claimed (a re-created one is another lease).
        holder: Who holds it.
        token: The fencing token ``(epoch, generation)`` to present to every target.
        claim_id: The random id of this claim (shown by ``joblease claim``).
        lease_until: End of the lease on the API server's clock.
        deadline: Local monotonic time after which this holder must stop.
        loss: Why the lease was lost (set once by an operation or a holding), else ``None``.
    """

    lease_until: datetime | None
    deadline: float
    _observed: Observed | None
    _held: bool

    def __init__(self, clocks: Clocks, base_margin: timedelta, holder: str,
                 claim_id: str | None, outcome: Outcome, now: ServerNow,
                 token: FencingToken | None = None) -> None:
        self._clocks = clocks
        self._base_margin = base_margin
        self.holder = holder
        obs = outcome.observed
        self.name, self.namespace, self.uid = obs.name, obs.namespace, obs.uid
        self.token: FencingToken = token or obs.status.token()
        self.claim_id = claim_id
        self.loss: LeaseLostError | None = None
        self._apply(outcome, now, resumed=token is not None)

    @property
    def claim(self) -> Claim:
        """The claim this lease stands for, as the protocol's decisions take it."""
        return Claim(self.holder, self.token, self.claim_id)

    @property
    def generation(self) -> int:
        """The claim counter (the token's second part)."""
        return self.token.generation

    @property
    def observed(self) -> Observed | None:
        """The JobLease as this lease last read or wrote it (``None``: read it first)."""
        return self._observed

    def remaining(self) -> float:
        """Seconds until the local deadline (negative once passed)."""
        return self.deadline - self._clocks.monotonic()

    def valid(self) -> bool:
        """Whether this holder may still produce effects under the lease.

        False once ``loss`` is set or the local deadline has passed. A point-in-time
        answer: an effect started now can still land after the lease ended, which only the
        target's fencing check stops.
        """
        return self.loss is None and self.remaining() > 0

    def _renew_steps(self) -> Steps[None]:
        """Extend the lease: one conditional write from the last known version.

        Bounded by the deadline while there is one to keep; past it, the server's answer
        (who holds it now) is worth the wait, and the lease is lost either way.
        """
        claim = self.claim
        return self._op_steps(lambda obs, now, m: decide_renew(obs, claim, now, m),
                              until_deadline=self.remaining() > 0)

    def _complete_steps(self, result: str) -> Steps[None]:
        claim = self.claim
        return self._op_steps(lambda obs, now, m: decide_complete(obs, claim, result, now, m))

    def _release_steps(self, failed: bool) -> Steps[None]:
        claim = self.claim
        return self._op_steps(lambda obs, now, m: decide_release(obs, claim, now, m, failed))

    def _op_steps(self, decide: LeaseDecision, until_deadline: bool = False) -> Steps[None]:
        """One holder operation through ``transaction``; a loss is recorded in ``loss``."""
        now: ServerNow = yield ServerTime()
        margin = self._base_margin + now.error
        decide_ours = for_incarnation(self.uid, lambda obs, at: decide(obs, at, margin))
        try:
            outcome = yield from transaction(
                self.namespace, self.name, decide_ours, self._clocks.monotonic,
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
        self._apply(outcome, (yield ServerTime()))

    def _apply(self, outcome: Outcome, now: ServerNow, resumed: bool = False) -> None:
        """Follow an answer: the lease's end and the local deadline (``domain.holder``)."""
        self._observed = outcome.observed
        view = standing(outcome.observed, self.claim, self.uid, resumed=resumed,
                        margin=self._base_margin + now.error, clock=self._clocks.clock,
                        now=self._clocks.monotonic())
        self.lease_until, self.deadline, self._held = view.lease_until, view.deadline, view.held

    def __repr__(self) -> str:
        until = self.lease_until.isoformat() if self.lease_until else None
        return (f"{type(self).__name__}({self.namespace}/{self.name}, holder={self.holder!r}, "
                f"token={self.token}, lease_until={until})")
