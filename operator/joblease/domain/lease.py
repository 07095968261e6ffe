"""The JobLease protocol: which transitions are allowed, decided without any I/O.

What it guarantees
------------------
* **At most one holder per generation.** Every transition is decided from one observed
  version of the object and written with that ``resourceVersion`` as a precondition
  (``joblease.kube.transact``): of concurrent writers exactly one succeeds, the others get
  409 and decide again from a fresh read. A claim always raises ``generation`` by one, so a
  generation is never handed out twice.
* **Tokens only grow.** ``(epoch, generation)`` (``joblease.domain.token``) never decreases and
  never repeats, also across deletion and re-creation of a JobLease; the API server itself
  refuses a status write that lowers the generation or changes the holder without raising it
  by exactly one (CEL rules in the CRD).
* **Renew, complete and release need the current token.** They succeed only while holder *and*
  generation match; otherwise ``StaleLeaseError`` names the current holder and generation.
* **Expiry is judged on the API server's clock**, estimated with an error bound
  (``joblease.domain.clock``), never on a worker's wall clock. A claim over an unexpired
  holder waits until the *earliest* possible server time has passed ``leaseUntil`` plus the
  safety margin; the holder treats its lease as lost ``margin`` before ``leaseUntil`` counted
  on its own monotonic clock from when it *sent* the write. With ``margin`` at least the
  clock estimate's error, the two windows never overlap.
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
    StaleLeaseError,
    format_time,
)
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
class LeaseSpec:
    """The user's wishes (``spec``); validated by the API server's schema before we see it."""

    lease_duration_seconds: int = DEFAULT_DURATION_SECONDS
    ttl_seconds_after_finished: int | None = None
    max_attempts: int | None = None

    @property
    def duration(self) -> timedelta:
        """The lease duration as a timedelta."""
        return timedelta(seconds=self.lease_duration_seconds)

    @classmethod
    def from_dict(cls, spec: dict[str, Any] | None) -> LeaseSpec:
        """Read ``spec`` as stored by the API server (defaults already applied there)."""
        spec = spec or {}
        return cls(
            lease_duration_seconds=int(spec.get("leaseDurationSeconds", DEFAULT_DURATION_SECONDS)),
            ttl_seconds_after_finished=_opt_int(spec.get("ttlSecondsAfterFinished")),
            max_attempts=_opt_int(spec.get("maxAttempts")),
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


@dataclass(frozen=True)
class LeaseStatus:
    """``status`` of a JobLease. ``generation`` is the fencing token's claim counter."""

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
        )


