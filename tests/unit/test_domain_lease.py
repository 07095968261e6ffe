"""The protocol's rules, decided without I/O: each test could fail if a rule were wrong."""

from __future__ import annotations

from datetime import timedelta

import pytest

from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseHeldError,
    StaleLeaseError,
)
from joblease.domain.lease import (
    Claim,
    LeaseSpec,
    LeaseStatus,
    Observed,
    Phase,
    decide_claim,
    decide_complete,
    decide_expire,
    decide_release,
    decide_renew,
    ttl_expired,
)
from joblease.domain.token import FencingToken
from support.builders import T0, at

MARGIN = timedelta(milliseconds=250)


def c(holder: str, o: Observed, generation: int) -> Claim:
    """The claim a caller presents: its holder and the whole token (this incarnation's epoch)."""
    return Claim(holder, FencingToken(o.status.epoch or 0, generation))



def obs(status: LeaseStatus | None = None, rv: str = "100", **spec: int) -> Observed:
    return Observed("ns", "job", "uid-1", rv, 1, LeaseSpec(**spec), status or LeaseStatus(),
                    has_status=status is not None)


def roundtrip(o: Observed, status: LeaseStatus, rv: str = "200") -> Observed:
    """What the API server would return after storing ``status``."""
    return Observed(o.namespace, o.name, o.uid, rv, 1, o.spec,
                    LeaseStatus.from_dict(status.to_dict()), True)


def test_first_claim_sets_generation_one_and_epoch_from_resource_version() -> None:
    t = decide_claim(obs(LeaseStatus(), rv="4711"), "a", at(0), MARGIN)
    assert t.kind == "claimed"
    assert (t.status.holder, t.status.generation, t.status.epoch) == ("a", 1, 4711)
    assert t.status.lease_until == T0 + timedelta(seconds=30)
    assert t.status.phase is Phase.HELD


def test_claim_of_held_unexpired_lease_names_holder_generation_and_end() -> None:
    held = decide_claim(obs(LeaseStatus()), "a", at(0), MARGIN).status
    with pytest.raises(LeaseHeldError) as err:
        decide_claim(obs(held), "b", at(29), MARGIN)
    assert "'a'" in str(err.value) and "generation 1" in str(err.value)
    assert "2026-12-02T12:00:30.000Z" in str(err.value)


def test_takeover_waits_for_margin_and_for_the_clock_error() -> None:
    held = decide_claim(obs(LeaseStatus()), "a", at(0), MARGIN).status
    with pytest.raises(LeaseHeldError):  # past leaseUntil, inside the margin
        decide_claim(obs(held), "b", at(30.2), MARGIN)
    with pytest.raises(LeaseHeldError):  # midpoint past, but the earliest estimate is not
        decide_claim(obs(held), "b", at(30.5, error=0.3), MARGIN)
    t = decide_claim(obs(held), "b", at(30.3), MARGIN)
    assert (t.status.holder, t.status.generation, t.status.attempts) == ("b", 2, 1)


def test_every_claim_raises_generation_by_exactly_one_and_keeps_epoch() -> None:
    o = obs(LeaseStatus(), rv="10", lease_duration_seconds=1)
    seen = []
    for i in range(7):
        t = decide_claim(o, f"w{i}", at(i * 2), MARGIN)
        seen.append(t.status.token())
        o = roundtrip(o, t.status, rv=str(20 + i))
    assert [tok.generation for tok in seen] == list(range(1, 8))
    assert {tok.epoch for tok in seen} == {10}
    assert seen == sorted(seen) and len(set(seen)) == 7


def test_renew_needs_holder_and_generation_and_extends() -> None:
    o = obs(LeaseStatus())
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    t = decide_renew(o, c("a", o, 1), at(10), MARGIN)
    assert t.status.lease_until == T0 + timedelta(seconds=40)
    with pytest.raises(StaleLeaseError, match="current generation is 1"):
        decide_renew(o, c("a", o, 0), at(10), MARGIN)
    with pytest.raises(StaleLeaseError, match="held by 'a'"):
        decide_renew(o, c("b", o, 1), at(10), MARGIN)


def test_renew_refused_once_expired_minus_margin_by_latest_estimate() -> None:
    o = obs(LeaseStatus())
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    with pytest.raises(LeaseExpiredError):
        decide_renew(o, c("a", o, 1), at(29.9), MARGIN)
    with pytest.raises(LeaseExpiredError):
        decide_renew(o, c("a", o, 1), at(29.5, error=0.3), MARGIN)
    decide_renew(o, c("a", o, 1), at(29.5), MARGIN)


def test_seed_example_stale_generation_seven_is_refused_after_eight() -> None:
    o = obs(LeaseStatus(), lease_duration_seconds=5)
    clock = 0.0
    for i in range(6):  # six earlier cycles
        o = roundtrip(o, decide_claim(o, f"w{i}", at(clock), MARGIN).status)
        o = roundtrip(o, decide_release(o, c(f"w{i}", o, i + 1), at(clock + 1), MARGIN).status)
        clock += 2
    o = roundtrip(o, decide_claim(o, "A", at(clock), MARGIN).status)
    assert o.status.generation == 7
    clock += 6  # A pauses past its lease
    o = roundtrip(o, decide_claim(o, "B", at(clock), MARGIN).status)
    assert o.status.generation == 8
    for attempt in (lambda: decide_renew(o, c("A", o, 7), at(clock + 1), MARGIN),
                    lambda: decide_complete(o, c("A", o, 7), "late", at(clock + 1), MARGIN)):
        with pytest.raises(StaleLeaseError) as err:
            attempt()
        assert "generation 7" in str(err.value) and "current generation is 8" in str(err.value)
    done = decide_complete(o, c("B", o, 8), "ok", at(clock + 1), MARGIN).status
    assert done.phase is Phase.COMPLETED and done.completion is not None
    assert (done.completion.generation, done.completion.holder) == (8, "B")


