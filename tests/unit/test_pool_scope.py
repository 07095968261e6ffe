"""A dispatched worker's narrow feed (issue 30): the scope rule and the merge of two streams.

``joblease.core.scope`` folds the streams of a scope (``status.holder=<me>`` and
``spec.dispatch.enabled!=true``) into one view; ``PoolEngine.wanted_scope`` says when a worker
watches only those. Each test tries to break one promise: a job one stream still shows never
leaves the view on the other's DELETED (which carries stale content); a switch of scope
shows the old view until every new stream listed, so a held job stays in view; a stopped
scope's late deliveries are dropped; the scope is narrow only while the dispatcher's record
is live on the server's earliest time; a narrow view never claims the pool empty on its own.
The real API server's side (what ``!=true`` matches) is ``tests/cluster/test_dispatch_feed.py``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from joblease.core.pool_engine import (
    FIRST_PRESENCE_WAIT,
    RECONFIRM_SECONDS,
    Ask,
    ConfirmEmpty,
    PoolClock,
    PoolEngine,
    Wait,
)
from joblease.core.presence import Presence, dispatcher_unfinished
from joblease.core.scope import (
    FULL,
    NOT_DISPATCHED,
    PENDING,
    Scope,
    StreamMerge,
    escape_field_value,
)
from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.lease import Observed
from joblease.kube.api import UnavailableError
from support.fakekube import T_NOW, lease_object

MARGIN = timedelta(seconds=1)


def job(name: str, version: int, uid: str | None = None, **status: Any) -> Observed:
    obj = lease_object(name, {"phase": "Available", "generation": 0, "epoch": 1, **status})
    obj["metadata"]["resourceVersion"] = str(version)
    if uid is not None:
        obj["metadata"]["uid"] = uid
    return Observed.from_object(obj)


# -- the scope's streams ------------------------------------------------------------------------

def test_the_full_scope_is_one_stream_and_the_narrow_one_two() -> None:
    assert FULL.fields() == (None,) and not FULL.narrow
    assert Scope("system:serviceaccount:ns:w1").fields() == (
        "status.holder=system:serviceaccount:ns:w1", NOT_DISPATCHED)


def test_a_holder_is_escaped_as_kubernetes_escapes_field_values() -> None:
    assert escape_field_value("a,b=c\\d") == "a\\,b\\=c\\\\d"
    assert Scope("x,status.phase=Held").fields()[0] == "status.holder=x\\,status.phase\\=Held"


# -- the merge -----------------------------------------------------------------------------------

def test_nothing_reaches_the_view_until_every_stream_listed_then_the_newest_of_each() -> None:
    merge = StreamMerge(2)
    assert merge.listed(0, [job("a", 5), job("both", 7)]) is None
    assert merge.event(0, "MODIFIED", job("a", 8)) is None  # the view still shows the old scope
    union = merge.listed(1, [job("b", 6), job("both", 4)])
    assert union is not None
    assert sorted((o.name, o.resource_version) for o in union) == [
        ("a", "8"), ("b", "6"), ("both", "7")]


def test_a_delete_from_one_stream_keeps_a_job_the_other_still_shows() -> None:
    merge = StreamMerge(2)
    merge.listed(0, [job("mine", 5)])  # held by me, and did not opt in: in both streams
    merge.listed(1, [job("mine", 5)])
    # I released it: it left the holder stream (a DELETED with the *old* content) first
    assert merge.event(0, "DELETED", job("mine", 9)) == ("MODIFIED", job("mine", 5))
    assert merge.event(1, "MODIFIED", job("mine", 9)) == ("MODIFIED", job("mine", 9))
    assert merge.event(1, "DELETED", job("mine", 12)) == ("DELETED", job("mine", 12))


def test_a_stale_delete_of_an_old_incarnation_keeps_the_new_one() -> None:
    merge = StreamMerge(2)
    merge.listed(0, [job("x", 5, uid="old")])
    merge.listed(1, [])
    assert merge.event(1, "ADDED", job("x", 20, uid="new")) == ("ADDED", job("x", 20, uid="new"))
    # the old incarnation's delete arrives late on the other stream: not the new one's
    assert merge.event(0, "DELETED", job("x", 15, uid="old")) == (
        "DELETED", job("x", 15, uid="old"))  # the view ignores it: another uid than it holds
    assert merge.event(1, "DELETED", job("x", 25, uid="new")) == (
        "DELETED", job("x", 25, uid="new"))


def test_a_relist_of_one_stream_drops_only_what_no_stream_shows() -> None:
    merge = StreamMerge(2)
    merge.listed(0, [job("a", 1), job("shared", 2)])
    merge.listed(1, [job("shared", 2), job("b", 3)])
    union = merge.listed(0, [])  # after a 410: "a" and "shared" left stream 0
    assert union is not None and sorted(o.name for o in union) == ["b", "shared"]


# -- the engine's rule -----------------------------------------------------------------------------

class Clock:
    """A transport's clocks, set by the test (server time T_NOW at monotonic 100)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.clock = ServerClock()
        self.clock.observe(100.0, 100.0, int(T_NOW.timestamp()))

    def monotonic(self) -> float:
        return self.now

    def server_now(self) -> ServerNow:
        return ServerNow.exact(T_NOW + timedelta(seconds=self.now - 100.0))


