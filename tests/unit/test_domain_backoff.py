"""Work pools' protocol pieces: spec.backoff, status.notBefore, claimable_at, Failed's reason."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from joblease.domain.clock import ServerClock
from joblease.domain.errors import LeaseFinishedError, LeaseHeldError, LeaseNotReadyError
from joblease.domain.lease import (
    EARLIEST_TIME,
    Backoff,
    Claim,
    LeaseSpec,
    LeaseStatus,
    Observed,
    Phase,
    claimable_at,
    decide_claim,
    decide_expire,
    decide_release,
    not_before,
)
from support.builders import T0, at

MARGIN = timedelta(milliseconds=250)
BACKOFF = Backoff(initial_seconds=10, factor=2.0, max_seconds=60)



def lease(status: LeaseStatus | None = None, backoff: Backoff | None = BACKOFF,
          max_attempts: int | None = None, rv: str = "100") -> Observed:
    spec = LeaseSpec(backoff=backoff, max_attempts=max_attempts)
    return Observed("ns", "job", "uid-1", rv, 1, spec, status or LeaseStatus(epoch=100))


def held_by(holder: str, o: Observed, seconds: float = 0.0) -> Observed:
    """``o`` after ``holder`` claimed it at ``seconds`` (a 30 s lease)."""
    t = decide_claim(o, holder, at(seconds), MARGIN, claim_id=f"cid-{holder}")
    assert t is not None
    return replace(o, status=t.status, resource_version=str(int(o.resource_version) + 1))


def claim_of(o: Observed) -> Claim:
    return Claim(o.status.holder or "", o.status.token(), o.status.claim_id)


# --- Backoff.delay -------------------------------------------------------------------------

def test_delay_grows_by_the_factor_from_the_initial_rest() -> None:
    assert [BACKOFF.delay(n).total_seconds() for n in (1, 2, 3)] == [10, 20, 40]


def test_delay_is_capped_at_max_seconds_and_stays_there() -> None:
    assert [BACKOFF.delay(n).total_seconds() for n in (4, 5, 50, 10_000)] == [60] * 4


@pytest.mark.parametrize(("initial", "factor", "maximum"), [
    (10, 1.01, 300), (1, 1.001, 86400), (10, 1.1, 86400), (3, 1.5, 86400)])
def test_delay_follows_initial_times_factor_to_the_attempts_minus_one_for_every_count(
        initial: int, factor: float, maximum: int) -> None:
    """Bug 18: the growth stopped after 64 steps, so with a factor near 1 the rest stayed
    far below the documented ``initialSeconds * factor^(attempts-1)`` (at most
    ``maxSeconds``): 18.9 s forever instead of rising to 300 s for 10 s x 1.01."""
    backoff = Backoff(initial, factor, maximum)
    for attempts in (1, 2, 64, 65, 66, 100, 342, 343, 1000, 5000, 2**31 - 1):
        assert backoff.delay(attempts).total_seconds() == pytest.approx(
            _documented(initial, factor, maximum, attempts), abs=1e-6)


def _documented(initial: int, factor: float, maximum: int, attempts: int) -> float:
    """The CRD's words, with math's ``log`` where the power would overflow a float."""
    if (attempts - 1) * math.log(factor) > math.log(maximum / initial):
        return maximum
    return min(initial * factor ** (attempts - 1), maximum)


def test_no_failed_attempt_means_no_rest_and_zero_initial_means_none_ever() -> None:
    assert BACKOFF.delay(0) == timedelta(0) and BACKOFF.delay(-3) == timedelta(0)
    assert Backoff(0, 10.0, 0).delay(7) == timedelta(0)
    assert Backoff(5, 1.0, 300).delay(9) == timedelta(seconds=5)  # factor 1: constant
    assert Backoff(0, 10.0, 0).delay(2**31 - 1) == timedelta(0)  # no overflow, still none
    assert Backoff(0, 10.0, 300).delay(2**31 - 1) == timedelta(0)  # whatever the cap
    assert Backoff(5, 1.0, 300).delay(2**31 - 1) == timedelta(seconds=5)
    assert Backoff(5, 10.0, 300).delay(2**31 - 1) == timedelta(seconds=300)


@given(initial=st.integers(0, 86400), factor=st.floats(1.0, 10.0),
       extra=st.integers(0, 86400), attempts=st.integers(1, 2**31 - 2))
def test_delay_is_monotonic_bounded_and_never_raises(initial: int, factor: float,
                                                      extra: int, attempts: int) -> None:
    backoff = Backoff(initial, factor, min(86400, initial + extra))
    delay = backoff.delay(attempts)
    assert timedelta(seconds=initial) <= delay <= timedelta(seconds=backoff.max_seconds)
    assert backoff.delay(attempts + 1) >= delay


def test_backoff_from_spec_absent_empty_and_given() -> None:
    assert LeaseSpec.from_dict({}).backoff is None
    assert LeaseSpec.from_dict({"backoff": {}}).backoff == Backoff(10, 2.0, 300)  # defaults
    spec = LeaseSpec.from_dict({"priority": 7, "backoff": {"initialSeconds": 1, "factor": 3,
                                                           "maxSeconds": 9}})
    assert (spec.priority, spec.backoff) == (7, Backoff(1, 3.0, 9))
    assert spec.retry_delay(2) == timedelta(seconds=3)
    assert LeaseSpec().retry_delay(5) == timedelta(0)


# --- not_before / claimable_at, phase by phase ---------------------------------------------

def test_available_without_rest_is_claimable_now() -> None:
    o = lease()
    assert not_before(o) is None
    assert claimable_at(o, MARGIN) == EARLIEST_TIME


def test_available_after_a_failed_release_rests_until_not_before() -> None:
    o = lease(LeaseStatus(epoch=100, attempts=1, not_before=T0 + timedelta(seconds=10)))
    assert not_before(o) == T0 + timedelta(seconds=10)
    assert claimable_at(o, MARGIN) == T0 + timedelta(seconds=10)  # no margin on a backoff


def test_held_is_claimable_at_lease_until_plus_margin_or_after_the_rest_it_earns() -> None:
    no_backoff = held_by("a", lease(backoff=None))
    assert not_before(no_backoff) is None
    assert claimable_at(no_backoff, MARGIN) == T0 + timedelta(seconds=30) + MARGIN
    with_backoff = held_by("a", lease())
    # an expiry would count attempt 1: rest 10 s from leaseUntil (what the operator writes)
    assert not_before(with_backoff) == T0 + timedelta(seconds=40)
    assert claimable_at(with_backoff, MARGIN) == T0 + timedelta(seconds=40)
    tiny = held_by("a", lease(backoff=Backoff(0, 1.0, 0)))
    assert claimable_at(tiny, MARGIN) == T0 + timedelta(seconds=30) + MARGIN  # margin wins


def test_expired_rests_until_the_not_before_the_operator_wrote() -> None:
    held = held_by("a", lease())
    expired = decide_expire(held, at(30.5), MARGIN)
    assert expired is not None and expired.status.phase is Phase.EXPIRED
    o = replace(held, status=expired.status)
    assert o.status.not_before == T0 + timedelta(seconds=40)
    assert not_before(o) == claimable_at(o, MARGIN) == T0 + timedelta(seconds=40)


@pytest.mark.parametrize("phase", [Phase.COMPLETED, Phase.FAILED])
def test_finished_is_never_claimable(phase: Phase) -> None:
    o = lease(LeaseStatus(phase=phase, epoch=100, generation=3,
                          not_before=T0 + timedelta(seconds=5)))
    assert claimable_at(o, MARGIN) is None


# --- decide_claim's backoff step -----------------------------------------------------------

def test_claim_during_the_rest_names_the_time_and_succeeds_once_it_has_certainly_passed() -> None:
    rest_end = T0 + timedelta(seconds=10)
    o = lease(LeaseStatus(epoch=100, attempts=1, not_before=rest_end))
    with pytest.raises(LeaseNotReadyError) as err:
        decide_claim(o, "b", at(9.9), MARGIN)
    assert err.value.not_before == rest_end and err.value.attempts == 1
    assert err.value.name == "job"
    assert "2026-12-02T12:00:10.000Z" in str(err.value) and "1 failed" in str(err.value)
    with pytest.raises(LeaseNotReadyError):  # midpoint past, earliest estimate not yet
        decide_claim(o, "b", at(10.1, error=0.2), MARGIN)
    t = decide_claim(o, "b", at(10.0), MARGIN)
    assert t is not None and t.status.holder == "b" and t.status.not_before is None


def test_takeover_of_a_held_lease_that_ran_out_waits_for_the_rest_the_expiry_earns() -> None:
    held = held_by("a", lease())
    with pytest.raises(LeaseHeldError):
        decide_claim(held, "b", at(30.1), MARGIN)
    with pytest.raises(LeaseNotReadyError) as err:
        decide_claim(held, "b", at(35), MARGIN)
    assert err.value.not_before == T0 + timedelta(seconds=40) and err.value.attempts == 1
    t = decide_claim(held, "b", at(40), MARGIN)
    assert t is not None and (t.status.holder, t.status.attempts) == ("b", 1)


def test_the_claim_counts_the_rest_of_later_attempts_from_the_grown_delay() -> None:
    # two failed attempts so far: the third one's expiry earns 40 s
    o = lease(LeaseStatus(epoch=100, attempts=2, generation=2))
    held = held_by("c", o)
    assert not_before(held) == T0 + timedelta(seconds=30 + 40)


# --- what sets notBefore, and Failed's reason/message --------------------------------------

def test_release_as_failed_sets_not_before_from_the_backoff_and_a_plain_release_does_not() -> None:
    held = held_by("a", lease())
    failed = decide_release(held, claim_of(held), at(5), MARGIN, failed=True)
    assert failed is not None and failed.status.phase is Phase.AVAILABLE
    assert failed.status.not_before == T0 + timedelta(seconds=15)
    plain = decide_release(held, claim_of(held), at(5), MARGIN)
    assert plain is not None and plain.status.not_before is None
    no_backoff = held_by("a", lease(backoff=None))
    t = decide_release(no_backoff, claim_of(no_backoff), at(5), MARGIN, failed=True)
    assert t is not None and t.status.not_before is None and t.status.attempts == 1


def test_expire_sets_not_before_only_with_a_backoff() -> None:
    t = decide_expire(held_by("a", lease(backoff=None)), at(31), MARGIN)
    assert t is not None and t.status.phase is Phase.EXPIRED and t.status.not_before is None


def test_failed_records_reason_and_message_and_a_claim_says_why() -> None:
    held = held_by("a", lease(max_attempts=1))
    t = decide_release(held, claim_of(held), at(5), MARGIN, failed=True)
    assert t is not None and t.status.phase is Phase.FAILED
    assert t.status.reason == "AttemptsExhausted"
    assert t.status.message is not None and "maxAttempts 1" in t.status.message
    assert t.status.not_before is None
    stored = replace(held, status=LeaseStatus.from_dict(t.status.to_dict()))
    assert stored.status.reason == "AttemptsExhausted"
    with pytest.raises(LeaseFinishedError) as err:
        decide_claim(stored, "b", at(6), MARGIN)
    assert "maxAttempts 1" in str(err.value)
    expired = decide_expire(held_by("a", lease(max_attempts=1)), at(31), MARGIN)
    assert expired is not None and expired.status.phase is Phase.FAILED
    assert expired.status.reason == "AttemptsExhausted" and "expired" in (
        expired.status.message or "")


def test_status_round_trips_not_before_reason_and_message() -> None:
    status = LeaseStatus(epoch=1, not_before=T0, reason="AttemptsExhausted", message="m")
    back = LeaseStatus.from_dict(status.to_dict())
    assert (back.not_before, back.reason, back.message) == (T0, "AttemptsExhausted", "m")


# --- the claimer's wake-up instant ---------------------------------------------------------

@given(drift=st.sampled_from([0.0, 1e-4]), skew=st.sampled_from([0.0, 0.5]),
       rtt=st.floats(0.0, 0.5), ahead=st.floats(0.0, 3600.0))
def test_monotonic_certain_is_the_first_instant_the_earliest_estimate_reaches_the_time(
        drift: float, skew: float, rtt: float, ahead: float) -> None:
    clock = ServerClock(drift=drift, max_skew=skew)
    clock.observe(100.0, 100.0 + rtt, 1_800_000_000)
    when = datetime.fromtimestamp(1_800_000_000 + ahead, tz=UTC)
    local = clock.monotonic_certain(when)
    assert clock.now(local + 1e-6).earliest >= when - timedelta(microseconds=2)
    if local - 1e-3 > 100.0 + rtt:
        assert clock.now(local - 1e-3).earliest < when  # not later than it needs to be
    assert local >= clock.monotonic_at(when)  # a claimer never wakes before a holder stops


# --- claimable_at agrees with decide_claim --------------------------------------------------

@st.composite
def stored_leases(draw: st.DrawFn) -> Observed:
    phase = draw(st.sampled_from(list(Phase)))
    seconds = st.one_of(st.none(), st.integers(-60, 60))
    until, rest = draw(seconds), draw(seconds)
    status = LeaseStatus(
        phase=phase, holder=draw(st.sampled_from([None, "a"])), generation=2, epoch=100,
        attempts=draw(st.integers(0, 3)),
        lease_until=None if until is None else T0 + timedelta(seconds=until),
        not_before=None if rest is None else T0 + timedelta(seconds=rest))
    return lease(status, backoff=draw(st.sampled_from([None, BACKOFF, Backoff(0, 1.0, 0)])),
                 max_attempts=draw(st.sampled_from([None, 2, 10])))


@given(stored_leases(), st.integers(-70, 130), st.sampled_from([0.0, 0.5]))
def test_claimable_at_is_exactly_when_a_claim_stops_being_refused_as_held_or_resting(
        o: Observed, t: int, error: float) -> None:
    """A pool chooses by ``claimable_at`` and a claim is decided by ``decide_claim``: if they
    disagreed, a worker would either ask for what is refused (Expired keeps its holder and
    end, so it must not be treated as Held) or never choose what it could take. One case
    decides before the wait: attempts already used up (``maxAttempts`` lowered meanwhile)
    make any claim record Failed, so a pool that waits for the rest first loses nothing."""
    now = at(t, error)
    when = claimable_at(o, MARGIN)
    refused: type[Exception] | None = None
    try:
        transition = decide_claim(o, "b", now, MARGIN)
    except (LeaseHeldError, LeaseNotReadyError, LeaseFinishedError) as err:
        refused = type(err)
    if when is None:
        assert refused is LeaseFinishedError
    elif now.earliest >= when:
        assert refused is None
    elif refused is None:
        assert transition is not None and transition.kind == "failed"
    else:
        assert refused in (LeaseHeldError, LeaseNotReadyError)


def test_an_expired_lease_keeps_holder_and_end_and_is_claimable_at_once() -> None:
    held = held_by("a", lease(backoff=None))
    expired = decide_expire(held, at(31), MARGIN)
    assert expired is not None
    o = replace(held, status=expired.status)
    assert (o.status.holder, o.status.lease_until) == ("a", T0 + timedelta(seconds=30))
    assert claimable_at(o, MARGIN) == EARLIEST_TIME


def test_a_lease_that_fails_while_resting_rests_no_more() -> None:
    """Failed is final: a ``notBefore`` left over from the last rest would only mislead."""
    o = lease(LeaseStatus(phase=Phase.EXPIRED, holder="a", generation=2, epoch=100,
                          attempts=2, not_before=T0 + timedelta(seconds=50)), max_attempts=2)
    t = decide_claim(o, "b", at(0), MARGIN)
    assert t is not None and t.status.phase is Phase.FAILED and t.status.not_before is None


def test_a_failed_status_message_fits_the_schemas_1024_characters() -> None:
    held = held_by("a" * 1100, lease(max_attempts=1))
    t = decide_expire(held, at(31), MARGIN)
    assert t is not None and t.status.phase is Phase.FAILED
    assert t.status.message == (f"generation 1 of {'a' * 1100!r} expired; 1 attempts used of "
                                "maxAttempts 1")[:1024]
    assert len(t.status.message) == 1024
