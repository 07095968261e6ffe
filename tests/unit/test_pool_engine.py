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

from joblease.core.pool_engine import MIN_WAIT, Adopt, Ask, PoolClock, PoolEngine, Wait
from joblease.core.scope import FULL, Scope
from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import PoolClosedError, format_time
from joblease.domain.lease import Observed, dispatch_claim_id
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


# -- what the feeds and presence deliver, counted and folded (mutation pass, 2026-12-06) ----

UNTIL = T_NOW + timedelta(seconds=60)


def listed_engine() -> tuple[PoolEngine, Clock]:
    clock = Clock()
    clock.hear()
    engine, _ = engine_over(clock)
    return engine, clock


def version(obs: Observed, rv: str, uid: str | None = None) -> Observed:
    """``obs`` at resourceVersion ``rv`` (and of incarnation ``uid``)."""
    obj = lease_object(obs.name, {"phase": "Available", "generation": 0, "epoch": 1})
    obj["metadata"]["resourceVersion"] = rv
    obj["metadata"]["uid"] = uid or f"uid-{obs.name}"
    return Observed.from_object(obj)


def test_the_engine_as_one_feeds_sink_counts_and_folds_what_it_is_given() -> None:
    engine, _ = listed_engine()
    a, b = version(job("a"), "10"), version(job("b"), "10")
    engine.replace([a, b], "10")
    engine.replace([a], "11")  # a re-list after a 410
    assert engine.listed == 3 and engine.view.resource_version == "11"
    engine.apply("MODIFIED", version(a, "12"))
    assert engine.events == 1 and engine.view.get("a").resource_version == "12"  # type: ignore[union-attr]
    engine.apply("DELETED", version(a, "13"))
    assert engine.events == 2 and engine.view.get("a") is None
    engine.bookmark("20")
    assert engine.view.resource_version == "20"


def test_stream_events_are_counted_and_folded_with_their_kind() -> None:
    engine, _ = listed_engine()
    sink = engine.stream_sink(engine.open_scope(FULL), 0)
    sink.replace([version(job("a"), "10"), version(job("b"), "10")], "10")
    sink.apply("MODIFIED", version(job("a"), "11"))
    sink.apply("DELETED", version(job("b"), "12"))
    assert engine.events == 2 and engine.listed == 2
    assert engine.view.get("b") is None
    assert engine.view.get("a").resource_version == "11"  # type: ignore[union-attr]


def narrow_engine() -> tuple[PoolEngine, Any, Any]:
    engine, _ = listed_engine()
    epoch = engine.open_scope(Scope("w"))
    return engine, engine.stream_sink(epoch, 0), engine.stream_sink(epoch, 1)


def test_in_the_narrow_scope_a_job_leaves_the_view_only_when_no_stream_holds_it() -> None:
    engine, mine, others = narrow_engine()
    a = version(job("a"), "10")
    mine.replace([a], "10")
    others.replace([a, version(job("b"), "10")], "10")
    assert engine.scope == Scope("w") and engine.listed == 3
    mine.apply("DELETED", version(a, "11"))  # left this worker's part: still not dispatched
    assert engine.view.get("a") is not None
    others.apply("DELETED", version(job("b"), "12"))  # in no stream: gone
    assert engine.view.get("b") is None
    others.apply("DELETED", version(job("c"), "13"))  # a stream that never held it
    assert engine.events == 3


def test_a_deleted_of_another_incarnation_leaves_the_streams_own_copy_alone() -> None:
    engine, mine, others = narrow_engine()
    a = version(job("a"), "10", uid="first")
    mine.replace([a], "10")
    others.replace([], "10")
    mine.apply("DELETED", version(a, "11", uid="second"))  # not the incarnation it holds
    assert engine.view.get("a") is not None
    assert engine._merge.event(0, "DELETED", version(a, "12", uid="second")) == (  # type: ignore[union-attr]
        "DELETED", version(a, "12", uid="second"))


def test_a_narrow_view_without_the_dispatchers_count_cannot_tell_the_pools() -> None:
    engine, mine, others = narrow_engine()
    mine.replace([], "10")
    others.replace([], "10")
    with pytest.raises(UnavailableError) as err:
        engine.unfinished()
    assert (err.value.status, err.value.reason, err.value.message) == (
        0, "NotSynced", "JobLease pool 'team=batch': watching only its own jobs, and the "
        "dispatcher's record tells no count of the pool's")
    engine.dispatcher(UNTIL, 4)
    assert engine.unfinished() == 4