def narrowable(slots: int | None = 2, *, inbox: bool = False) -> tuple[PoolEngine, Clock]:
    """An engine whose worker ``w`` announced ``slots`` (its presence is not run here).

    ``inbox``: it reads its inbox (proposals); else it adopts what is claimed for it.
    """
    clock = Clock()
    engine = PoolEngine("ns", "team=batch", PoolClock(clock, clock.server_now),  # type: ignore[arg-type]
                        slots=slots)
    engine.presence = Presence("ns", "team=batch", "w", slots=slots)
    engine.presence.reads_inbox = inbox and slots is not None
    return engine, clock


def test_narrow_only_while_the_record_lives_and_only_for_a_worker_who_announced_slots() -> None:
    engine, clock = narrowable()
    engine.dispatcher(None)  # its presence listed: no record
    assert engine.wanted_scope() == FULL and engine.scope_wake() is None
    engine.dispatcher(T_NOW + timedelta(seconds=10))
    assert engine.wanted_scope() == Scope("w")
    assert engine.scope_wake() == pytest.approx(10.0, abs=0.01)  # woken when it lapses
    clock.now = 110.0  # the record's end, on the server's earliest time: turns need it all
    assert engine.wanted_scope() == FULL and engine.scope_wake() is None
    unannounced, _ = narrowable(slots=None)
    assert unannounced.wanted_scope() == FULL  # never given work: it lists the pool at once
    unannounced.dispatcher(T_NOW + timedelta(seconds=10))
    assert unannounced.wanted_scope() == FULL  # never given work: it must see the whole pool


def test_a_worker_reading_its_inbox_watches_no_echo_of_its_own_writes() -> None:
    """Issue 30's events per job: a worker that claims from proposals does not watch
    ``status.holder=<itself>`` (each of its claims and completions came back to it as an
    event, 2 of a drained job's 6); only the jobs it takes by turns."""
    engine, _ = narrowable(inbox=True)
    engine.dispatcher(T_NOW + timedelta(seconds=10))
    scope = engine.wanted_scope()
    assert scope == Scope("w", own=False) and scope.narrow
    assert scope.fields() == (NOT_DISPATCHED,)
    assert Scope("w").fields()[0] == "status.holder=w"  # an adopter still watches its own


def test_a_refused_inbox_watches_its_own_jobs_again_before_the_dispatcher_claims_for_it(
        ) -> None:
    """Refused its inbox (no ``watch`` on Leases), a worker is claimed *for* once its
    presence says so; it must see those claims: its scope changes at once, and the drivers
    are woken (the engine's change count moves) to switch feeds."""
    engine, _ = narrowable(inbox=True)
    engine.dispatcher(T_NOW + timedelta(seconds=10))
    assert engine.wanted_scope() == Scope("w", own=False)
    changes = engine.changes
    engine.inbox_refused()
    assert engine.changes > changes
    assert engine.wanted_scope() == Scope("w") and len(Scope("w").fields()) == 2
    assert engine.presence is not None and not engine.presence.reads_inbox


def test_a_worker_that_may_be_dispatched_lists_nothing_before_its_presence_answers() -> None:
    """Issue 30: listing the whole pool first, to switch to its own part a moment later, cost
    20 workers 20,000 decoded jobs on a 1,000-job pool. Nothing is listed until the first
    presence list says which part it needs; then the narrow part only."""
    engine, _ = narrowable()
    assert engine.wanted_scope() == PENDING and PENDING.fields() == ()
    assert engine.scope_wake() == pytest.approx(FIRST_PRESENCE_WAIT, abs=0.01)
    engine.dispatcher(T_NOW + timedelta(seconds=10))  # the first list: a live dispatcher
    assert engine.wanted_scope() == Scope("w")  # never the whole pool
    lone, _ = narrowable()
    lone.dispatcher(None)  # the first list: no dispatcher
    assert lone.wanted_scope() == FULL


