"""The pool engine alone (``joblease.core.pool_engine``): the rules both pools drive, pinned
where a pool test could not reach them exactly (issue 30, item 4).

``tests/unit/test_pools.py`` runs every behaviour through both pools; here the engine is
given a clock the test sets, so what it reads and when is visible: no server time is read
before the first list (nor by ``live_workers`` before any answer), a wait for a wake-up is
at least ``MIN_WAIT`` and never past the caller's end, and every claim's outcome wakes the
waiting claimers.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from joblease.core.pool_engine import MIN_WAIT, Ask, PoolClock, PoolEngine, Wait
from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import format_time
from joblease.domain.lease import Observed
from joblease.kube.api import ConflictError, UnavailableError
from support.fakekube import T_NOW, lease_object

MARGIN = timedelta(seconds=1)


class Clock:
    """A transport's clocks, set by the test; counts the server-time readings."""

    def __init__(self) -> None:
        self.now = 100.0
        self.clock = ServerClock()
        self.readings = 0

    def monotonic(self) -> float:
        return self.now

    def hear(self) -> None:
        """An answer's ``Date``: the server's time is T_NOW at monotonic 100."""
        self.clock.observe(100.0, 100.0, int(T_NOW.timestamp()))

    def server_now(self) -> ServerNow:
        self.readings += 1
        return ServerNow.exact(T_NOW + timedelta(seconds=self.now - 100.0))


def engine_over(clock: Clock) -> tuple[PoolEngine, list[int]]:
    wakes: list[int] = []
    engine = PoolEngine("ns", "team=batch", PoolClock(clock, clock.server_now),  # type: ignore[arg-type]
                        presence=False, wake=lambda: wakes.append(engine.changes))
    return engine, wakes


def job(name: str, status: dict[str, Any] | None = None) -> Observed:
    return Observed.from_object(lease_object(name, status or {"phase": "Available",
                                                               "generation": 0, "epoch": 1}))


def held(name: str, seconds: float) -> Observed:
    return job(name, {"phase": "Held", "holder": "other", "generation": 1, "epoch": 1,
                      "claimId": "theirs",
                      "leaseUntil": format_time(T_NOW + timedelta(seconds=seconds))})


def test_before_the_first_list_no_server_time_is_read() -> None:
    clock = Clock()
    engine, _ = engine_over(clock)
    assert engine.decide(Ask("w", 105.0, 32), MARGIN) == Wait(5.0)
    assert engine.decide(Ask("w", None, 32), MARGIN) == Wait(None)
    assert engine.live_workers() == []
    clock.now = 106.0
    with pytest.raises(UnavailableError, match="no list of its leases"):
        engine.decide(Ask("w", 105.0, 32), MARGIN)
    assert clock.readings == 0


def test_a_wake_up_wait_is_at_least_min_wait_and_never_past_the_end() -> None:
    clock = Clock()
    clock.hear()
    engine, _ = engine_over(clock)
    engine.replace([held("busy", 0.0)], "10")  # claimable at leaseUntil + margin: 1 s on
    wait = engine.decide(Ask("w", 200.0, 32), MARGIN)
    assert isinstance(wait, Wait) and wait.seconds == pytest.approx(1.0, abs=0.01)
    clock.clock = ServerClock()  # an estimate whose certain time lies far behind: "due"
    clock.clock.observe(0.0, 0.0, int(T_NOW.timestamp()) + 3600)
    assert engine.decide(Ask("w", 200.0, 32), MARGIN) == Wait(MIN_WAIT)
    assert engine.decide(Ask("w", 100.004, 32), MARGIN) == Wait(pytest.approx(0.004))


def test_every_claims_outcome_hands_the_name_back_and_wakes_the_waiters() -> None:
    clock = Clock()
    clock.hear()
    engine, wakes = engine_over(clock)
    engine.replace([job("a")], "10")
    ask = Ask("w", None, 32)
    for outcome in (None, ConflictError(409, "Conflict", "someone was faster")):
        chosen = engine.decide(ask, MARGIN)
        assert isinstance(chosen, Observed) and chosen.name == "a"
        assert isinstance(engine.decide(ask, MARGIN), Wait)  # "a" is being claimed
        before = len(wakes)
        assert engine.settle(chosen, outcome) is None
        assert len(wakes) == before + 1
    assert engine.conflicts == 1  # the raise is not a refusal; the 409 is
    assert engine.view.is_set_aside("a")


def test_closing_is_said_once_and_ends_every_waiting_decision() -> None:
    clock = Clock()
    clock.hear()
    engine, wakes = engine_over(clock)
    engine.replace([], "10")
    assert isinstance(engine.decide(Ask("w", None, 32), MARGIN), Wait)
    assert engine.close() is True and engine.close() is False
    assert wakes == [1, 2]  # the list, then the close; the second close changed nothing
    assert engine.decide(Ask("w", None, 32), MARGIN) is None


def test_a_dead_feed_is_raised_with_its_cause() -> None:
    engine, _ = engine_over(Clock())
    boom = RuntimeError("boom")
    engine.died(boom)
    with pytest.raises(Exception, match="its watch stopped") as err:
        engine.decide(Ask("w", None, 32), MARGIN)
    assert err.value.__cause__ is boom


def test_the_thread_pools_clock_reading_is_the_transports_own() -> None:
    """``PoolClock`` without an ``estimate`` reads the transport's estimate itself."""
    api = SimpleNamespace(clock=ServerClock(), monotonic=lambda: 5.0)
    api.clock.observe(5.0, 5.0, int(T_NOW.timestamp()))
    now = PoolClock(api).server_now()  # type: ignore[arg-type]
    assert now.earliest == T_NOW and now.latest == T_NOW + timedelta(seconds=1)
