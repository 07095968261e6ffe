"""``joblease.domain.holder``: what a holder concludes from an answer about its claim.

Shared by ``joblease.sdk`` and ``joblease.aio``; each rule pinned here holds for both
clients: the deadline on the drift-aware clock, a resumed claim that is not current ends
now, a token or uid the holder did not claim is refused, the renewal cadence and backoff,
and how long a waiting claimer sleeps.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import LeaseExpiredError, LeaseFinishedError, LeaseGoneError
from joblease.domain.holder import (
    MAX_RETRY_DELAY,
    MIN_RENEW_INTERVAL,
    RENEW_FRACTION,
    ClaimDecider,
    RenewalPace,
    Standing,
    expired_error,
    finished_error,
    for_incarnation,
    loss_at_check,
    renew_interval,
    retry_delay,
    seconds_until_claimable,
    standing,
)
from joblease.domain.lease import Claim, LeaseStatus, Observed, Phase, Transition
from joblease.domain.token import FencingToken

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
TOKEN = FencingToken(100, 3)
CLAIM = Claim("a", TOKEN, "cid-1")
UNTIL = T0 + timedelta(seconds=30)


def observed(uid: str = "u1", **status: Any) -> Observed:
    fields: dict[str, Any] = {"phase": "Held", "holder": "a", "generation": 3, "epoch": 100,
                              "claimId": "cid-1", "leaseUntil": "2026-12-03T12:00:30.000Z"}
    fields.update(status)
    return Observed.from_object({
        "metadata": {"name": "job", "namespace": "ns", "uid": uid, "resourceVersion": "7"},
        "spec": {"leaseDurationSeconds": 30},
        "status": {k: v for k, v in fields.items() if v is not None}})


def exact_clock() -> ServerClock:
    """A clock whose server time at local monotonic 0 lies in [T0, T0 + 1)."""
    clock = ServerClock()
    clock.observe(0.0, 0.0, int(T0.timestamp()))
    return clock


def follow(obs: Observed, *, resumed: bool = False, claim: Claim = CLAIM,
           margin: timedelta = timedelta(seconds=2)) -> Standing:
    return standing(obs, claim, "u1", resumed=resumed, margin=margin, clock=exact_clock(),
                    now=5.0)


# -- standing ---------------------------------------------------------------------------------

def test_a_held_claims_deadline_is_where_the_server_may_reach_the_end_minus_the_margin() -> None:
    clock = exact_clock()
    got = follow(observed())
    assert got.held is True and got.lease_until == UNTIL
    assert got.deadline == clock.monotonic_at(UNTIL - timedelta(seconds=2))
    # the server may be a whole second ahead at monotonic 0 (Date resolution), so the
    # holder must stop a second earlier still, and a little more for drift
    assert 26.99 < got.deadline < 27.0


def test_a_wider_margin_moves_the_deadline_earlier_by_as_much() -> None:
    narrow = follow(observed(), margin=timedelta(seconds=1)).deadline
    wide = follow(observed(), margin=timedelta(seconds=3)).deadline
    assert narrow - wide == pytest.approx(2.0, abs=1e-3)


@pytest.mark.parametrize("status", [{"phase": "Completed"}, {"phase": "Available"},
                                    {"leaseUntil": None}])
def test_a_claim_that_is_no_longer_held_or_has_no_end_ends_now(status: dict[str, Any]) -> None:
    obs = observed(**status)
    got = follow(obs)
    assert got.deadline == 5.0 and got.held is True
    assert got.lease_until == obs.status.lease_until  # the end as stored, for the caller


def test_a_resumed_claim_that_is_current_is_followed_like_a_held_one() -> None:
    assert follow(observed(), resumed=True) == follow(observed())
    without_id = Claim("a", TOKEN, None)
    got = follow(observed(), resumed=True, claim=without_id)
    assert got.held is True and got.deadline > 5.0


@pytest.mark.parametrize("status", [
    {"phase": "Expired"}, {"holder": "b"}, {"generation": 4}, {"epoch": 101},
    {"claimId": "cid-2"},
], ids=["phase", "holder", "generation", "epoch", "claim-id"])
def test_a_resumed_claim_that_is_not_current_ends_now_and_is_not_held(
        status: dict[str, Any]) -> None:
    got = follow(observed(**status), resumed=True)
    assert got == Standing(UNTIL, 5.0, held=False)


@pytest.mark.parametrize("obs", [observed(generation=4), observed(epoch=99), observed("u2")],
                         ids=["generation", "epoch", "uid"])
def test_an_answer_with_another_token_or_uid_is_refused_not_followed(obs: Observed) -> None:
    with pytest.raises(LeaseGoneError) as err:
        follow(obs)
    assert str(err.value) == (
        f"JobLease ns/job held by this caller is gone: the server returned token "
        f"{obs.status.token()} for a lease held as {TOKEN}")


# -- for_incarnation, finished_error -----------------------------------------------------------

def test_a_decision_for_one_incarnation_refuses_another_and_passes_the_same() -> None:
    seen: list[tuple[Observed, ServerNow]] = []
    now = ServerNow.exact(T0)

    def decide(obs: Observed, at: ServerNow) -> None:
        seen.append((obs, at))

    ours = for_incarnation("u1", decide)
    assert ours(observed("u1"), now) is None and seen == [(observed("u1"), now)]
    with pytest.raises(LeaseGoneError, match=r"ns/job .* gone: re-created \(uid u1 is now u2\)"):
        ours(observed("u2"), now)
    assert len(seen) == 1


def test_a_write_that_failed_the_lease_is_reported_as_finished() -> None:
    obs = observed(phase="Failed", generation=3)
    err = finished_error(obs, Transition("failed", LeaseStatus(), "3 attempts used"))
    assert isinstance(err, LeaseFinishedError)
    assert (err.name, err.phase, err.generation) == ("job", Phase.FAILED.value, 3)
    assert str(err).endswith("cannot be claimed again: 3 attempts used")


# -- ClaimDecider ------------------------------------------------------------------------------

def test_a_refused_write_that_only_recorded_used_up_attempts_reads_as_finished() -> None:
    """The claimer's decision was "Failed" (bug 16): a 403 for that write means the lease
    cannot be claimed again, said as the finished error naming the version decided from."""
    last_attempt = Observed.from_object({  # b's lease ran out an hour ago: its 3rd attempt
        "metadata": {"name": "job", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
        "spec": {"leaseDurationSeconds": 30, "maxAttempts": 3},
        "status": {"phase": "Held", "holder": "b", "generation": 3, "epoch": 100,
                   "attempts": 2, "leaseUntil": "2026-12-03T11:00:00.000Z"}})
    decider = ClaimDecider("a", timedelta(seconds=1), "cid-9")
    assert decider.exhaustion_refused() is None  # nothing decided yet
    transition = decider(last_attempt, ServerNow.exact(T0))
    assert transition is not None and transition.kind == "failed"
    assert decider.last is transition and decider.observed is last_attempt
    err = decider.exhaustion_refused()
    assert isinstance(err, LeaseFinishedError)
    assert (err.name, err.phase, err.generation) == ("job", "Held", 3)
    assert str(err) == (
        "lease 'job' is Held at generation 3 (token 100/3) and cannot be claimed again: 3 "
        "attempts used of "
        "maxAttempts 3; this identity may not record it (holder-only admission policy): the "
        "operator marks it Failed")


def test_a_refused_ordinary_claim_is_not_turned_into_a_finished_error() -> None:
    decider = ClaimDecider("a", timedelta(seconds=1), "cid-9")
    transition = decider(observed(phase="Available", holder=None, claimId=None,
                                  leaseUntil=None), ServerNow.exact(T0))
    assert transition is not None and transition.kind == "claimed"
    assert decider.exhaustion_refused() is None


# -- cadence ------------------------------------------------------------------------------------

def test_renewals_come_every_third_of_what_is_left_but_not_more_often_than_50_ms() -> None:
    assert RENEW_FRACTION == 1 / 3
    assert renew_interval(9.0) == pytest.approx(3.0)
    assert renew_interval(9.0, 0.5) == 4.5
    assert renew_interval(0.15) == MIN_RENEW_INTERVAL == 0.05
    assert renew_interval(-1.0) == MIN_RENEW_INTERVAL


def test_retries_back_off_from_50_ms_doubling_to_one_second() -> None:
    assert [retry_delay(n) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert retry_delay(1000) == MAX_RETRY_DELAY == 1.0


# -- waiting claimers ---------------------------------------------------------------------------

def test_a_claimer_sleeps_until_the_earliest_server_time_passes_the_end_plus_margin() -> None:
    now = ServerNow(T0 + timedelta(seconds=10), T0 + timedelta(seconds=11))
    margin = timedelta(seconds=1)
    assert seconds_until_claimable(UNTIL, margin, now) == 21.0
    assert seconds_until_claimable(T0 + timedelta(seconds=11), margin, now) == 2.0
    assert seconds_until_claimable(T0, margin, now) == 0.0
    assert seconds_until_claimable(None, margin, now) == 0.0


def test_the_renewal_pace_backs_off_after_failures_and_returns_to_the_interval() -> None:
    pace = RenewalPace(3.0)
    assert (pace.pause(10.0), pace.pause(1.2), pace.pause(-1.0)) == (3.0, 1.2, 0.0)  # deadline
    assert [pace.failed() for _ in range(3)] == [0.1, 0.2, 0.4] and pace.failures == 3
    assert pace.pause(10.0) == 0.4
    pace.renewed()
    assert pace.pause(10.0) == 3.0 and pace.failures == 3  # failures are a running count


# -- what a holding declares when it looks --------------------------------------------------------

class HeldState:
    """The part of a held lease ``loss_at_check`` reads."""

    def __init__(self, *, left: float = 5.0, loss: Exception | None = None) -> None:
        self.name, self.holder, self.generation = "job", "a", 7
        self.token = FencingToken(3, 7)
        self.lease_until = datetime(2026, 12, 5, 12, tzinfo=UTC)
        self.deadline, self.loss, self.left = 0.0, loss, left

    def remaining(self) -> float:
        return self.left

    def valid(self) -> bool:
        return self.loss is None and self.left > 0


def test_a_check_keeps_a_loss_met_outside_and_otherwise_declares_an_expiry() -> None:
    stale = LeaseGoneError("job", "ns", "deleted")
    assert loss_at_check(HeldState(loss=stale), 5.0) is stale  # type: ignore[arg-type]
    assert loss_at_check(HeldState(), 5.0) is None  # type: ignore[arg-type]
    for lease, remaining in ((HeldState(), 0.0), (HeldState(left=0.0), 5.0)):
        err = loss_at_check(lease, remaining)  # type: ignore[arg-type]
        assert isinstance(err, LeaseExpiredError)
        assert (err.name, err.holder, err.generation, err.lease_until) == (
            "job", "a", 7, datetime(2026, 12, 5, 12, tzinfo=UTC))
    assert expired_error(HeldState()).generation == 7  # type: ignore[arg-type]