@dataclass(frozen=True)
class Observed:
    """One version of a JobLease as read from the API server: the basis of a decision."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    metadata_generation: int
    spec: LeaseSpec
    status: LeaseStatus
    has_status: bool = True

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
        )


@dataclass(frozen=True)
class Transition:
    """A decided change: the new status plus what to tell people about it."""

    kind: str  # claimed, renewed, completed, released, expired, failed, initialized
    status: LeaseStatus
    message: str


# --- decisions -------------------------------------------------------------------------------

def decide_claim(obs: Observed, holder: str, now: ServerNow, margin: timedelta) -> Transition:
    """Decide a claim by ``holder``.

    1. A finished lease (Completed, Failed) is never claimed again.
    2. A lease held by anyone (the caller included) may be taken over only once the
       *earliest* possible server time is past ``leaseUntil + margin``.
    3. A takeover of a lease that expired while held counts the lost attempt; if that
       exhausts ``maxAttempts`` the lease becomes Failed instead of being claimed.
    4. Otherwise the caller becomes the holder at ``generation + 1``; the first claim of an
       incarnation records its epoch (the resourceVersion it was decided from).

    Raises:
        LeaseFinishedError: step 1.
        LeaseHeldError: step 2.
    """
    st = obs.status
    if st.phase.finished:
        raise LeaseFinishedError(obs.name, st.phase.value, st.generation)
    attempts = st.attempts
    if st.phase == Phase.HELD and st.holder:
        if not is_expired(st.lease_until, now, margin):
            raise LeaseHeldError(obs.name, st.holder, st.generation, st.lease_until)
        attempts += 1
    if obs.spec.max_attempts is not None and attempts >= obs.spec.max_attempts:
        return _fail(obs, replace(st, attempts=attempts), now,
                     f"{attempts} attempts used of maxAttempts {obs.spec.max_attempts}")
    at = now.midpoint
    status = replace(
        st, phase=Phase.HELD, holder=holder, generation=st.generation + 1,
        epoch=st.epoch if st.epoch is not None else int(obs.resource_version),
        acquire_time=at, renew_time=at, lease_until=at + obs.spec.duration, attempts=attempts,
    )
    message = f"claimed by {holder!r} at generation {status.generation}"
    return Transition("claimed", _conditions(status, obs, at, "Claimed", message), message)


def decide_renew(obs: Observed, holder: str, generation: int, now: ServerNow,
                 margin: timedelta) -> Transition:
    """Decide a renewal: same holder, same generation, not yet expired; extends the lease.

    Raises:
        StaleLeaseError: holder or generation no longer current (or the lease is finished).
        LeaseExpiredError: still current, but expired (minus ``margin``) on the server's clock.
    """
    st = _require_current(obs, holder, generation, now, margin)
    at = now.midpoint
    status = replace(st, renew_time=at, lease_until=at + obs.spec.duration)
    return Transition("renewed", status, f"renewed by {holder!r} at generation {generation}")


def decide_complete(obs: Observed, holder: str, generation: int, result: str, now: ServerNow,
                    margin: timedelta) -> Transition:
    """Decide a completion: like renew, then the lease is Completed forever.

    Raises:
        StaleLeaseError: holder or generation no longer current.
        LeaseExpiredError: the lease expired before the completion could be recorded.
    """
    st = _require_current(obs, holder, generation, now, margin)
    at = now.midpoint
    record = Completion(generation, holder, at, result[:MAX_RESULT_LENGTH])
    status = replace(st, phase=Phase.COMPLETED, lease_until=None, finish_time=at,
                     completion=record)
    message = f"completed by {holder!r} at generation {generation}"
    return Transition("completed", _conditions(status, obs, at, "Completed", message), message)


def decide_release(obs: Observed, holder: str, generation: int, now: ServerNow,
                   margin: timedelta, failed: bool = False) -> Transition:
    """Decide a release: the holder gives the lease up before it expires.

    A plain release does not count as an attempt (the worker stopped cleanly before doing
    the work); ``failed=True`` does, and may exhaust ``maxAttempts``.

    Raises:
        StaleLeaseError: holder or generation no longer current.
        LeaseExpiredError: the lease already expired.
    """
    st = _require_current(obs, holder, generation, now, margin)
    attempts = st.attempts + (1 if failed else 0)
    at = now.midpoint
    if obs.spec.max_attempts is not None and attempts >= obs.spec.max_attempts:
        return _fail(obs, replace(st, attempts=attempts), now,
                     f"{holder!r} released generation {generation} as failed; {attempts} "
                     f"attempts used of maxAttempts {obs.spec.max_attempts}")
    status = replace(st, phase=Phase.AVAILABLE, holder=None, lease_until=None,
                     attempts=attempts)
    how = "as failed " if failed else ""
    message = f"released {how}by {holder!r} at generation {generation}"
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
    attempts = st.attempts + 1
    if obs.spec.max_attempts is not None and attempts >= obs.spec.max_attempts:
        return _fail(obs, replace(st, attempts=attempts), now,
                     f"generation {st.generation} of {st.holder!r} expired; {attempts} attempts "
                     f"used of maxAttempts {obs.spec.max_attempts}")
    at = now.midpoint
    status = replace(st, phase=Phase.EXPIRED, attempts=attempts)
    message = (f"lease of {st.holder!r} at generation {st.generation} expired at "
               f"{format_time(st.lease_until) if st.lease_until else '?'}")
    return Transition("expired", _conditions(status, obs, at, "Expired", message), message)


def decide_initialize(obs: Observed, now: ServerNow) -> Transition | None:
    """Give a new JobLease (no status yet) its first status: Available, generation 0."""
    if obs.has_status:
        return None
    status = LeaseStatus()
    message = "created; available to claim"
    return Transition("initialized",
                      _conditions(status, obs, now.midpoint, "Created", message), message)


def ttl_expired(obs: Observed, now: ServerNow) -> bool:
    """Whether a finished lease has outlived ``ttlSecondsAfterFinished`` (server clock)."""
    ttl, st = obs.spec.ttl_seconds_after_finished, obs.status
    if ttl is None or not st.phase.finished or st.finish_time is None:
        return False
    return now.earliest >= st.finish_time + timedelta(seconds=ttl)


def is_expired(lease_until: datetime | None, now: ServerNow, margin: timedelta) -> bool:
    """True once the server's time is *certainly* past ``leaseUntil + margin``."""
    return lease_until is None or now.earliest >= lease_until + margin


# --- helpers ---------------------------------------------------------------------------------

def _require_current(obs: Observed, holder: str, generation: int, now: ServerNow,
                     margin: timedelta) -> LeaseStatus:
    st = obs.status
    if st.phase != Phase.HELD or st.holder != holder or st.generation != generation:
        raise StaleLeaseError(obs.name, holder, generation, st.holder, st.generation,
                              st.phase.value)
    if st.lease_until is None or now.latest > st.lease_until - margin:
        raise LeaseExpiredError(obs.name, holder, generation, st.lease_until)
    return st


def _fail(obs: Observed, st: LeaseStatus, now: ServerNow, why: str) -> Transition:
    at = now.midpoint
    status = replace(st, phase=Phase.FAILED, lease_until=None, finish_time=at)
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


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp as stored in the status (``Z`` or an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _fmt(when: datetime | None) -> str | None:
    return format_time(when) if when else None


def _opt_time(value: Any) -> datetime | None:
    return parse_time(value) if value else None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