def test_completed_lease_is_never_claimed_again() -> None:
    o = obs(LeaseStatus())
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    o = roundtrip(o, decide_complete(o, c("a", o, 1), "ok", at(1), MARGIN).status)
    with pytest.raises(LeaseFinishedError, match="Completed"):
        decide_claim(o, "b", at(1000), MARGIN)
    assert decide_expire(o, at(1000), MARGIN) is None


def test_release_makes_available_and_only_failed_release_counts_an_attempt() -> None:
    o = obs(LeaseStatus())
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    plain = decide_release(o, c("a", o, 1), at(1), MARGIN).status
    assert (plain.phase, plain.holder, plain.attempts) == (Phase.AVAILABLE, None, 0)
    failed = decide_release(o, c("a", o, 1), at(1), MARGIN, failed=True).status
    assert failed.attempts == 1


def test_expire_marks_after_margin_counts_attempt_and_keeps_token() -> None:
    o = obs(LeaseStatus(), lease_duration_seconds=10)
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    assert decide_expire(o, at(10.1), MARGIN) is None
    t = decide_expire(o, at(10.3), MARGIN)
    assert t is not None
    assert (t.status.phase, t.status.holder, t.status.generation, t.status.attempts) == (
        Phase.EXPIRED, "a", 1, 1)
    o = roundtrip(o, t.status)
    nxt = decide_claim(o, "b", at(10.4), MARGIN).status
    assert (nxt.generation, nxt.attempts) == (2, 1)  # not counted twice


def test_max_attempts_turns_the_lease_failed() -> None:
    o = obs(LeaseStatus(), lease_duration_seconds=1, max_attempts=2)
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    o = roundtrip(o, decide_claim(o, "b", at(2), MARGIN).status)  # a's attempt lost: 1
    t = decide_claim(o, "c", at(4), MARGIN)  # b's lost too: 2 = maxAttempts
    assert t.kind == "failed" and t.status.phase is Phase.FAILED
    with pytest.raises(LeaseFinishedError, match="Failed"):
        decide_claim(roundtrip(o, t.status), "c", at(5), MARGIN)


def test_a_defaulted_status_and_no_status_decide_the_same_first_claim() -> None:
    """Issue 28: a JobLease is born initialised (the CRD's default, Available/0, no epoch).

    A lease stored before the default existed reads the same through the new CRD; one read
    through an older CRD has no status at all. Either way the first claim takes the epoch
    from the resourceVersion it read, and nothing else differs.
    """
    defaulted = LeaseStatus.from_dict({"phase": "Available", "generation": 0, "attempts": 0})
    assert defaulted == LeaseStatus()
    born = decide_claim(obs(defaulted, rv="4711"), "a", at(0), MARGIN, "id")
    bare = decide_claim(obs(None, rv="4711"), "a", at(0), MARGIN, "id")
    assert born is not None and bare is not None
    assert born.status == bare.status
    assert (born.status.epoch, born.status.generation) == (4711, 1)


def test_ttl_counts_from_finish() -> None:
    o = obs(LeaseStatus(), ttl_seconds_after_finished=60)
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    assert not ttl_expired(o, at(100))
    o = roundtrip(o, decide_complete(o, c("a", o, 1), "", at(1), MARGIN).status)
    assert not ttl_expired(o, at(60.5))
    assert ttl_expired(o, at(61))


def test_conditions_are_metav1_shaped_and_transition_time_moves_only_on_flip() -> None:
    o = obs(LeaseStatus())
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    held = {c["type"]: c for c in o.status.conditions}
    assert held["Held"]["status"] == "True" and held["Finished"]["status"] == "False"
    assert set(held["Held"]) == {"type", "status", "reason", "message", "lastTransitionTime",
                                 "observedGeneration"}
    renewed = decide_renew(o, c("a", o, 1), at(5), MARGIN).status
    assert renewed.conditions == o.status.conditions


def test_status_roundtrip_and_token_order() -> None:
    o = obs(LeaseStatus())
    st = decide_claim(o, "a", at(0), MARGIN).status
    assert LeaseStatus.from_dict(st.to_dict()) == st
    assert FencingToken(2, 1) > FencingToken(1, 99)
    assert FencingToken.parse("4711/7") == FencingToken(4711, 7)
    with pytest.raises(ValueError, match="EPOCH/GENERATION"):
        FencingToken.parse("7")


def test_a_renewal_patch_carries_only_the_two_timestamps() -> None:
    o = obs(LeaseStatus())
    o = roundtrip(o, decide_claim(o, "a", at(0), MARGIN).status)
    renewed = decide_renew(o, c("a", o, 1), at(10), MARGIN).status
    assert sorted(renewed.changes_since(o.status)) == ["leaseUntil", "renewTime"]


def test_a_minimal_patch_merged_onto_the_old_status_gives_the_new_one() -> None:
    """What the API server does with the patch (RFC 7386 merge; null removes)."""
    o = obs(LeaseStatus())
    steps = [lambda s: decide_claim(s, "a", at(0), MARGIN),
             lambda s: decide_renew(s, c("a", s, 1), at(5), MARGIN),
             lambda s: decide_release(s, c("a", s, 1), at(6), MARGIN),
             lambda s: decide_claim(s, "b", at(7), MARGIN),
             lambda s: decide_complete(s, c("b", s, 2), "done", at(8), MARGIN)]
    for step in steps:
        new = step(o).status
        stored = {**o.status.to_dict(), **new.changes_since(o.status)}
        merged = {k: v for k, v in stored.items() if v is not None}
        assert LeaseStatus.from_dict(merged) == new
        o = roundtrip(o, new)
