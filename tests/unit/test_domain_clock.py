"""The server-clock estimate: intervals that always contain the truth, and narrow with ticks."""

from __future__ import annotations

import random

import pytest

from joblease.domain.clock import ServerClock


def test_one_response_bounds_offset_to_a_second_plus_round_trip() -> None:
    clock = ServerClock(drift=0)
    clock.observe(sent=100.0, received=100.002, server_seconds=5000)
    now = clock.now(100.002)
    assert now.earliest.timestamp() == pytest.approx(5000.0)
    assert now.latest.timestamp() == pytest.approx(5001.002)


def test_tick_over_narrows_to_the_round_trip() -> None:
    clock = ServerClock(drift=0)
    clock.observe(100.000, 100.001, 5000)  # still second 5000
    clock.observe(100.500, 100.501, 5001)  # ticked over in between
    assert clock.error_bound(100.501).total_seconds() < 0.26
    clock.observe(100.495, 100.496, 5000)
    assert clock.error_bound(100.5).total_seconds() <= 0.003


def test_estimate_contains_true_server_time_under_random_latency() -> None:
    rng = random.Random(7)
    true_offset = 1_700_000_000.123456 - 50.0  # server = local + offset
    clock = ServerClock()
    local = 50.0
    for _ in range(500):
        local += rng.uniform(0.0, 0.05)
        served_at = local + rng.uniform(0.0, 0.004)
        received = served_at + rng.uniform(0.0, 0.004)
        clock.observe(local, received, int(served_at + true_offset))
        local = received
        now = clock.now(local)
        assert now.earliest.timestamp() <= local + true_offset <= now.latest.timestamp()
    assert clock.jumps == 0
    assert clock.error_bound(local).total_seconds() < 0.01


def test_contradicting_observation_restarts_and_counts_a_jump() -> None:
    clock = ServerClock(drift=0)
    clock.observe(10.0, 10.001, 1000)
    clock.observe(11.0, 11.001, 1600)  # server clock stepped 10 minutes
    assert clock.jumps == 1
    assert clock.now(11.001).earliest.timestamp() == pytest.approx(1600.0, abs=1e-6)


def test_drift_widens_the_interval_with_time() -> None:
    clock = ServerClock(drift=1e-4)
    clock.observe(0.0, 0.0, 100)
    assert clock.error_bound(1000.0) > clock.error_bound(0.0)


def test_unknown_clock_refuses_to_guess() -> None:
    with pytest.raises(RuntimeError, match="unknown"):
        ServerClock().now(0.0)