def test_presence_lists_note_the_live_workers_and_forget_who_left() -> None:
    engine, _ = listed_engine()
    engine.replace([], "10")
    engine.workers({"w1": UNTIL, "w2": UNTIL})
    assert engine.live_workers() == ["w1", "w2"]
    engine.workers({"w1": UNTIL})
    assert engine.live_workers() == ["w1"]
    engine.workers({})
    assert engine.live_workers() == []


def test_every_refusal_is_counted_and_sets_aside_only_the_version_tried() -> None:
    engine, _ = listed_engine()
    engine.replace([version(job("a"), "10"), version(job("b"), "10")], "10")
    ask = Ask("w", None, 32)
    first = engine.decide(ask, MARGIN)
    assert isinstance(first, Observed)
    engine.settle(first, ConflictError(409, "Conflict", "someone was faster"))
    assert engine.conflicts == 1 and engine.view.is_set_aside(first.name)
    second = engine.decide(ask, MARGIN)
    assert isinstance(second, Observed) and second.name != first.name
    engine.apply("MODIFIED", version(second, "11"))  # the watch brought a newer version
    engine.settle(second, ConflictError(409, "Conflict", "someone was faster"))
    assert engine.conflicts == 2
    assert not engine.view.is_set_aside(second.name)  # version 11 was not tried yet


def test_a_failing_list_is_counted_and_logged_and_a_dead_feed_said_whole(
        caplog: pytest.LogCaptureFixture) -> None:
    engine, _ = engine_over(Clock())
    down = UnavailableError(503, "ServiceUnavailable", "etcd is down")
    engine.trouble(down)
    engine.stream_trouble(0, down)  # the scope of epoch 0 is the current one
    assert engine.watch_errors == 2
    boom = RuntimeError("boom")
    engine.died(boom)
    assert engine.closed
    assert [(r.levelname, r.getMessage(), r.exc_info and r.exc_info[1]) for r in caplog.records
            ] == [("WARNING", f"JobLease pool 'team=batch': list/watch failed ({down}); "
                   "retrying", None)] * 2 + [
        ("ERROR", "JobLease pool 'team=batch': the watch stopped", boom)]
    with pytest.raises(PoolClosedError) as err:
        engine.decide(Ask("w", None, 32), MARGIN)
    assert str(err.value) == "JobLease pool 'team=batch': its watch stopped: RuntimeError('boom')"


def test_at_its_end_exactly_a_claim_gives_up_and_a_first_list_is_overdue() -> None:
    engine, clock = listed_engine()
    with pytest.raises(UnavailableError, match="no list of its leases"):
        engine.decide(Ask("w", clock.now, 32), MARGIN)  # no time left, no list: overdue
    engine.replace([], "10")
    assert engine.decide(Ask("w", clock.now, 32), MARGIN) is None  # no time left: give up


def dispatched_engine() -> tuple[PoolEngine, Clock]:
    clock = Clock()
    clock.hear()
    engine = PoolEngine("ns", "team=batch", PoolClock(clock, clock.server_now),  # type: ignore[arg-type]
                        presence=True, slots=3)
    return engine, clock


def test_a_dispatched_worker_announces_its_slots_and_waits_at_most_until_the_lapse() -> None:
    engine, _ = dispatched_engine()
    presence = engine.announce("w")
    assert presence is not None and presence.slots == 3
    engine.replace([], "10")
    engine.dispatcher(T_NOW + timedelta(seconds=5), 0)
    wait = engine.decide(Ask("w", None, 32), MARGIN)
    assert isinstance(wait, Wait) and wait.seconds == pytest.approx(5.0, abs=0.01)


def test_an_assignment_is_handed_to_one_claimer_only() -> None:
    engine, _ = dispatched_engine()
    at = format_time(T_NOW - timedelta(seconds=1))  # claimed for "w", not yet adopted
    mine = job("mine", {"phase": "Held", "holder": "w", "generation": 1, "epoch": 1,
                        "claimId": dispatch_claim_id("x"), "acquireTime": at,
                        "renewTime": at,
                        "leaseUntil": format_time(T_NOW + timedelta(seconds=30))})
    engine.replace([mine], "10")
    engine.dispatcher(T_NOW + timedelta(seconds=60), 1)
    first = engine.decide(Ask("w", None, 32), MARGIN)
    assert isinstance(first, Adopt) and first.job.name == "mine"
    assert isinstance(engine.decide(Ask("w", None, 32), MARGIN), Wait)  # a sibling: not twice


def test_a_streams_list_keeps_its_resource_version() -> None:
    engine, _ = listed_engine()
    engine.stream_sink(engine.open_scope(FULL), 0).replace([], "42")
    assert engine.view.resource_version == "42"