def test_a_presence_that_never_answers_delays_the_first_list_by_a_bounded_wait() -> None:
    engine, clock = narrowable()
    assert engine.wanted_scope() == PENDING
    clock.now += FIRST_PRESENCE_WAIT  # no answer (a transient failure): list anyway
    assert engine.wanted_scope() == FULL
    refused, _ = narrowable()
    assert refused.presence is not None
    refused.presence.enabled = False  # refused (no RBAC on Leases): presence is off
    assert refused.wanted_scope() == FULL
    other = Clock()
    off = PoolEngine("ns", "team=batch", PoolClock(other, other.server_now),  # type: ignore[arg-type]
                     slots=2, presence=False)
    assert off.wanted_scope() == FULL


def test_a_switch_shows_the_old_view_until_every_new_stream_listed_and_drops_late_ones() -> None:
    engine, _ = narrowable()
    full = engine.open_scope(FULL)
    engine.stream_sink(full, 0).replace([job("held-by-me", 3, holder="w", phase="Held"),
                                         job("theirs", 4)], "4")
    narrow = engine.open_scope(Scope("w"))
    engine.stream_sink(narrow, 0).replace([job("held-by-me", 3, holder="w", phase="Held")], "9")
    assert engine.view.get("theirs") is not None and engine.scope == FULL  # not complete yet
    engine.stream_sink(full, 0).apply("ADDED", job("late", 8))  # the stopped feed's last word
    assert engine.view.get("late") is None
    engine.stream_sink(narrow, 1).replace([job("plain", 6)], "9")
    assert engine.scope == Scope("w")
    assert sorted(o.name for o in engine.view.in_order()) == ["held-by-me", "plain"]
    assert (engine.listed, engine.events, engine.scopes) == (4, 0, 2)


def test_a_narrow_view_counts_the_pool_from_the_dispatchers_record_never_from_itself() -> None:
    engine, _ = narrowable()
    engine.dispatcher(T_NOW + timedelta(seconds=10))
    epoch = engine.open_scope(Scope("w"))
    engine.stream_sink(epoch, 0).replace([], "5")
    engine.stream_sink(epoch, 1).replace([], "5")
    ask = Ask("w", None, 32, until_empty=True)
    with pytest.raises(UnavailableError):
        engine.unfinished()  # the record publishes no count: unknown, not 0
    assert isinstance(engine.decide(ask, MARGIN), Wait)  # the narrow view alone is empty
    engine.dispatcher(T_NOW + timedelta(seconds=10), unfinished=3)
    assert engine.unfinished() == 3
    engine.dispatcher(T_NOW + timedelta(seconds=10), unfinished=0)
    assert engine.unfinished() == 0
    assert stops_once_confirmed(engine, ask)  # the pool is empty, and the server agrees
    engine.stream_sink(epoch, 1).apply("ADDED", job("new", 7))  # fresher than the record
    assert engine.unfinished() == 1


def test_a_narrow_worker_told_by_its_inbox_that_the_pool_is_empty_stops_at_once() -> None:
    """The inbox's mark is the dispatcher's count of 0, sooner than its record's (#62)."""
    engine, _ = narrowable(inbox=True)
    engine.dispatcher(T_NOW + timedelta(seconds=10), unfinished=3)  # the record, seconds old
    epoch = engine.open_scope(Scope("w", own=False))
    engine.stream_sink(epoch, 0).replace([], "5")
    ask = engine.ask("w", None, 32, until_empty=True)
    assert engine.presence is not None and engine.presence.waits_for_empty  # announced
    assert engine.unfinished() == 3 and isinstance(engine.decide(ask, MARGIN), Wait)
    engine.inbox((), pool_empty=True)
    assert engine.unfinished() == 0 and stops_once_confirmed(engine, ask)  # at once
    engine.inbox((), pool_empty=False)  # a job arrived: the dispatcher took the mark back
    assert engine.unfinished() == 3 and isinstance(engine.decide(ask, MARGIN), Wait)
    engine.inbox((), pool_empty=True)
    engine.stream_sink(epoch, 0).apply("ADDED", job("plain", 7))  # its own view: fresher
    assert engine.unfinished() == 1


def stops_once_confirmed(engine: PoolEngine, ask: Ask) -> bool:
    """The narrow engine asks the API server first (#63); told the pool is empty, it stops."""
    confirm = engine.decide(ask, MARGIN)
    assert isinstance(confirm, ConfirmEmpty)
    engine.confirmed(confirm, unfinished=False)
    return engine.decide(ask, MARGIN) is None


def dead_dispatchers_word() -> tuple[PoolEngine, Clock, Ask]:
    """A narrow engine whose record (alive 10 s more) and inbox both say the pool is empty."""
    engine, clock = narrowable(inbox=True)
    engine.dispatcher(T_NOW + timedelta(seconds=10), unfinished=0)
    epoch = engine.open_scope(Scope("w", own=False))
    engine.stream_sink(epoch, 0).replace([], "5")
    engine.inbox((), pool_empty=True)
    return engine, clock, engine.ask("w", None, 32, until_empty=True)


