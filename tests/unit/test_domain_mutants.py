"""Pins of the domain's details that mutation testing showed no test noticed (issue 15, item 6).

Each test pins one behaviour a caller, a user or the API server relies on: condition
bookkeeping, the exact boundaries of expiry, the text of messages people read, the
server-clock tracks, and every branch of the timestamp parser. See docs/mutation.md.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from joblease.domain.clock import MAX_TRACKS, ServerClock, ServerNow
from joblease.domain.errors import (
    LeaseError,
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseGoneError,
    LeaseHeldError,
    LeaseNotFoundError,
    StaleLeaseError,
)
from joblease.domain.lease import (
    MAX_RESULT_LENGTH,
    Claim,
    Completion,
    LeaseSpec,
    LeaseStatus,
    Observed,
    Phase,
    decide_claim,
    decide_complete,
    decide_expire,
    decide_release,
    decide_renew,
    epoch_of,
    is_expired,
    set_condition,
    ttl_expired,
)
from joblease.domain.time import (
    EARLIEST_TIME,
    LATEST_TIME,
    _shift_saturating,
    add_time,
    clamp_time,
    format_time,
    parse_time,
)
from joblease.domain.token import FencingToken
from support.builders import T0

T0_TEXT = "2026-12-02T12:00:00.000Z"
MARGIN = timedelta(seconds=1)
US = timedelta(microseconds=1)
TOKEN = FencingToken(100, 1)


def exact(when: datetime) -> ServerNow:
    return ServerNow.exact(when)


def obs(status: LeaseStatus | None = None, rv: str = "100", meta_gen: int = 7,
        **spec: int) -> Observed:
    """metadata.generation 7, so observedGeneration cannot be mistaken for a default 1."""
    return Observed("ns", "job", "uid-1", rv, meta_gen, LeaseSpec(**spec),
                    status or LeaseStatus(), has_status=status is not None)


def held(holder: str = "a", generation: int = 1, until: datetime = T0 + timedelta(seconds=30),
         claim_id: str | None = "c1", attempts: int = 0) -> LeaseStatus:
    return LeaseStatus(Phase.HELD, holder, generation, 100, T0, T0, until, attempts,
                       claim_id=claim_id)


def claim(holder: str = "a", token: FencingToken = TOKEN, claim_id: str | None = "c1") -> Claim:
    return Claim(holder, token, claim_id)


def cond(st: LeaseStatus, type_: str) -> dict[str, object]:
    (found,) = [c for c in st.conditions if c["type"] == type_]
    return found


# --- conditions: bookkeeping shaped like metav1.Condition ----------------------------------

def test_set_condition_adds_a_new_type_with_every_field() -> None:
    # A new condition is a transition: its time is `at`; the message is kept as given.
    got = set_condition((), "Held", True, "Claimed", "msg", T0, 7)
    assert got == ({"type": "Held", "status": "True", "reason": "Claimed", "message": "msg",
                    "lastTransitionTime": T0_TEXT, "observedGeneration": 7},)


def test_last_transition_time_stays_when_the_status_does_not_flip() -> None:
    # kubectl wait and users read lastTransitionTime as "since when"; a renewal must not move it.
    first = set_condition((), "Held", True, "Claimed", "m1", T0, 1)
    later = T0 + timedelta(minutes=5)
    again = set_condition(first, "Held", True, "Renewed", "m2", later, 2)
    assert again == ({"type": "Held", "status": "True", "reason": "Renewed", "message": "m2",
                      "lastTransitionTime": T0_TEXT, "observedGeneration": 2},)


def test_last_transition_time_moves_on_a_flip() -> None:
    first = set_condition((), "Held", True, "Claimed", "m1", T0, 1)
    later = T0 + timedelta(minutes=5)
    flipped = set_condition(first, "Held", False, "Released", "m2", later, 1)
    assert flipped[0]["status"] == "False"
    assert flipped[0]["lastTransitionTime"] == format_time(later)


def test_set_condition_replaces_only_its_own_type_and_appends_it_last() -> None:
    # Other types are kept untouched and in order; the set one is never duplicated.
    other = {"type": "Other", "status": "True"}
    first = set_condition((other,), "Held", True, "Claimed", "m", T0, 1)
    second = set_condition(first, "Held", False, "Released", "m", T0, 1)
    assert [c["type"] for c in second] == ["Other", "Held"]
    assert second[0] is other


def test_condition_message_is_cut_at_1024_characters() -> None:
    # metav1.Condition.message has maxLength 32768 in k8s, our CRD bounds it at 1024.
    got = set_condition((), "Held", True, "r", "x" * 2000, T0, 1)
    assert got[0]["message"] == "x" * 1024


def test_claim_sets_both_conditions_with_the_observed_generation() -> None:
    t = decide_claim(obs(LeaseStatus()), "a", exact(T0), MARGIN)
    assert t is not None
    message = "claimed by 'a' at generation 1"
    assert t.status.conditions == (
        {"type": "Held", "status": "True", "reason": "Claimed", "message": message,
         "lastTransitionTime": T0_TEXT, "observedGeneration": 7},
        {"type": "Finished", "status": "False", "reason": "Claimed", "message": message,
         "lastTransitionTime": T0_TEXT, "observedGeneration": 7},
    )


def test_completion_flips_held_off_and_finished_on_with_reason_completed() -> None:
    o1 = obs(LeaseStatus())
    claimed = decide_claim(o1, "a", exact(T0), MARGIN)
    assert claimed is not None
    later = T0 + timedelta(seconds=2)
    o2 = obs(claimed.status, rv="101", meta_gen=8)
    t = decide_complete(o2, claim(token=FencingToken(100, 1), claim_id=None), "ok", exact(later),
                        MARGIN)
    assert t is not None
    assert cond(t.status, "Held")["status"] == "False"
    assert cond(t.status, "Finished") == {
        "type": "Finished", "status": "True", "reason": "Completed",
        "message": "completed by 'a' at generation 1",
        "lastTransitionTime": format_time(later), "observedGeneration": 8}


# --- claims --------------------------------------------------------------------------------

def test_claim_records_times_attempts_claim_id_and_lease_end() -> None:
    now = ServerNow(T0, T0 + timedelta(seconds=2))  # midpoint T0 + 1 s stamps the times
    t = decide_claim(obs(LeaseStatus(attempts=2), lease_duration_seconds=60), "a", now, MARGIN,
                     claim_id="id-1")
    assert t is not None and t.kind == "claimed"
    mid = T0 + timedelta(seconds=1)
    st = t.status
    assert (st.phase, st.holder, st.generation, st.epoch) == (Phase.HELD, "a", 1, 100)
    assert (st.acquire_time, st.renew_time, st.lease_until) == (mid, mid,
                                                                 mid + timedelta(seconds=60))
    assert (st.attempts, st.claim_id) == (2, "id-1")  # a claim of an Available lease adds none
    assert t.message == "claimed by 'a' at generation 1"


def test_claim_keeps_an_epoch_already_recorded() -> None:
    # The operator recorded the epoch at initialization; a claim must not replace it.
    t = decide_claim(obs(LeaseStatus(epoch=5, generation=3), rv="900"), "a", exact(T0), MARGIN)
    assert t is not None and (t.status.epoch, t.status.generation) == (5, 4)


def test_epoch_of_a_non_numeric_resource_version_is_zero() -> None:
    assert epoch_of(obs(rv="abc")) == 0
    assert epoch_of(obs(rv="42")) == 42


def test_claim_adopts_only_its_own_held_claim() -> None:
    # Adoption needs all of: a claim id, phase Held, the same claim id, the same holder.
    o = obs(held("a", claim_id="id-1"))
    assert decide_claim(o, "a", exact(T0), MARGIN, claim_id="id-1") is None
    with pytest.raises(LeaseHeldError):
        decide_claim(o, "b", exact(T0), MARGIN, claim_id="id-1")  # another holder, same id
    with pytest.raises(LeaseHeldError):
        decide_claim(o, "a", exact(T0), MARGIN, claim_id="id-2")
    with pytest.raises(LeaseHeldError):
        decide_claim(obs(held("a", claim_id=None)), "a", exact(T0), MARGIN, claim_id=None)
    expired_same_id = replace_phase(held("a", claim_id="id-1"), Phase.EXPIRED)
    t = decide_claim(obs(expired_same_id), "a", exact(T0), MARGIN, claim_id="id-1")
    assert t is not None and t.status.generation == 2  # not Held: a new claim, not adoption


def replace_phase(st: LeaseStatus, phase: Phase) -> LeaseStatus:
    return replace(st, phase=phase)


def test_taking_over_an_expired_held_lease_counts_the_lost_attempt_once() -> None:
    until = T0
    o = obs(held("a", until=until, attempts=1))
    t = decide_claim(o, "b", exact(until + MARGIN), MARGIN)
    assert t is not None and t.status.attempts == 2
    # Marked Expired by the operator, the attempt was counted there: a claim adds none.
    o2 = obs(replace_phase(held("a", until=until, attempts=1), Phase.EXPIRED))
    t2 = decide_claim(o2, "b", exact(until + MARGIN), MARGIN)
    assert t2 is not None and t2.status.attempts == 1


def test_held_without_a_holder_is_claimable_without_counting_an_attempt() -> None:
    st = replace(held(until=T0 + timedelta(hours=1)), holder=None)
    t = decide_claim(obs(st), "b", exact(T0), MARGIN)
    assert t is not None and t.status.attempts == 0


def test_claim_fails_exactly_when_attempts_reach_max_attempts() -> None:
    assert decide_claim(obs(LeaseStatus(attempts=1), max_attempts=2), "a", exact(T0),
                        MARGIN) is not None
    t = decide_claim(obs(LeaseStatus(attempts=2), max_attempts=2), "a", exact(T0), MARGIN)
    assert t is not None and t.kind == "failed"
    assert t.message == "2 attempts used of maxAttempts 2"
    assert (t.status.phase, t.status.lease_until, t.status.finish_time) == (
        Phase.FAILED, None, T0)
    assert cond(t.status, "Finished")["reason"] == "AttemptsExhausted"
    assert cond(t.status, "Finished")["message"] == t.message


def test_claim_of_a_finished_lease_names_phase_and_generation() -> None:
    st = LeaseStatus(Phase.COMPLETED, generation=4)
    with pytest.raises(LeaseFinishedError) as err:
        decide_claim(obs(st), "a", exact(T0), MARGIN)
    assert str(err.value) == ("lease 'job' is Completed at generation 4 (token 0/4) and cannot "
                              "be claimed again")
    assert (err.value.name, err.value.phase, err.value.generation) == ("job", "Completed", 4)
    assert err.value.token == FencingToken(0, 4)


def test_claim_of_a_held_lease_names_holder_generation_and_end() -> None:
    with pytest.raises(LeaseHeldError) as err:
        decide_claim(obs(held("a", generation=3)), "b", exact(T0), MARGIN)
    assert str(err.value) == ("lease 'job' is held by 'a' at generation 3 (token 100/3) until "
                              "2026-12-02T12:00:30.000Z (server time)")
    assert (err.value.name, err.value.holder, err.value.generation) == ("job", "a", 3)
    assert err.value.token == FencingToken(100, 3)
    assert err.value.lease_until == T0 + timedelta(seconds=30)


# --- expiry boundaries ---------------------------------------------------------------------

def test_is_expired_exactly_at_lease_until_plus_margin_on_the_earliest_time() -> None:
    end = T0 + MARGIN
    assert is_expired(T0, exact(end), MARGIN)
    assert not is_expired(T0, exact(end - US), MARGIN)
    # Judged on the *earliest* possible server time, not the latest.
    assert not is_expired(T0, ServerNow(end - US, end + timedelta(seconds=5)), MARGIN)
    assert is_expired(None, exact(T0), MARGIN)  # no end recorded: nothing to protect


def test_require_current_accepts_until_exactly_lease_until_minus_margin() -> None:
    # The holder's side of the margin: its write is accepted while the *latest* server time
    # is at most leaseUntil - margin.
    until = T0 + timedelta(seconds=30)
    o = obs(held(until=until))
    assert decide_renew(o, claim(), exact(until - MARGIN), MARGIN).kind == "renewed"
    with pytest.raises(LeaseExpiredError):
        decide_renew(o, claim(), exact(until - MARGIN + US), MARGIN)
    with pytest.raises(LeaseExpiredError):
        decide_renew(o, claim(), ServerNow(T0, until - MARGIN + US), MARGIN)


def test_expired_error_names_lease_holder_generation_and_end() -> None:
    until = T0 + timedelta(seconds=30)
    with pytest.raises(LeaseExpiredError) as err:
        decide_renew(obs(held(until=until)), claim(), exact(until), MARGIN)
    assert str(err.value) == ("lease 'job' of 'a' at generation 1 (token 100/1) expired at "
                              "2026-12-02T12:00:30.000Z (server time); claim it again")
    assert err.value.token == FencingToken(100, 1)
    assert (err.value.name, err.value.holder, err.value.generation, err.value.lease_until) == (
        "job", "a", 1, until)


def test_held_without_lease_until_is_expired_for_its_holder() -> None:
    o = obs(replace(held(), lease_until=None))
    with pytest.raises(LeaseExpiredError) as err:
        decide_renew(o, claim(), exact(T0), MARGIN)
    assert "expired at an unknown time (server time)" in str(err.value)


def test_ttl_expired_exactly_at_finish_time_plus_ttl_on_the_earliest_time() -> None:
    done = LeaseStatus(Phase.COMPLETED, finish_time=T0)
    ttl = timedelta(seconds=10)
    o = obs(done, ttl_seconds_after_finished=10)
    assert ttl_expired(o, exact(T0 + ttl))
    assert not ttl_expired(o, exact(T0 + ttl - US))
    assert not ttl_expired(o, ServerNow(T0 + ttl - US, T0 + ttl + ttl))
    assert ttl_expired(obs(LeaseStatus(Phase.FAILED, finish_time=T0),
                           ttl_seconds_after_finished=0), exact(T0))


def test_ttl_never_applies_without_ttl_unfinished_or_without_finish_time() -> None:
    late = exact(T0 + timedelta(days=1))
    assert not ttl_expired(obs(LeaseStatus(Phase.COMPLETED, finish_time=T0)), late)
    assert not ttl_expired(obs(LeaseStatus(Phase.EXPIRED, finish_time=T0),
                               ttl_seconds_after_finished=1), late)
    assert not ttl_expired(obs(LeaseStatus(Phase.COMPLETED), ttl_seconds_after_finished=1), late)


# --- renew, complete, release: the exact claim -----------------------------------------------

def test_renew_extends_from_the_midpoint_and_keeps_the_rest() -> None:
    o = obs(held(until=T0 + timedelta(seconds=30)), lease_duration_seconds=20)
    now = ServerNow(T0, T0 + timedelta(seconds=2))
    t = decide_renew(o, claim(), now, MARGIN)
    mid = T0 + timedelta(seconds=1)
    assert (t.status.renew_time, t.status.lease_until, t.status.acquire_time) == (
        mid, mid + timedelta(seconds=20), T0)
    assert t.status.conditions == o.status.conditions
    assert t.message == "renewed by 'a' at generation 1"


def test_stale_error_names_both_claims_and_the_phase() -> None:
    with pytest.raises(StaleLeaseError) as err:
        decide_renew(obs(held("b", generation=2)), claim("a", FencingToken(100, 1)),
                     exact(T0), MARGIN)
    e = err.value
    assert str(e) == ("stale lease token for 'job': 'a' presented generation 1 (token 100/1), "
                      "but the current generation is 2 (token 100/2, held by 'b', phase Held)")
    assert (e.name, e.holder, e.token, e.generation) == ("job", "a", FencingToken(100, 1), 1)
    assert (e.current_holder, e.current_token, e.current_generation, e.phase) == (
        "b", FencingToken(100, 2), 2, "Held")


def test_stale_error_says_not_held_when_nobody_holds_it() -> None:
    with pytest.raises(StaleLeaseError) as err:
        decide_renew(obs(LeaseStatus(epoch=100, generation=1)), claim(claim_id=None),
                     exact(T0), MARGIN)
    assert str(err.value).endswith("(token 100/1, not held, phase Available)")


def test_a_different_claim_id_is_stale_but_no_claim_id_is_not_checked() -> None:
    o = obs(held(claim_id="c1"))
    with pytest.raises(StaleLeaseError):
        decide_renew(o, claim(claim_id="other"), exact(T0), MARGIN)
    assert decide_renew(o, claim(claim_id=None), exact(T0), MARGIN).kind == "renewed"


def test_completion_record_and_status() -> None:
    now = ServerNow(T0, T0 + timedelta(seconds=2))
    t = decide_complete(obs(held()), claim(), "r" * (MAX_RESULT_LENGTH + 5), now, MARGIN)
    mid = T0 + timedelta(seconds=1)
    assert t is not None and t.kind == "completed"
    assert t.status.completion == Completion(1, "a", mid, "r" * MAX_RESULT_LENGTH)
    assert (t.status.phase, t.status.lease_until, t.status.finish_time) == (
        Phase.COMPLETED, None, mid)
    assert t.message == "completed by 'a' at generation 1"


def completed(holder: str = "a", generation: int = 1, record_generation: int = 1,
              record_holder: str = "a", epoch: int = 100, claim_id: str = "c1") -> Observed:
    return obs(LeaseStatus(Phase.COMPLETED, holder, generation, epoch, finish_time=T0,
                           completion=Completion(record_generation, record_holder, T0),
                           claim_id=claim_id))


def test_a_retried_completion_is_recognised_only_for_the_same_claim() -> None:
    assert decide_complete(completed(), claim(), "", exact(T0), MARGIN) is None
    assert decide_complete(completed(), claim(claim_id=None), "", exact(T0), MARGIN) is None
    for other in (completed(claim_id="c2"), completed(record_holder="b"),
                  completed(record_generation=2), completed(epoch=99)):
        with pytest.raises(StaleLeaseError):
            decide_complete(other, claim(), "", exact(T0), MARGIN)


def test_release_status_and_message() -> None:
    now = ServerNow(T0, T0 + timedelta(seconds=2))
    t = decide_release(obs(held(attempts=1)), claim(), now, MARGIN)
    assert t is not None and t.kind == "released"
    st = t.status
    assert (st.phase, st.holder, st.lease_until, st.attempts) == (Phase.AVAILABLE, None, None, 1)
    assert (st.generation, st.epoch, st.claim_id) == (1, 100, "c1")  # kept: the retry's proof
    assert t.message == "released by 'a' at generation 1"
    assert cond(st, "Held") == {
        "type": "Held", "status": "False", "reason": "Released", "message": t.message,
        "lastTransitionTime": format_time(T0 + timedelta(seconds=1)), "observedGeneration": 7}


def test_release_as_failed_counts_an_attempt_and_says_so() -> None:
    t = decide_release(obs(held(attempts=1)), claim(), exact(T0), MARGIN, failed=True)
    assert t is not None and t.status.attempts == 2
    assert t.message == "released as failed by 'a' at generation 1"


def test_release_fails_the_lease_exactly_when_attempts_reach_max() -> None:
    t = decide_release(obs(held(attempts=1), max_attempts=3), claim(), exact(T0), MARGIN,
                       failed=True)
    assert t is not None and t.kind == "released"
    t = decide_release(obs(held(attempts=1), max_attempts=2), claim(), exact(T0), MARGIN,
                       failed=True)
    assert t is not None and t.kind == "failed"
    assert t.message == ("'a' released generation 1 as failed; 2 attempts used of "
                         "maxAttempts 2")
    assert (t.status.phase, t.status.holder, t.status.attempts) == (Phase.FAILED, "a", 2)


def test_a_retried_release_is_recognised_only_with_the_same_claim_id() -> None:
    released = LeaseStatus(Phase.AVAILABLE, None, 1, 100, claim_id="c1")
    assert decide_release(obs(released), claim(), exact(T0), MARGIN) is None
    failed = LeaseStatus(Phase.FAILED, "a", 1, 100, claim_id="c1")
    assert decide_release(obs(failed), claim(), exact(T0), MARGIN) is None
    refused = [
        (obs(released), claim(claim_id=None)),  # never inferred without an id
        (obs(LeaseStatus(Phase.AVAILABLE, None, 1, 100, claim_id=None)), claim(claim_id=None)),
        (obs(released), claim(claim_id="c2")),
        (obs(released), claim(token=FencingToken(100, 2))),
        (obs(LeaseStatus(Phase.FAILED, "b", 1, 100, claim_id="c1")), claim()),
        (obs(LeaseStatus(Phase.EXPIRED, "a", 1, 100, claim_id="c1")), claim()),
    ]
    for o, c in refused:
        with pytest.raises(StaleLeaseError):
            decide_release(o, c, exact(T0), MARGIN)


# --- expire and initialize -------------------------------------------------------------------

def test_expire_keeps_holder_and_generation_and_counts_the_attempt() -> None:
    until = T0
    now = ServerNow(until + MARGIN, until + MARGIN + timedelta(seconds=2))
    t = decide_expire(obs(held(until=until, attempts=1)), now, MARGIN)
    assert t is not None and t.kind == "expired"
    st = t.status
    assert (st.phase, st.holder, st.generation, st.attempts, st.lease_until) == (
        Phase.EXPIRED, "a", 1, 2, until)
    assert t.message == "lease of 'a' at generation 1 expired at 2026-12-02T12:00:00.000Z"
    assert cond(st, "Held") == {
        "type": "Held", "status": "False", "reason": "Expired", "message": t.message,
        "lastTransitionTime": format_time(until + MARGIN + timedelta(seconds=1)),
        "observedGeneration": 7}
    assert cond(st, "Finished")["status"] == "False"


def test_expire_waits_for_exactly_lease_until_plus_margin() -> None:
    o = obs(held(until=T0))
    assert decide_expire(o, exact(T0 + MARGIN - US), MARGIN) is None
    assert decide_expire(o, exact(T0 + MARGIN), MARGIN) is not None


def test_expire_ignores_every_phase_but_held() -> None:
    for phase in (Phase.AVAILABLE, Phase.EXPIRED, Phase.COMPLETED, Phase.FAILED):
        st = replace_phase(held(until=T0), phase)
        assert decide_expire(obs(st), exact(T0 + timedelta(days=1)), MARGIN) is None


def test_expire_of_a_lease_without_end_says_so() -> None:
    t = decide_expire(obs(replace(held(), lease_until=None)), exact(T0), MARGIN)
    assert t is not None and t.message == "lease of 'a' at generation 1 expired at ?"


def test_expire_fails_the_lease_exactly_when_attempts_reach_max() -> None:
    first = decide_expire(obs(held(until=T0, attempts=0), max_attempts=2), exact(T0 + MARGIN),
                          MARGIN)
    assert first is not None and first.kind == "expired"
    t = decide_expire(obs(held(until=T0, attempts=1), max_attempts=2), exact(T0 + MARGIN),
                      MARGIN)
    assert t is not None and t.kind == "failed"
    assert t.message == "generation 1 of 'a' expired; 2 attempts used of maxAttempts 2"
    assert t.status.attempts == 2  # the Failed status records the attempt that exhausted it
    assert (t.status.phase, t.status.finish_time, t.status.lease_until) == (
        Phase.FAILED, T0 + MARGIN, None)


def test_an_operator_initialised_status_keeps_its_epoch_at_the_first_claim() -> None:
    """Upgrade: a status written by an operator before issue 28 carries an epoch already.

    The first claim keeps it (the CRD's rule makes the epoch immutable once set) instead of
    taking the resourceVersion it read; a born-initialised status has none and takes it.
    """
    now = ServerNow(T0, T0 + timedelta(seconds=2))
    initialised = LeaseStatus(epoch=4711)
    t = decide_claim(obs(initialised, rv="5000"), "a", now, timedelta(0))
    assert t is not None and (t.status.epoch, t.status.generation) == (4711, 1)
    t = decide_claim(obs(LeaseStatus(), rv="5000"), "a", now, timedelta(0))
    assert t is not None and (t.status.epoch, t.status.generation) == (5000, 1)


# --- status, spec and object parsing -----------------------------------------------------------

def test_phase_finished_is_exactly_completed_and_failed() -> None:
    assert [p for p in Phase if p.finished] == [Phase.COMPLETED, Phase.FAILED]


def test_status_to_dict_writes_every_field_and_none_for_absent_ones() -> None:
    # None (not a missing key) is what makes a merge patch remove a field.
    st = LeaseStatus(Phase.HELD, "a", 2, 9, T0, T0 + US * 1000, T0 + timedelta(seconds=3), 1,
                     T0, Completion(2, "a", T0, "r"), ({"type": "Held"},), "c1", T0, "Why", "m")
    assert st.to_dict() == {
        "phase": "Held", "holder": "a", "generation": 2, "epoch": 9,
        "acquireTime": T0_TEXT, "renewTime": "2026-12-02T12:00:00.001Z",
        "leaseUntil": "2026-12-02T12:00:03.000Z", "attempts": 1, "finishTime": T0_TEXT,
        "completion": {"generation": 2, "holder": "a", "time": T0_TEXT, "result": "r"},
        "conditions": [{"type": "Held"}], "claimId": "c1", "notBefore": T0_TEXT,
        "reason": "Why", "message": "m"}
    assert LeaseStatus().to_dict() == {
        "phase": "Available", "holder": None, "generation": 0, "epoch": None,
        "acquireTime": None, "renewTime": None, "leaseUntil": None, "attempts": 0,
        "finishTime": None, "completion": None, "conditions": [], "claimId": None,
        "notBefore": None, "reason": None, "message": None}


def test_status_round_trips_and_reads_defaults() -> None:
    st = LeaseStatus(Phase.COMPLETED, "a", 2, 9, T0, T0, T0, 1, T0,
                     Completion(2, "a", T0, "r"), ({"type": "Held"},), "c1")
    assert LeaseStatus.from_dict(st.to_dict()) == st
    assert LeaseStatus.from_dict(None) == LeaseStatus()
    assert LeaseStatus.from_dict({"holder": "", "claimId": "", "conditions": None,
                                  "completion": None}) == LeaseStatus()
    parsed = LeaseStatus.from_dict({"generation": "3", "attempts": "2", "epoch": "5"})
    assert (parsed.generation, parsed.attempts, parsed.epoch) == (3, 2, 5)


def test_token_of_a_status_without_epoch_has_epoch_zero() -> None:
    assert LeaseStatus(generation=3).token() == FencingToken(0, 3)


def test_completion_from_dict_defaults_the_result_to_empty() -> None:
    got = Completion.from_dict({"generation": "2", "holder": "a", "time": T0_TEXT})
    assert got == Completion(2, "a", T0, "")


def test_changes_since_is_exactly_the_differing_fields() -> None:
    old = held()
    new = LeaseStatus(Phase.HELD, "a", 1, 100, T0, T0 + MARGIN, T0 + timedelta(seconds=40), 0,
                      claim_id="c1")
    assert new.changes_since(old) == {"renewTime": "2026-12-02T12:00:01.000Z",
                                      "leaseUntil": "2026-12-02T12:00:40.000Z"}
    assert old.changes_since(old) == {}
    # A removed field is sent as None, so the merge patch deletes it.
    assert LeaseStatus().changes_since(LeaseStatus(holder="a")) == {"holder": None}


def test_spec_from_dict_reads_defaults_and_delegation() -> None:
    assert LeaseSpec.from_dict(None) == LeaseSpec(30, None, None, False, None)
    assert LeaseSpec.from_dict({"podDelegation": None}) == LeaseSpec()
    got = LeaseSpec.from_dict({"leaseDurationSeconds": "12", "ttlSecondsAfterFinished": "0",
                               "maxAttempts": 3,
                               "podDelegation": {"enabled": True, "serviceAccountName": "sa"}})
    assert got == LeaseSpec(12, 0, 3, True, "sa")
    assert LeaseSpec.from_dict({"podDelegation": {"serviceAccountName": ""}}) == LeaseSpec()
    assert LeaseSpec(lease_duration_seconds=12).duration == timedelta(seconds=12)


def test_observed_from_object_defaults_missing_metadata() -> None:
    got = Observed.from_object({"metadata": {"name": "job", "resourceVersion": "5"}})
    assert got == Observed("", "job", "", "5", 1, LeaseSpec(), LeaseStatus(), has_status=False)
    full = Observed.from_object({
        "metadata": {"name": "job", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                     "generation": "3"},
        "spec": {"leaseDurationSeconds": 9}, "status": {"phase": "Expired"}})
    assert full == Observed("ns", "job", "u", "5", 3, LeaseSpec(9),
                            LeaseStatus(Phase.EXPIRED), has_status=True)
    assert not Observed.from_object({"metadata": {"name": "j", "resourceVersion": "1"},
                                     "status": {}}).has_status


# --- timestamps ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("2026-12-02T12:00:00Z", T0),
    ("  2026-12-02t12:00:00z  ", T0),  # stripped, any case
    ("2026-12-02 12:00:00Z", T0),  # a space for the T
    ("2026-12-02T12:00:00Zt whatever", T0),  # kube-openapi ignores a tail after a second t
    ("2026-12-02T12:00:00.5Z", T0 + timedelta(milliseconds=500)),
    ("2026-12-02T12:00:00,000001Z", T0 + US),
    ("2026-12-02T12:00:00 25Z", T0 + timedelta(milliseconds=250)),  # any one separator
    ("2026-12-02T12:00:00\n25Z", T0 + timedelta(milliseconds=250)),  # even a newline
    ("2026-12-02T12:00:00.123456789Z", T0 + 123456 * US),  # truncated to microseconds
    ("2026-12-02T12:00:00.1234569Z", T0 + 123456 * US),  # truncated, not rounded
    ("2026-12-02T17:30:00+05:30", T0),
    ("2026-12-02T06:30:00-05:30", T0),
    ("2026-12-02T12:00:60Z", T0 + timedelta(seconds=59)),  # leap second read as :59
    ("2026-12-02T12:00:59Z", T0 + timedelta(seconds=59)),
    ("2026-12-06T16:39:00+99:99", T0),  # 99 h 99 min = 4 d 4 h 39 min: no 23:59 limit
])
def test_parse_time_reads_what_the_server_stores(text: str, expected: datetime) -> None:
    got = parse_time(text)
    assert got == expected and got.tzinfo == UTC


def test_parse_time_offset_beyond_a_day_moves_by_the_whole_offset() -> None:
    assert parse_time("2026-12-03T12:00:00+24:00") == T0
    assert parse_time("2026-12-01T12:00:00-24:00") == T0


@pytest.mark.parametrize(("text", "expected"), [
    ("0000-06-01T00:00:00Z", EARLIEST_TIME),
    ("0001-12-31T23:59:59Z", EARLIEST_TIME),
    ("0002-01-01T00:00:00+00:01", EARLIEST_TIME),  # shifted before the window: clamped
    ("0002-06-01T00:00:00Z", datetime(2, 6, 1, tzinfo=UTC)),  # year 2 itself is in the window
    ("9999-12-31T23:59:59-23:59", LATEST_TIME),  # the shift overflows datetime: saturates
    ("9998-01-01T00:00:01Z", LATEST_TIME),
    ("9997-12-31T23:59:59Z", datetime(9997, 12, 31, 23, 59, 59, tzinfo=UTC)),
])
def test_parse_time_clamps_into_the_window(text: str, expected: datetime) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", [
    "2026-12-02", "2026-12-02T", "2026-12-02T12:00Z", "2026-12-02T12:00:00",
    "2026-12-02T12:00:00+0500", "26-12-02T12:00:00Z", "2026-12-02X12:00:00Z",
    "2026-12-02T\u0661\u0662:00:00Z",  # Arabic-Indic digits in the time: its \d is ASCII only
    "2026-12-02T12:00:00.Z",
])
def test_parse_time_refuses_what_is_no_date_time(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not an RFC 3339 timestamp: "):
        parse_time(text)


def test_parse_time_refuses_an_impossible_calendar_day_naming_it() -> None:
    with pytest.raises(ValueError) as err:
        parse_time("2026-02-30T12:00:00Z")
    assert str(err.value) == ("not a valid date and time: '2026-02-30T12:00:00Z' "
                              "(day is out of range for month)")
    with pytest.raises(ValueError, match="not a valid date and time"):
        parse_time("2026-12-02T24:00:00Z")


def test_shift_saturating_clamps_both_ends() -> None:
    assert _shift_saturating(datetime(9999, 12, 31, 23, 0), 120) == LATEST_TIME
    assert _shift_saturating(datetime(1, 1, 1, 0, 30), -60) == EARLIEST_TIME
    assert _shift_saturating(datetime(2026, 12, 2, 11, 0), 60) == T0


def test_clamp_and_add_time_saturate() -> None:
    assert clamp_time(datetime(9999, 1, 1, tzinfo=UTC)) == LATEST_TIME
    assert clamp_time(datetime(1, 1, 1, tzinfo=UTC)) == EARLIEST_TIME
    assert clamp_time(T0) == T0
    top = datetime.max.replace(tzinfo=UTC)
    bottom = datetime.min.replace(tzinfo=UTC)
    assert add_time(top - US, timedelta(days=1)) == top
    assert add_time(bottom + US, -timedelta(days=1)) == bottom
    assert add_time(T0, MARGIN) == T0 + MARGIN


def test_format_time_writes_utc_with_milliseconds_and_four_digit_years() -> None:
    plus5 = timezone(timedelta(hours=5))
    assert format_time(datetime(2026, 12, 2, 17, 0, 0, 999999, tzinfo=plus5)) == (
        "2026-12-02T12:00:00.999Z")
    assert format_time(datetime(1, 2, 3, 4, 5, 6, 7000, tzinfo=UTC)) == "0001-02-03T04:05:06.007Z"
    assert format_time(datetime(2026, 12, 2, 12, 0)) == T0_TEXT  # naive: taken as UTC as is


# --- the remaining error types ------------------------------------------------------------------

def test_not_found_gone_and_finished_detail_messages() -> None:
    e = LeaseNotFoundError("job", "ns")
    assert str(e) == "JobLease ns/job not found (create it with `kubectl apply -f …`)"
    assert isinstance(e, LeaseError) and e.name == "job"
    gone = LeaseGoneError("job", "ns", "deleted")
    assert str(gone) == "JobLease ns/job held by this caller is gone: deleted"
    assert gone.name == "job"
    finished = LeaseFinishedError("job", "Failed", FencingToken(9, 3), "maxAttempts 3 used")
    assert str(finished) == ("lease 'job' is Failed at generation 3 (token 9/3) and cannot be "
                             "claimed again: maxAttempts 3 used")
    assert (finished.token, finished.generation) == (FencingToken(9, 3), 3)
    assert str(LeaseFinishedError("job", "Completed", FencingToken(9, 2))) == (  # no dangling :
        "lease 'job' is Completed at generation 2 (token 9/2) and cannot be claimed again")


def test_held_error_without_an_end_says_unknown() -> None:
    assert str(LeaseHeldError("job", "a", FencingToken(9, 1), None)).endswith(
        "until an unknown time (server time)")


# --- the fencing token ---------------------------------------------------------------------

def test_token_parts_must_not_be_negative_and_zero_is_allowed() -> None:
    assert str(FencingToken(0, 0)) == "0/0"
    with pytest.raises(ValueError) as err:
        FencingToken(-1, 0)
    assert str(err.value) == "fencing token parts must be >= 0, got -1/0"
    with pytest.raises(ValueError, match=r"got 0/-1$"):
        FencingToken(0, -1)


def test_tokens_order_by_epoch_before_generation() -> None:
    assert FencingToken(2, 1) > FencingToken(1, 99)
    assert FencingToken(1, 2) > FencingToken(1, 1)


@pytest.mark.parametrize(("text", "expected"), [
    ("4711/7", FencingToken(4711, 7)), (" 0/0\n", FencingToken(0, 0)),
])
def test_token_parse_reads_the_printed_form(text: str, expected: FencingToken) -> None:
    assert FencingToken.parse(text) == expected
    assert FencingToken.parse(str(expected)) == expected


@pytest.mark.parametrize("text", ["", "7", "1/2/3", "1/", "/1", "-1/2", "1/+2", "a/1", "1 / 2",
                                  "1.0/2"])
def test_token_parse_refuses_anything_else_naming_the_form(text: str) -> None:
    with pytest.raises(ValueError) as err:
        FencingToken.parse(text)
    assert str(err.value) == ("not a fencing token (want EPOCH/GENERATION, e.g. 4711/7): "
                              f"{text!r}")


# --- the server clock: tracks ------------------------------------------------------------------

def test_server_now_midpoint_error_and_exact() -> None:
    now = ServerNow(T0, T0 + timedelta(seconds=4))
    assert (now.midpoint, now.error) == (T0 + timedelta(seconds=2), timedelta(seconds=2))
    assert ServerNow.exact(T0) == ServerNow(T0, T0)


@pytest.mark.parametrize("kwargs", [{"drift": -1e-9}, {"max_skew": -0.1}, {"track_ttl": -1.0}])
def test_clock_settings_must_not_be_negative(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"^drift, max_skew and track_ttl must be >= 0$"):
        ServerClock(**kwargs)


def test_clock_settings_of_zero_are_allowed() -> None:
    clock = ServerClock(drift=0, max_skew=0, track_ttl=0)
    assert (clock.known, clock.tracks, clock.observations) == (False, 0, 0)


def test_unknown_clock_refuses_now_and_monotonic_at() -> None:
    clock = ServerClock()
    msg = r"^the server clock is unknown until a response has been observed$"
    with pytest.raises(RuntimeError, match=msg):
        clock.now(0.0)
    with pytest.raises(RuntimeError, match=msg):
        clock.monotonic_at(T0)
    with pytest.raises(RuntimeError, match=msg):  # a waiting claimer's wake-up instant
        clock.monotonic_certain(T0)


def test_observe_refuses_receipt_before_sending_but_not_at_the_same_instant() -> None:
    clock = ServerClock()
    with pytest.raises(ValueError) as err:
        clock.observe(2.0, 1.0, 5000)
    assert str(err.value) == "received (1.0) before sent (2.0)"
    assert clock.observations == 0
    clock.observe(1.0, 1.0, 5000)
    assert (clock.known, clock.observations) == (True, 1)


def bounds(clock: ServerClock, at: float) -> tuple[float, float]:
    now = clock.now(at)
    return now.earliest.timestamp() - at, now.latest.timestamp() - at


def test_one_observation_gives_the_offset_interval_of_its_round_trip() -> None:
    clock = ServerClock(drift=0)
    clock.observe(100.0, 102.0, 5000)  # offset in [5000 - 102, 5001 - 100]
    assert bounds(clock, 110.0) == pytest.approx(abs=2e-6, expected=(4898.0, 4901.0))
    now = clock.now(110.0)
    assert now.earliest.tzinfo == UTC
    assert now.earliest == datetime.fromtimestamp(110.0 + 4898.0, tz=UTC)


def test_observations_that_just_touch_merge_into_one_track() -> None:
    clock = ServerClock(drift=0)
    clock.observe(100.0, 100.0, 5000)  # [4900, 4901]
    clock.observe(200.0, 200.0, 5101)  # [4901, 4902]: intersects in exactly one point
    assert (clock.tracks, clock.switches, clock.jumps, clock.observations) == (1, 0, 0, 2)
    assert bounds(clock, 200.0) == pytest.approx(abs=2e-6, expected=(4901.0, 4901.0))


def test_widening_grows_with_distance_from_the_anchor_both_ways() -> None:
    clock = ServerClock(drift=0.001)
    clock.observe(100.0, 100.0, 5000)  # [4900, 4901] at 100
    assert bounds(clock, 110.0) == pytest.approx(abs=2e-6, expected=(4899.99, 4901.01))
    # before the anchor: widened too
    assert bounds(clock, 90.0) == pytest.approx(abs=2e-6, expected=(4899.99, 4901.01))


def test_another_clock_within_max_skew_is_a_switch_beyond_it_a_jump() -> None:
    clock = ServerClock(drift=0, max_skew=2.0, track_ttl=60.0)
    clock.observe(100.0, 100.0, 5000)  # [4900, 4901]
    clock.observe(101.0, 101.0, 5004)  # [4903, 4904]: gap exactly 2 = max_skew
    assert (clock.switches, clock.jumps, clock.max_gap, clock.tracks) == (1, 0, 2.0, 2)
    clock.observe(102.0, 102.0, 5012)  # [4910, 4911]: 6 from the nearest
    assert (clock.switches, clock.jumps, clock.max_gap, clock.tracks) == (1, 1, 6.0, 3)
    clock.observe(103.0, 103.0, 4996)  # [4893, 4894]: below all, 6 from the nearest again
    clock.observe(104.0, 104.0, 5018)  # [4914, 4915]: 3 above the newest: max_gap stays 6
    assert (clock.switches, clock.jumps, clock.max_gap) == (1, 3, 6.0)
    # The hull covers every clock seen, widened by max_skew for the ones not seen.
    assert bounds(clock, 104.0) == pytest.approx(abs=2e-6, expected=(4893.0 - 2.0, 4915.0 + 2.0))


def test_with_track_ttl_zero_a_jump_forgets_the_old_clock() -> None:
    clock = ServerClock(drift=0)
    clock.observe(100.0, 100.0, 5000)
    clock.observe(101.0, 101.0, 5010)
    assert (clock.tracks, clock.jumps, clock.max_gap) == (1, 1, 8.0)
    assert bounds(clock, 101.0) == pytest.approx(abs=2e-6, expected=(4909.0, 4910.0))


def test_a_clock_seen_again_moves_to_the_front_and_is_narrowed() -> None:
    clock = ServerClock(drift=0, track_ttl=5.0)
    clock.observe(100.0, 100.0, 5000)  # A [4900, 4901]
    clock.observe(101.0, 101.0, 5010)  # B [4909, 4910]
    clock.observe(102.0, 102.0, 5002)  # A again: [4900, 4901]
    assert clock.tracks == 2
    # At 106.5 B (last seen at 101) is out of track_ttl; A is first and always counts.
    assert bounds(clock, 106.5) == pytest.approx(abs=2e-6, expected=(4900.0, 4901.0))
    # At 106 B's anchor is exactly at the ttl's edge: it still counts.
    assert bounds(clock, 106.0) == pytest.approx(abs=2e-6, expected=(4900.0, 4910.0))


def test_forget_drops_clocks_older_than_track_ttl_and_keeps_the_edge() -> None:
    clock = ServerClock(drift=0, track_ttl=10.0)
    clock.observe(100.0, 100.0, 5000)  # A [4900, 4901] at 100
    clock.observe(110.0, 110.0, 5020)  # B at 110: A exactly 10 s old, kept
    assert clock.tracks == 2
    clock.observe(110.5, 110.5, 5040)  # C at 110.5: A dropped, B kept
    assert clock.tracks == 2
    clock.observe(111.0, 111.0, 5041)  # C seen again (intersects): forget runs there too
    assert clock.tracks == 2
    clock.observe(121.0, 121.0, 5051)  # C again at 121: B (110) is now 11 s old, dropped
    assert clock.tracks == 1


def test_at_most_max_tracks_clocks_are_remembered_newest_first() -> None:
    clock = ServerClock(drift=0, track_ttl=1000.0)
    for i in range(MAX_TRACKS + 2):
        clock.observe(100.0 + i, 100.0 + i, 5000 + 10 * i)  # offsets [4900 + 9 i, +1]: disjoint
    assert clock.tracks == MAX_TRACKS
    at = 100.0 + MAX_TRACKS + 1
    low, high = bounds(clock, at)
    assert low == pytest.approx(4900.0 + 9 * 2)  # the two oldest are gone
    assert high == pytest.approx(4901.0 + 9 * (MAX_TRACKS + 1))


def test_monotonic_at_after_the_last_observation_includes_drift() -> None:
    clock = ServerClock(drift=0.001)
    clock.observe(100.0, 100.0, 5000)  # high 4901 at anchor 100
    # latest server time at t: t + 4901 + 0.001 (t - 100) reaches 5100 at t = 199.1 / 1.001
    assert clock.monotonic_at(datetime.fromtimestamp(5100, tz=UTC)) == pytest.approx(
        199.1 / 1.001, abs=1e-9)


def test_monotonic_at_before_the_last_observation_widens_towards_the_past() -> None:
    clock = ServerClock(drift=0.001)
    clock.observe(100.0, 100.0, 5000)
    # t + 4901 + 0.001 (100 - t) = 4990  =>  t = (89 - 0.1) / 0.999
    assert clock.monotonic_at(datetime.fromtimestamp(4990, tz=UTC)) == pytest.approx(
        88.9 / 0.999, abs=1e-9)


def test_monotonic_at_takes_the_fastest_clock_and_the_skew_allowance() -> None:
    clock = ServerClock(drift=0, max_skew=1.0, track_ttl=100.0)
    clock.observe(100.0, 100.0, 5000)  # high 4901
    clock.observe(101.0, 101.0, 5011)  # high 4911: the fastest clock decides
    assert clock.monotonic_at(datetime.fromtimestamp(5100, tz=UTC)) == pytest.approx(
        5100 - 1.0 - 4911)


def test_a_takeover_that_exhausts_max_attempts_records_the_counted_attempt() -> None:
    # The lost attempt of the expired holder is what fails the lease; the record must show it.
    t = decide_claim(obs(held(until=T0, attempts=1), max_attempts=2), "b", exact(T0 + MARGIN),
                     MARGIN)
    assert t is not None and t.kind == "failed"
    assert (t.status.attempts, t.status.holder) == (2, "a")
    assert t.message == "2 attempts used of maxAttempts 2"


def test_parse_time_saturates_an_offset_of_one_minute_past_the_end() -> None:
    # A shift of +1 minute that overflows still saturates towards the future.
    assert parse_time("9999-12-31T23:59:30-00:01") == LATEST_TIME


def test_format_time_writes_utc_whatever_the_hosts_time_zone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Operator and worker images may set TZ; what they write must still be UTC.
    import time
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    try:
        plus5 = timezone(timedelta(hours=5))
        assert format_time(datetime(2026, 12, 2, 17, 0, tzinfo=plus5)) == T0_TEXT
        assert format_time(parse_time("2026-12-02T17:30:00+05:30")) == T0_TEXT
    finally:
        monkeypatch.undo()
        time.tzset()


def test_every_switch_is_counted() -> None:
    clock = ServerClock(drift=0, max_skew=5.0, track_ttl=60.0)
    clock.observe(100.0, 100.0, 5000)  # [4900, 4901]
    clock.observe(101.0, 101.0, 5003)  # [4902, 4903]: another server, 1 s apart
    clock.observe(102.0, 102.0, 5006)  # [4904, 4905]: a third one
    assert (clock.switches, clock.jumps, clock.tracks) == (2, 0, 3)


def test_with_track_ttl_zero_even_a_clock_seen_at_the_same_instant_is_forgotten() -> None:
    # Two responses received at one monotonic instant (concurrent requests) that disagree:
    # without track_ttl only the newest clock is kept, as a single server's NTP step calls for.
    clock = ServerClock(drift=0)
    clock.observe(99.0, 100.0, 5000)  # [4900, 4902] at 100
    clock.observe(99.5, 100.0, 5010)  # [4910, 4911.5] at 100
    assert clock.tracks == 1
    assert bounds(clock, 100.0) == pytest.approx(abs=2e-6, expected=(4910.0, 4911.5))


def test_a_track_ttl_of_one_second_keeps_a_clock_seen_within_it() -> None:
    clock = ServerClock(drift=0, track_ttl=1.0)
    clock.observe(100.0, 100.0, 5000)
    clock.observe(100.5, 100.5, 5010)
    assert clock.tracks == 2
