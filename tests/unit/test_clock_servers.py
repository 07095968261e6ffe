"""The server-clock estimate when responses come from several API servers (docs/ha.md)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import LeaseHeldError, StaleLeaseError
from joblease.domain.lease import (
    Claim,
    LeaseSpec,
    LeaseStatus,
    Observed,
    Phase,
    decide_claim,
    decide_renew,
)
from joblease.domain.token import FencingToken


def c(holder: str, o: Observed, generation: int) -> Claim:
    """The claim a caller presents: its holder and the whole token (this incarnation's epoch)."""
    return Claim(holder, FencingToken(o.status.epoch or 0, generation))


def _sample(rng: random.Random, clock: ServerClock, local: float, offset: float) -> float:
    """One response from a server whose time is ``local + offset``; returns receive time."""
    rtt = rng.uniform(0.0002, 0.003)
    served = local + rng.uniform(0, rtt)
    clock.observe(local, local + rtt, int(served + offset))
    return local + rtt


@pytest.mark.parametrize("skew", [0.3, 1.0, 2.0])
def test_alternating_servers_within_the_bound_stay_inside_the_interval(skew: float) -> None:
    rng = random.Random(7)
    base = 1_700_000_000.0
    offsets = [base, base + skew, base + skew / 2]  # pairwise within skew
    clock = ServerClock(drift=0, max_skew=skew, track_ttl=60)
    local = 100.0
    for _ in range(300):
        local = _sample(rng, clock, local, rng.choice(offsets)) + rng.uniform(0, 0.05)
        now = clock.now(local)
        for off in offsets:  # every server's time is inside, whichever answered last
            assert now.earliest.timestamp() <= local + off <= now.latest.timestamp()
    assert clock.jumps == 0
    assert clock.switches > 0
    assert clock.max_gap <= skew


def test_disagreement_beyond_the_bound_is_counted_and_the_hull_covers_it() -> None:
    rng = random.Random(3)
    base = 1_700_000_000.0
    clock = ServerClock(drift=0, max_skew=2.0, track_ttl=60)
    local = 10.0
    for off in (base, base - 600, base, base - 600):  # one server 10 minutes slow
        local = _sample(rng, clock, local, off) + 0.01
    assert clock.jumps >= 1
    assert clock.max_gap > 590
    now = clock.now(local)
    assert now.earliest.timestamp() <= local + base - 600
    assert now.latest.timestamp() >= local + base
    assert now.error > timedelta(minutes=4)  # the margin grows: leases end early, safely


def test_a_clock_not_seen_for_track_ttl_leaves_the_hull() -> None:
    clock = ServerClock(drift=0, max_skew=0.5, track_ttl=30)
    clock.observe(10.0, 10.001, 1000)
    clock.observe(11.0, 11.001, 1601)  # an NTP step of about ten minutes
    assert clock.jumps == 1
    assert clock.error_bound(12.0) > timedelta(minutes=4)
    clock.observe(50.0, 50.001, 1640)
    assert clock.error_bound(50.001) < timedelta(seconds=2)
    assert clock.tracks == 1


def test_zero_ttl_restarts_as_a_single_server_clock_did() -> None:
    clock = ServerClock(drift=0)
    clock.observe(10.0, 10.001, 1000)
    clock.observe(11.0, 11.001, 1600)
    assert clock.jumps == 1 and clock.tracks == 1
    assert clock.now(11.001).earliest.timestamp() == pytest.approx(1600.0, abs=1e-6)


def test_max_skew_widens_both_sides_and_the_holders_deadline() -> None:
    plain = ServerClock(drift=0)
    skewed = ServerClock(drift=0, max_skew=2.0)
    for c in (plain, skewed):
        c.observe(10.0, 10.001, 1000)
    assert skewed.error_bound(10.0) - plain.error_bound(10.0) == timedelta(seconds=2)
    end = datetime.fromtimestamp(1100, tz=UTC)
    assert plain.monotonic_at(end) - skewed.monotonic_at(end) == pytest.approx(2.0)


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ServerClock(max_skew=-1)


# -- generations keep safety whatever the clocks say ------------------------------------------

def _obs(status: LeaseStatus, rv: int) -> Observed:
    return Observed("ns", "job", "uid", str(rv), 1, LeaseSpec(lease_duration_seconds=5),
                    status)


@pytest.mark.parametrize("wrong_by", [-600.0, -30.0, -2.0, 2.0, 30.0, 600.0])
def test_wrong_clock_may_move_expiry_but_never_reuses_a_generation(wrong_by: float) -> None:
    """A claimer whose clock is off takes over early or late, but always at g+1, and the
    previous holder's renewal at g is refused by its generation, not by time."""
    t0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    honest = ServerNow.exact(t0)
    first = decide_claim(_obs(LeaseStatus(), 1), "a", honest, timedelta(0))
    held = _obs(first.status, 2)
    wrong = ServerNow.exact(t0 + timedelta(seconds=wrong_by))
    try:
        second = decide_claim(held, "b", wrong, timedelta(milliseconds=250))
    except LeaseHeldError:
        assert wrong_by < 5  # refused only while the wrong clock says the lease runs
        return
    assert second.status.generation == first.status.generation + 1
    taken = _obs(second.status, 3)
    with pytest.raises(StaleLeaseError):
        decide_renew(taken, c("a", taken, first.status.generation), honest, timedelta(0))
    assert taken.status.phase == Phase.HELD and taken.status.holder == "b"


def test_environment_configures_the_model_and_refuses_typos() -> None:
    from joblease.kube.api import clock_from_env

    clock = clock_from_env({"JOBLEASE_MAX_SERVER_SKEW": "2.5", "JOBLEASE_CLOCK_TRACK_TTL": "0"})
    assert (clock.max_skew, clock.track_ttl) == (2.5, 0.0)
    assert clock_from_env({}).max_skew == 0.0 and clock_from_env({}).track_ttl == 60.0
    for bad in ("2s", "-1"):
        with pytest.raises(ValueError, match="JOBLEASE_MAX_SERVER_SKEW"):
            clock_from_env({"JOBLEASE_MAX_SERVER_SKEW": bad})