def test_a_narrow_worker_does_not_stop_on_a_count_of_0_the_api_server_contradicts() -> None:
    """#63: a dead dispatcher's last word outlives it until its record lapses. The server
    found an unfinished job: wait (asking again after RECONFIRM_SECONDS), never stop."""
    engine, clock, ask = dead_dispatchers_word()
    confirm = engine.decide(ask, MARGIN)
    assert isinstance(confirm, ConfirmEmpty)
    engine.confirmed(confirm, unfinished=True)
    wait = engine.decide(ask, MARGIN)
    assert isinstance(wait, Wait) and wait.seconds == pytest.approx(RECONFIRM_SECONDS)
    clock.now += RECONFIRM_SECONDS / 2
    assert isinstance(engine.decide(ask, MARGIN), Wait)  # the same word: not asked again yet
    clock.now += RECONFIRM_SECONDS / 2
    again = engine.decide(ask, MARGIN)
    assert isinstance(again, ConfirmEmpty) and again.word == confirm.word
    engine.confirmed(again, unfinished=False)  # the job finished meanwhile
    assert engine.decide(ask, MARGIN) is None


def test_a_failed_confirmation_never_stops_a_worker() -> None:
    engine, _, ask = dead_dispatchers_word()
    confirm = engine.decide(ask, MARGIN)
    assert isinstance(confirm, ConfirmEmpty)
    engine.confirmed(confirm, unfinished=None)  # the list failed
    assert isinstance(engine.decide(ask, MARGIN), Wait)


def test_a_confirmation_holds_for_the_word_it_checked_only() -> None:
    """A new word of the dispatcher (its count, its mark) is asked about again: an answer
    about an older word neither stops nor holds the worker."""
    engine, _, ask = dead_dispatchers_word()
    old = engine.decide(ask, MARGIN)
    assert isinstance(old, ConfirmEmpty)
    engine.inbox((), pool_empty=False)  # the mark taken back, the record's 0 remains
    engine.confirmed(old, unfinished=False)  # the late answer to the old word
    new = engine.decide(ask, MARGIN)
    assert isinstance(new, ConfirmEmpty) and new.word != old.word
    engine.confirmed(new, unfinished=True)
    assert isinstance(engine.decide(ask, MARGIN), Wait)
    engine.dispatcher(T_NOW + timedelta(seconds=12), unfinished=0)  # a renewal: a new word
    assert isinstance(engine.decide(ask, MARGIN), ConfirmEmpty)


def test_a_worker_that_sees_the_whole_pool_stops_on_its_own_count_unasked() -> None:
    engine, _ = narrowable(inbox=True)
    engine.dispatcher(None)
    epoch = engine.open_scope(FULL)
    engine.stream_sink(epoch, 0).replace([], "5")
    assert engine.decide(engine.ask("w", None, 32, until_empty=True), MARGIN) is None


def test_the_inbox_mark_is_no_count_for_a_worker_that_sees_the_whole_pool() -> None:
    engine, _ = narrowable(inbox=True)
    engine.dispatcher(None)  # no dispatcher: the whole pool, counted from its own view
    epoch = engine.open_scope(FULL)
    engine.stream_sink(epoch, 0).replace([job("left", 3)], "5")
    engine.inbox((), pool_empty=True)  # a dead dispatcher's mark
    assert engine.unfinished() == 1


def test_a_claim_that_does_not_stop_when_empty_announces_nothing() -> None:
    engine, _ = narrowable(inbox=True)
    engine.ask("w", None, 32, until_empty=False)
    assert engine.presence is not None and not engine.presence.waits_for_empty


def test_the_count_is_read_from_the_latest_dispatcher_record_only() -> None:
    def record(renew: str, count: Any) -> dict[str, Any]:
        annotations = {} if count is None else {"joblease.dev/unfinished": count}
        return {"metadata": {"labels": {"joblease.dev/role": "dispatcher"},
                             "annotations": annotations},
                "spec": {"holderIdentity": "d", "renewTime": renew,
                         "leaseDurationSeconds": 10}}

    assert dispatcher_unfinished([]) is None
    assert dispatcher_unfinished([record("2026-01-01T00:00:01.000000Z", "4"),
                                  record("2026-01-01T00:00:00.000000Z", "9")]) == 4
    assert dispatcher_unfinished([record("2026-01-01T00:00:01.000000Z", "x")]) is None
    assert dispatcher_unfinished([record("2026-01-01T00:00:01.000000Z", None)]) is None
