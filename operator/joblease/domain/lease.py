"""The JobLease protocol: which transitions are allowed, decided without any I/O.

What it guarantees
------------------
* **At most one holder per generation.** Every transition is decided from one observed
  version of the object and written with that ``resourceVersion`` as a precondition
  (``joblease.core.transaction``): of concurrent writers exactly one succeeds, the others get
  409 and decide again from a fresh read. A claim always raises ``generation`` by one, so a
  generation is never handed out twice.
* **Tokens only grow.** ``(epoch, generation)`` (``joblease.domain.token``) never decreases and
  never repeats, also across deletion and re-creation of a JobLease; the API server itself
  refuses a status write that lowers the generation or changes the holder without raising it
  by exactly one (CEL rules in the CRD).
* **Renew, complete and release need the current claim.** They succeed only while the holder,
  the whole token ``(epoch, generation)`` and, when the caller knows it, the claim id match;
  otherwise ``StaleLeaseError`` names the current holder and token. Holders that share a
  name (replicas of one ServiceAccount) therefore never act on each other's claims, and a
  token of a deleted incarnation never matches its successor's.
* **A retry recognises its own write.** A claim carries a random ``claimId``; when a
  response is lost and the claim is retried with the same id, the retry adopts the claim
  it already made instead of being refused by it. A completion or release whose response
  was lost is recognised the same way, so the retry reports success.
* **Expiry is judged on the API server's clock**, estimated with an error bound
  (``joblease.domain.clock``), never on a worker's wall clock. A claim over an unexpired
  holder waits until the *earliest* possible server time has passed ``leaseUntil`` plus the
  safety margin; the holder treats its lease as lost ``margin`` before ``leaseUntil`` counted
  on its own monotonic clock from when it *sent* the write, assuming its clock runs slow by
  the drift bound for the whole lease (``ServerClock.monotonic_at``). With ``margin`` at least
  the clock estimate's error, the two windows never overlap; docs/safety.md states the
  assumptions with their numbers.
* **Hostile timestamps are tolerated.** Every time field is parsed by :func:`parse_time`,
  which accepts everything RFC 3339 allows and clamps what Python cannot represent, so no
  stored value can make a decision raise (the CRD also bounds them).
* **Completed stays completed.** A completed lease is never claimed again, and its completion
  record is immutable.

What it does not guarantee
--------------------------
* **Not exactly-once.** A lease is temporary ownership. A holder that pauses (GC, SIGSTOP,
  a slow disk) or whose request sits in a network buffer may still act after its lease
  ended. Timing cannot prevent that; only the *target* can, by refusing a token lower than
  one it has already accepted (``joblease.fencing``). Every effect a lease guards must be
  fenced, or be idempotent.
* **Not liveness under a broken clock.** If the server's clock jumps, expiry may come late
  or early; fencing still holds because it depends on generations, not on time.

Everything here is pure: the caller passes the observed object and the server time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from joblease.domain.clock import ServerNow
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseHeldError,
    LeaseNotReadyError,
    StaleLeaseError,
)

# The time rules live in ``joblease.domain.time``. The ``as`` names stay importable from
# here because modules of other branches still import them from this one (the reconciler,
# pod delegation, core/presence.py, pod/downward.py, bench/, tests/sim); new code imports
# ``joblease.domain.time``.
from joblease.domain.time import EARLIEST_TIME as EARLIEST_TIME
from joblease.domain.time import LATEST_TIME as LATEST_TIME
from joblease.domain.time import add_time as add_time
from joblease.domain.time import clamp_time as clamp_time
from joblease.domain.time import expiry_at, expiry_due, format_time, past_holder_end
from joblease.domain.time import parse_time as parse_time
from joblease.domain.token import FencingToken

DEFAULT_DURATION_SECONDS = 30
MAX_RESULT_LENGTH = 1024


class Phase(StrEnum):
    """Where a JobLease is in its life."""

    AVAILABLE = "Available"
    HELD = "Held"
    EXPIRED = "Expired"
    COMPLETED = "Completed"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        """Completed and Failed are terminal: no claim ever succeeds again."""
        return self in (Phase.COMPLETED, Phase.FAILED)


@dataclass(frozen=True)
class Backoff:
    """How long a lease rests after an attempt ended without completion (``spec.backoff``).

    Why on the lease and not in the worker: every worker of a pool, and the operator, must
    agree on when a failed job may run again, or the fastest worker retries it at once.
    """

    initial_seconds: int = 10
    factor: float = 2.0
    max_seconds: int = 300

    def delay(self, attempts: int) -> timedelta:
        """The rest after the ``attempts``-th failed attempt: initial * factor**(n-1), capped.

        In closed form, for every count: a loop bounded to 64 steps stopped the growth there,
        far below the cap for a factor near 1 (bug 18). A count whose power overflows a
        float is past any cap (the schema's factor is at least 1).
        """
        if attempts <= 0 or self.initial_seconds <= 0:
            return timedelta(0)
        try:
            seconds = self.initial_seconds * self.factor ** (attempts - 1)
        except OverflowError:
            seconds = float(self.max_seconds)
        return timedelta(seconds=min(seconds, float(self.max_seconds)))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Backoff | None:
        """Read ``spec.backoff`` (``None`` when absent: retries may start at once).

        An empty object means the defaults, as the API server's schema defaulting stores it
        (``backoff: {}`` is a backoff of 10 s doubling to 300 s, not none at all).
        """
        if data is None:
            return None
        return cls(initial_seconds=int(data.get("initialSeconds", 10)),
                   factor=float(data.get("factor", 2.0)),
                   max_seconds=int(data.get("maxSeconds", 300)))


@dataclass(frozen=True)
class LeaseSpec:
    """The user's wishes (``spec``); validated by the API server's schema before we see it."""

    lease_duration_seconds: int = DEFAULT_DURATION_SECONDS
    ttl_seconds_after_finished: int | None = None
    max_attempts: int | None = None
    pod_delegation: bool = False
    delegation_service_account: str | None = None
    priority: int = 0
    backoff: Backoff | None = None
    dispatch_to: tuple[str, ...] | None = None  # spec.dispatch: None unless enabled

    def may_dispatch_to(self, namespace: str, holder: str) -> bool:
        """Whether a dispatcher may claim this job for ``holder`` (``spec.dispatch``).

        Only when the job opted in, and only for a ServiceAccount it names, in its own
        namespace: the same rule the chart's dispatch admission policy enforces, so a
        dispatcher never writes a claim the API server would refuse.
        """
        return self.dispatch_to is not None and any(
            holder == f"system:serviceaccount:{namespace}:{name}" for name in self.dispatch_to)

    def retry_delay(self, attempts: int) -> timedelta:
        """The backoff after ``attempts`` failed attempts (zero without ``spec.backoff``)."""
        return self.backoff.delay(attempts) if self.backoff else timedelta(0)

    @property
    def duration(self) -> timedelta:
        """The lease duration as a timedelta."""
        return timedelta(seconds=self.lease_duration_seconds)

    def to_dict(self) -> dict[str, Any]:
        """``spec`` as :meth:`from_dict` reads it back (what a dispatcher's proposal carries)."""
        spec: dict[str, Any] = {"leaseDurationSeconds": self.lease_duration_seconds,
                                "priority": self.priority}
        if self.ttl_seconds_after_finished is not None:
            spec["ttlSecondsAfterFinished"] = self.ttl_seconds_after_finished
        if self.max_attempts is not None:
            spec["maxAttempts"] = self.max_attempts
        if self.pod_delegation or self.delegation_service_account:
            spec["podDelegation"] = {"enabled": self.pod_delegation, **(
                {"serviceAccountName": self.delegation_service_account}
                if self.delegation_service_account else {})}
        if self.backoff is not None:
            spec["backoff"] = {"initialSeconds": self.backoff.initial_seconds,
                               "factor": self.backoff.factor,
                               "maxSeconds": self.backoff.max_seconds}
        if self.dispatch_to is not None:
            spec["dispatch"] = {"enabled": True, "serviceAccountNames": list(self.dispatch_to)}
        return spec

    @classmethod
    def from_dict(cls, spec: dict[str, Any] | None) -> LeaseSpec:
        """Read ``spec`` as stored by the API server (defaults already applied there)."""
        spec = spec or {}
        delegation = spec.get("podDelegation") or {}
        dispatch = spec.get("dispatch") or {}
        return cls(
            lease_duration_seconds=int(spec.get("leaseDurationSeconds", DEFAULT_DURATION_SECONDS)),
            ttl_seconds_after_finished=_opt_int(spec.get("ttlSecondsAfterFinished")),
            max_attempts=_opt_int(spec.get("maxAttempts")),
            pod_delegation=bool(delegation.get("enabled", False)),
            delegation_service_account=delegation.get("serviceAccountName") or None,
            priority=int(spec.get("priority") or 0),
            backoff=Backoff.from_dict(spec.get("backoff")),
            dispatch_to=tuple(dispatch.get("serviceAccountNames") or ())
            if dispatch.get("enabled") else None,
        )


@dataclass(frozen=True)
class Completion:
    """The record of the one accepted completion."""

    generation: int
    holder: str
    time: datetime
    result: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Serialize as stored in ``status.completion``."""
        return {"generation": self.generation, "holder": self.holder,
                "time": format_time(self.time), "result": self.result}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Completion:
        """Parse ``status.completion``."""
        return cls(int(data["generation"]), str(data["holder"]), parse_time(data["time"]),
                   str(data.get("result", "")))


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    """``status`` of a JobLease. ``generation`` is the fencing token's claim counter.

    Slotted, like :class:`Observed`: the operator keeps one per JobLease (issue 28), and an
    instance ``__dict__`` was 296 bytes of each.
    """

    phase: Phase = Phase.AVAILABLE
    holder: str | None = None
    generation: int = 0
    epoch: int | None = None
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_until: datetime | None = None
    attempts: int = 0
    finish_time: datetime | None = None
    completion: Completion | None = None
    conditions: tuple[dict[str, Any], ...] = field(default=())
    claim_id: str | None = None
    not_before: datetime | None = None
    reason: str | None = None
    message: str | None = None

    def token(self) -> FencingToken:
        """The current fencing token."""
        return FencingToken(self.epoch or 0, self.generation)

    def to_dict(self) -> dict[str, Any]:
        """Serialize as stored; absent values become ``None`` so a merge patch removes them."""
        return {
            "phase": self.phase.value,
            "holder": self.holder,
            "generation": self.generation,
            "epoch": self.epoch,
            "acquireTime": _fmt(self.acquire_time),
            "renewTime": _fmt(self.renew_time),
            "leaseUntil": _fmt(self.lease_until),
            "attempts": self.attempts,
            "finishTime": _fmt(self.finish_time),
            "completion": self.completion.to_dict() if self.completion else None,
            "conditions": list(self.conditions),
            "claimId": self.claim_id,
            "notBefore": _fmt(self.not_before),
            "reason": self.reason,
            "message": self.message,
        }

    def changes_since(self, old: LeaseStatus) -> dict[str, Any]:
        """The fields of :meth:`to_dict` that differ from ``old``'s: a minimal merge patch.

        Why: a renewal then sends two timestamps instead of the whole status (less to send
        and to parse; the renew benchmark showed the payload was not what bounded its
        latency, see docs/benchmarks.md). Equivalent to sending the whole status only as a
        compare-and-swap from the very version ``old`` was read from, because then the
        server merges onto exactly ``old`` (``LeaseStore`` does so).
        """
        before = old.to_dict()
        return {key: value for key, value in self.to_dict().items() if before[key] != value}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LeaseStatus:
        """Parse ``status`` (missing or empty means a new, Available lease)."""
        data = data or {}
        return cls(
            phase=Phase(data.get("phase", Phase.AVAILABLE.value)),
            holder=data.get("holder") or None,
            generation=int(data.get("generation", 0)),
            epoch=_opt_int(data.get("epoch")),
            acquire_time=_opt_time(data.get("acquireTime")),
            renew_time=_opt_time(data.get("renewTime")),
            lease_until=_opt_time(data.get("leaseUntil")),
            attempts=int(data.get("attempts", 0)),
            finish_time=_opt_time(data.get("finishTime")),
            completion=Completion.from_dict(data["completion"]) if data.get("completion") else None,
            conditions=tuple(data.get("conditions") or ()),
            claim_id=data.get("claimId") or None,
            not_before=_opt_time(data.get("notBefore")),
            reason=data.get("reason") or None,
            message=data.get("message") or None,
        )


@dataclass(frozen=True, slots=True)
class Observed:
    """One version of a JobLease as read from the API server: the basis of a decision.

    ``has_status`` is False only for a JobLease read through a CRD without the status
    default (before issue 28, or an API server that serves an older copy of the CRD);
    its status then parses as the same Available at generation 0 that the default gives.
    """

    namespace: str
    name: str
    uid: str
    resource_version: str
    metadata_generation: int
    spec: LeaseSpec
    status: LeaseStatus
    has_status: bool = True
    created: datetime | None = None
    # ``(JSON pointer, value)`` pairs the API server must hold for a write decided from this
    # version to apply (JSON-patch ``test`` operations): set when the version was not read
    # but told (a dispatcher's proposal), so the server checks what the decision believed
    vouched: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Observed:
        """Parse a JobLease object as returned by the API server."""
        meta = obj["metadata"]
        return cls(
            namespace=meta.get("namespace", ""), name=meta["name"], uid=meta.get("uid", ""),
            resource_version=meta["resourceVersion"],
            metadata_generation=int(meta.get("generation", 1)),
            spec=LeaseSpec.from_dict(obj.get("spec")),
            status=LeaseStatus.from_dict(obj.get("status")),
            has_status=bool(obj.get("status")),
            created=_opt_time(meta.get("creationTimestamp")),
        )


@dataclass(frozen=True)
class Transition:
    """A decided change: the new status plus what to tell people about it."""

    kind: str  # claimed, renewed, completed, released, expired, failed
    status: LeaseStatus
    message: str


# --- decisions -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """Who presents a held lease: the holder, the whole token and (if known) the claim id.

    Why all three: a holder name may be shared (replicas of one ServiceAccount under the
    holder-only policy), a generation restarts at 1 in a re-created JobLease, and an epoch
    is chosen by the first claimer. Only together do they name one claim; the claim id,
    random per claim, also names it when everything else were forged or reused.
    """

    holder: str
    token: FencingToken
    claim_id: str | None = None


DISPATCH_CLAIM_PREFIX = "dispatch-"  # a dispatcher's claim ids (docs/pools.md, issue 30)
# a worker's claim of a job a dispatcher proposed to it: informational only (anyone may
# write it; nothing is decided by it), so that `kubectl get` and the bench tell a claim
# made on a proposal from one made by turns
PROPOSED_CLAIM_PREFIX = "proposed-"
ADOPTION_STEP = timedelta(milliseconds=1)  # the stored times' resolution


def dispatched_claim(claim_id: str | None) -> bool:
    """Whether ``claim_id`` is a claim made through a dispatcher (claimed for, or proposed)."""
    return bool(claim_id) and str(claim_id).startswith(
        (DISPATCH_CLAIM_PREFIX, PROPOSED_CLAIM_PREFIX))


def dispatch_claim_id(claim_id: str) -> str:
    """The claim id a dispatcher writes when it claims a job for a worker."""
    return f"{DISPATCH_CLAIM_PREFIX}{claim_id}"


def unadopted(st: LeaseStatus) -> bool:
    """Whether ``st`` is a dispatcher's claim its assignee has not adopted: it never ran.

    How it is known from the object alone: a dispatcher's claim carries a claim id with
    :data:`DISPATCH_CLAIM_PREFIX` (the chart's holder-only policy refuses that prefix from
    anyone else), and writes ``renewTime == acquireTime``. The assignee *adopts* it with a
    renewal before it runs anything (``decide_renew`` moves ``renewTime`` past
    ``acquireTime``), and that renewal is a compare-and-swap: an assignee whose adoption
    failed runs nothing. So a Held lease still unadopted has run nowhere, and taking it
    back must count no attempt and impose no backoff.
    """
    return (st.phase == Phase.HELD and bool(st.holder) and st.claim_id is not None
            and st.claim_id.startswith(DISPATCH_CLAIM_PREFIX)
            and st.acquire_time is not None and st.renew_time == st.acquire_time)


def decide_claim(obs: Observed, holder: str, now: ServerNow, margin: timedelta,
                 claim_id: str | None = None, *, reassign: bool = False
                 ) -> Transition | None:
    """Decide a claim by ``holder``; ``None`` means "already ours: adopt it".

    1. A lease Held under ``claim_id`` is this caller's own earlier claim whose response was
       lost: adopt it (nothing to write) instead of refusing ourselves.
    2. A finished lease (Completed, Failed) is never claimed again.
    3. A lease held by anyone (the caller included) may be taken over only once the
       *earliest* possible server time is past ``leaseUntil + margin``.
    4. A takeover of a lease that expired while held counts the lost attempt; if that
       exhausts ``maxAttempts`` the lease becomes Failed instead of being claimed.
    5. After an attempt that ended without completion the lease rests until ``notBefore``
       (``spec.backoff``; for a Held lease that expired unnoticed, ``leaseUntil`` plus the
       backoff the operator would have written), judged by the earliest server time.
    6. Otherwise the caller becomes the holder at ``generation + 1`` under ``claim_id``; the
       first claim of an incarnation records its epoch (the resourceVersion it was decided
       from) unless the status already has one (written by an operator before issue 28,
       which initialised every JobLease with it).

    An unadopted dispatcher's claim (:func:`unadopted`) never ran: taking it over, once
    expired, counts no attempt and waits for no backoff; with ``reassign`` (the dispatcher
    taking back the job of an assignee whose presence lapsed) it is taken at once, before
    it expires — safe, because the assignee's adoption is conditional on the version the
    dispatcher overwrites, so at most one of the two writes lands.

    Raises:
        LeaseFinishedError: step 2.
        LeaseHeldError: step 3.
        LeaseNotReadyError: step 5.
    """
    st = obs.status
    if claim_id and st.phase == Phase.HELD and st.claim_id == claim_id and st.holder == holder:
        return None
    if st.phase.finished:
        raise LeaseFinishedError(obs.name, st.phase.value, st.token(), st.message or "")
    attempts = st.attempts
    never_ran = unadopted(st)
    if st.phase == Phase.HELD and st.holder:
        if not (reassign and never_ran) and not is_expired(st.lease_until, now, margin):
            raise LeaseHeldError(obs.name, st.holder, st.token(), st.lease_until)
        attempts += 0 if never_ran else 1
    if obs.spec.max_attempts is not None and attempts >= obs.spec.max_attempts:
        return _fail(obs, replace(st, attempts=attempts), now,
                     f"{attempts} attempts used of maxAttempts {obs.spec.max_attempts}")
    rest_until = not_before(obs)
    if rest_until is not None and now.earliest < rest_until:
        raise LeaseNotReadyError(obs.name, rest_until, attempts)
    at = now.midpoint
    status = replace(
        st, phase=Phase.HELD, holder=holder, generation=st.generation + 1,
        epoch=st.epoch if st.epoch is not None else epoch_of(obs),
        acquire_time=at, renew_time=at, lease_until=add_time(at, obs.spec.duration),
        attempts=attempts, claim_id=claim_id, not_before=None,
    )
    message = f"claimed by {holder!r} at generation {status.generation}"
    return Transition("claimed", _conditions(status, obs, at, "Claimed", message), message)


def not_before(obs: Observed) -> datetime | None:
    """When the lease's backoff ends (server time); ``None`` when it is not resting.

    ``status.notBefore`` as written by a failed release or the operator's expiry, or — for a
    Held lease whose holder's lease ran out before the operator noticed — ``leaseUntil``
    plus the backoff that expiry earns, so a claimer and the operator agree.
    """
    st = obs.status
    if st.phase == Phase.HELD and st.holder and st.lease_until is not None:
        if obs.spec.backoff is None or unadopted(st):
            return None
        return add_time(st.lease_until, obs.spec.retry_delay(st.attempts + 1))
    return st.not_before


def claimable_at(obs: Observed, margin: timedelta) -> datetime | None:
    """The earliest server time a claim may succeed, per the cached ``obs``; ``None``: never.

    Pure and conservative, for a pool's choice and its wake-up time (``joblease.domain.pool``):
    a claim is still decided by :func:`decide_claim` from the version it writes against.
    ``EARLIEST_TIME`` means "now".
    """
    st = obs.status
    if st.phase.finished:
        return None
    at = EARLIEST_TIME
    if st.phase == Phase.HELD and st.holder:
        at = expiry_at(st.lease_until, margin) if st.lease_until else EARLIEST_TIME
    rest_until = not_before(obs)
    return max(at, rest_until) if rest_until is not None else at


def claimable_now(obs: Observed, now: ServerNow, margin: timedelta) -> bool:
    """Whether a claim of the cached ``obs`` may succeed by the server's earliest time now."""
    at = claimable_at(obs, margin)
    return at is not None and now.earliest >= at


def decide_renew(obs: Observed, claim: Claim, now: ServerNow, margin: timedelta) -> Transition:
    """Decide a renewal: the same claim, not yet expired; extends the lease.

    Raises:
        StaleLeaseError: the claim is no longer current (or the lease is finished).
        LeaseExpiredError: still current, but expired (minus ``margin``) on the server's clock.
    """
    st = _require_current(obs, claim, now, margin)
    at = now.midpoint
    if unadopted(st) and st.acquire_time is not None:  # the adoption: renewTime must move
        at = max(at, st.acquire_time + ADOPTION_STEP)
    status = replace(st, renew_time=at, lease_until=add_time(at, obs.spec.duration))
    return Transition("renewed", status,
                      f"renewed by {claim.holder!r} at generation {claim.token.generation}")


def decide_complete(obs: Observed, claim: Claim, result: str, now: ServerNow,
                    margin: timedelta) -> Transition | None:
    """Decide a completion: like renew, then the lease is Completed forever.

    ``None``: this very claim's completion is already recorded (a retry after a lost
    response), so there is nothing to write and the caller has succeeded.

    Raises:
        StaleLeaseError: the claim is no longer current.
        LeaseExpiredError: the lease expired before the completion could be recorded.
    """
    if _completed_by(obs, claim):
        return None
    st = _require_current(obs, claim, now, margin)
    at = now.midpoint
    record = Completion(claim.token.generation, claim.holder, at, result[:MAX_RESULT_LENGTH])
    status = replace(st, phase=Phase.COMPLETED, lease_until=None, finish_time=at,
                     completion=record)
    message = f"completed by {claim.holder!r} at generation {claim.token.generation}"
    return Transition("completed", _conditions(status, obs, at, "Completed", message), message)


def decide_release(obs: Observed, claim: Claim, now: ServerNow, margin: timedelta,
                   failed: bool = False) -> Transition | None:
    """Decide a release: the holder gives the lease up before it expires.

    A plain release does not count as an attempt (the worker stopped cleanly before doing
    the work); ``failed=True`` does, and may exhaust ``maxAttempts``. ``None``: this claim's
    release is already recorded (a retry after a lost response).

    Raises:
        StaleLeaseError: the claim is no longer current.
        LeaseExpiredError: the lease already expired.
    """
    if _released_by(obs, claim):
        return None
    st = _require_current(obs, claim, now, margin)
    attempts = st.attempts + (1 if failed else 0)
    at = now.midpoint
    gen = claim.token.generation
    if obs.spec.max_attempts is not None and attempts >= obs.spec.max_attempts:
        return _fail(obs, replace(st, attempts=attempts), now,
                     f"{claim.holder!r} released generation {gen} as failed; {attempts} "
                     f"attempts used of maxAttempts {obs.spec.max_attempts}")
    status = replace(st, phase=Phase.AVAILABLE, holder=None, lease_until=None,
                     attempts=attempts,
                     not_before=add_time(at, obs.spec.retry_delay(attempts)) if failed
                     and obs.spec.backoff else None)
    how = "as failed " if failed else ""
    message = f"released {how}by {claim.holder!r} at generation {gen}"
    return Transition("released", _conditions(status, obs, at, "Released", message), message)


def decide_expire(obs: Observed, now: ServerNow, margin: timedelta) -> Transition | None:
    """Decide whether the operator should mark a Held lease Expired (``None``: nothing to do).

    Uses the same rule as a claim, so the operator never marks a lease that a claimer
    would still consider held. The holder and generation stay, so the history is readable
    and the next claim can count the attempt; the lost attempt is counted here.
    """
    st = obs.status
    if st.phase != Phase.HELD or not is_expired(st.lease_until, now, margin):
        return None
    attempts = st.attempts + (0 if unadopted(st) else 1)  # an unadopted claim never ran
    if obs.spec.max_attempts is not None and attempts >= obs.spec.max_attempts:
        return _fail(obs, replace(st, attempts=attempts), now,
                     f"generation {st.generation} of {st.holder!r} expired; {attempts} attempts "
                     f"used of maxAttempts {obs.spec.max_attempts}")
    at = now.midpoint
    status = replace(st, phase=Phase.EXPIRED, attempts=attempts, not_before=not_before(obs))
    message = (f"lease of {st.holder!r} at generation {st.generation} expired at "
               f"{format_time(st.lease_until) if st.lease_until else '?'}")
    return Transition("expired", _conditions(status, obs, at, "Expired", message), message)


def ttl_due(obs: Observed) -> datetime | None:
    """When a finished lease's TTL deletion is due (``finishTime + ttlSecondsAfterFinished``).

    ``None`` without a TTL, before it finished, or without a finish time: nothing is due.
    """
    ttl, st = obs.spec.ttl_seconds_after_finished, obs.status
    if ttl is None or not st.phase.finished or st.finish_time is None:
        return None
    return add_time(st.finish_time, timedelta(seconds=ttl))


def ttl_expired(obs: Observed, now: ServerNow) -> bool:
    """Whether a finished lease has *certainly* outlived its TTL (server clock)."""
    due = ttl_due(obs)
    return due is not None and expiry_due(due, timedelta(0), now)


def is_expired(lease_until: datetime | None, now: ServerNow, margin: timedelta) -> bool:
    """True once the server's time is *certainly* past ``leaseUntil + margin``.

    ``joblease.domain.time.expiry_due`` for a lease that may have no end (``None``: there
    is nothing to wait for).
    """
    return lease_until is None or expiry_due(lease_until, margin, now)


# --- helpers ---------------------------------------------------------------------------------

def _require_current(obs: Observed, claim: Claim, now: ServerNow, margin: timedelta
                     ) -> LeaseStatus:
    st = obs.status
    if not _is_current(st, claim):
        raise StaleLeaseError(obs.name, claim.holder, claim.token, st.holder, st.token(),
                              st.phase.value)
    if st.lease_until is None or past_holder_end(st.lease_until, margin, now):
        raise LeaseExpiredError(obs.name, claim.holder, claim.token, st.lease_until)
    return st


def _is_current(st: LeaseStatus, claim: Claim) -> bool:
    return (st.phase == Phase.HELD and _same_claim(st, claim))


def _same_claim(st: LeaseStatus, claim: Claim) -> bool:
    return (st.holder == claim.holder and st.token() == claim.token
            and (claim.claim_id is None or st.claim_id == claim.claim_id))


def _completed_by(obs: Observed, claim: Claim) -> bool:
    st, record = obs.status, obs.status.completion
    return (st.phase == Phase.COMPLETED and record is not None
            and record.holder == claim.holder and record.generation == claim.token.generation
            and st.token() == claim.token
            and (claim.claim_id is None or st.claim_id == claim.claim_id))


def _released_by(obs: Observed, claim: Claim) -> bool:
    """This claim's release landed: no holder, same token and claim id.

    Never inferred without a claim id: without it any release of this generation would match.
    """
    st = obs.status
    return (claim.claim_id is not None and st.claim_id == claim.claim_id
            and st.token() == claim.token
            and (st.phase == Phase.AVAILABLE
                 or (st.phase == Phase.FAILED and st.holder == claim.holder)))


def epoch_of(obs: Observed) -> int:
    """The epoch a first claim records: the resourceVersion it was decided from.

    Why nobody records it earlier: a new JobLease is born initialised (the CRD's default
    status, applied on read, cannot name a resourceVersion), so the first claim is the
    first write. The holder-only admission policy refuses a first epoch other than the
    stored resourceVersion, so a claimer cannot choose one (docs/protocol.md).
    """
    try:
        return int(obs.resource_version)
    except ValueError:
        return 0


def _fail(obs: Observed, st: LeaseStatus, now: ServerNow, why: str) -> Transition:
    at = now.midpoint
    status = replace(st, phase=Phase.FAILED, lease_until=None, finish_time=at,
                     not_before=None, reason="AttemptsExhausted", message=why[:1024])
    return Transition("failed", _conditions(status, obs, at, "AttemptsExhausted", why), why)


def _conditions(st: LeaseStatus, obs: Observed, at: datetime, reason: str, message: str
                ) -> LeaseStatus:
    """Set the ``Held`` and ``Finished`` conditions (shaped like metav1.Condition)."""
    held = st.phase == Phase.HELD
    conditions = set_condition(st.conditions, "Held", held, reason, message, at,
                               obs.metadata_generation)
    conditions = set_condition(conditions, "Finished", st.phase.finished, reason, message, at,
                               obs.metadata_generation)
    return replace(st, conditions=conditions)


def set_condition(conditions: tuple[dict[str, Any], ...], type_: str, status: bool, reason: str,
                  message: str, at: datetime, observed_generation: int
                  ) -> tuple[dict[str, Any], ...]:
    """Return ``conditions`` with ``type_`` set; ``lastTransitionTime`` moves only on a flip."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != value
    new = {
        "type": type_, "status": value, "reason": reason, "message": message[:1024],
        "lastTransitionTime": format_time(at) if changed or previous is None
        else previous["lastTransitionTime"],
        "observedGeneration": observed_generation,
    }
    return (*(c for c in conditions if c.get("type") != type_), new)


def _fmt(when: datetime | None) -> str | None:
    return format_time(when) if when else None


def _opt_time(value: Any) -> datetime | None:
    return parse_time(value) if value else None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
