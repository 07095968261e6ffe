"""The dispatcher's rounds, counted and bounded (``joblease.core.dispatcher``), in line.

``test_dispatcher.py`` pins what a lost answer, a refusal and a never-adopted assignment do;
this file pins the rest of a round that the mutation pass of 2026-12-06 found unpinned: at
most ``in_flight`` claims at once, a claim in flight keeps its worker's slot busy, a job
goes only to a worker it opted in to, an assignment is one conditional write from the
watched version (no read) under a fresh dispatcher claim id, an expired holder's job is
taken over with the margin, the counts add up, a reassignment passes over only a live
worker for ``PASS_OVER_SECONDS``, a refusal sets aside only the version tried, and what a
claim that did not land logs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest

from joblease.core.dispatcher import PASS_OVER_SECONDS, Dispatcher, _log_failure
from joblease.domain.errors import format_time
from joblease.domain.lease import DISPATCH_CLAIM_PREFIX, Observed, dispatch_claim_id, unadopted
from joblease.kube.api import ConflictError, UnavailableError
from joblease.kube.leases import LeaseStore
from support.fakekube import T_NOW, FakeKubeApi, lease_object

MARGIN = timedelta(seconds=1)
W1, W2 = "system:serviceaccount:ns:w1", "system:serviceaccount:ns:w2"
GHOST = "system:serviceaccount:ns:ghost"
OPT_IN = {"enabled": True, "serviceAccountNames": ["w1", "w2", "ghost"]}


class InLine:
    """Runs each claim at once, in the round that decided it (``before`` runs first)."""

    def __init__(self, before: Callable[[], None] = lambda: None) -> None:
        self.before = before

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        done: Future[None] = Future()
        self.before()
        fn(*args)
        done.set_result(None)
        return done


class Held:
    """Keeps each claim in flight (never runs it): what a slow write looks like to a round."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, str]] = []

    def submit(self, fn: Any, queued: Any, worker: str, margin: Any) -> Future[None]:
        self.submitted.append((queued.job.name, worker))
        return Future()


def dispatcher_over(api: FakeKubeApi, slots: dict[str, int], executor: Any = None,
                    **options: Any) -> Dispatcher:
    dispatcher = Dispatcher(LeaseStore(api), api, lambda: MARGIN,
                            "ns", "team=batch", "the-operator",
                            adopt_within=timedelta(seconds=5), **options)
    dispatcher._executor.shutdown()
    dispatcher._executor = executor or InLine()  # type: ignore[assignment]
    dispatcher._slots, dispatcher._live = dict(slots), set(slots)
    dispatcher.replace([Observed.from_object(obj) for obj in api.objects.values()], "7")
    return dispatcher


def job(api: FakeKubeApi, name: str, status: dict[str, Any] | None = None,
        dispatch: dict[str, Any] | None = None) -> None:
    api.put_object(lease_object(name, status or {"phase": "Available", "generation": 0,
                                                 "epoch": 1}, dispatch=dispatch or OPT_IN))


def test_the_queue_is_listed_with_its_version() -> None:
    api = FakeKubeApi()
    assert dispatcher_over(api, {}).view.resource_version == "7"


def test_at_most_in_flight_claims_at_once_and_each_round_counted() -> None:
    api = FakeKubeApi()
    for name in ("a", "b", "c"):
        job(api, name)
    held = Held()
    dispatcher = dispatcher_over(api, {W1: 5}, held, in_flight=2)
    dispatcher._dispatch()
    assert [name for name, _ in held.submitted] == ["a", "b"]
    assert dispatcher.counts.rounds == 1
    dispatcher._dispatch()  # no room for a claim: the round writes none
    assert len(held.submitted) == 2 and dispatcher.counts.rounds == 2
    dispatcher._flying.pop("a")
    dispatcher._dispatch()  # room for one
    assert [name for name, _ in held.submitted] == ["a", "b", "a"]
    assert dispatcher.counts.rounds == 3


def test_a_claim_in_flight_keeps_its_workers_slot_busy() -> None:
    api = FakeKubeApi()
    job(api, "a")
    job(api, "b")
    held = Held()
    dispatcher = dispatcher_over(api, {W1: 1}, held)
    dispatcher._dispatch()
    dispatcher._dispatch()
    assert held.submitted == [("a", W1)]  # "b" waits for w1's one slot
    assert dispatcher._flying == {"a": W1}


def test_a_job_goes_only_to_a_worker_it_opted_in_to() -> None:
    api = FakeKubeApi()
    job(api, "only-w1", dispatch={"enabled": True, "serviceAccountNames": ["w1"]})
    dispatcher = dispatcher_over(api, {W2: 4})
    dispatcher._dispatch()
    assert api.requests == [] and dispatcher.counts.assigned == 0


def test_an_assignment_is_one_write_from_the_watched_version_under_a_fresh_dispatch_id(
) -> None:
    api = FakeKubeApi()
    job(api, "a")
    job(api, "b")
    dispatcher = dispatcher_over(api, {W1: 2})
    dispatcher._dispatch()
    assert sorted(api.requests) == [("PATCH", "/apis/joblease.dev/v1alpha1/namespaces/ns/"
                                              f"jobleases/{name}/status") for name in "ab"]
    ids = [api.stored("ns", n)["status"]["claimId"] for n in "ab"]
    assert all(i.startswith(DISPATCH_CLAIM_PREFIX) for i in ids) and ids[0] != ids[1]
    assert ids[0] != dispatch_claim_id("None")
    assert all(unadopted(Observed.from_object(api.stored("ns", n)).status)
               for n in "ab")
    assert (dispatcher.counts.assigned, dispatcher._flying) == (2, {})
    assert dispatcher.view.get("a").status.holder == W1  # type: ignore[union-attr]


def test_an_expired_holders_job_is_taken_over_with_the_margin() -> None:
    api = FakeKubeApi()
    job(api, "stale", {"phase": "Held", "holder": "gone", "generation": 1, "epoch": 1,
                       "claimId": "theirs",
                       "leaseUntil": format_time(T_NOW - timedelta(seconds=10))})
    dispatcher = dispatcher_over(api, {W1: 1})
    dispatcher._dispatch()
    status = api.stored("ns", "stale")["status"]
    assert (status["holder"], status["generation"]) == (W1, 2)
    assert dispatcher.counts.assigned == 1 and dispatcher.counts.failed == 0


def assigned_to(api: FakeKubeApi, name: str, holder: str, seconds_ago: float = 6) -> None:
    at = format_time(T_NOW - timedelta(seconds=seconds_ago))
    job(api, name, {"phase": "Held", "holder": holder, "generation": 1, "epoch": 1,
                    "claimId": dispatch_claim_id(name), "acquireTime": at, "renewTime": at,
                    "leaseUntil": format_time(T_NOW + timedelta(seconds=24))})


def test_reassignments_are_counted_and_pass_over_only_a_live_worker_for_a_minute() -> None:
    api = FakeKubeApi()
    assigned_to(api, "late", GHOST)  # the ghost is live, yet never adopted it
    assigned_to(api, "lapsed", "system:serviceaccount:ns:dead")  # its worker is gone
    dispatcher = dispatcher_over(api, {GHOST: 1, W1: 2})
    dispatcher._live = {GHOST, W1}
    now = api.monotonic()
    dispatcher._dispatch()
    assert (dispatcher.counts.assigned, dispatcher.counts.reassigned) == (2, 2)
    assert set(dispatcher.passed_over) == {GHOST}
    assert dispatcher.passed_over[GHOST] == pytest.approx(now + PASS_OVER_SECONDS, abs=0.1)


def test_refusals_and_lost_answers_are_counted_each_time_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKubeApi()
    job(api, "a")
    job(api, "b")
    dispatcher = dispatcher_over(api, {W1: 2})
    conflict = ConflictError(409, "Conflict", "the object has been modified")
    lost = UnavailableError(0, "Unavailable", "connection reset")
    api.refuse_next = [conflict, conflict]
    with caplog.at_level(logging.DEBUG, logger="joblease.core.dispatcher"):
        dispatcher._dispatch()
        assert dispatcher.counts.refused == 2
        for name in "ab":  # newer versions: both may be tried again
            api.put_object(api.stored("ns", name))
            dispatcher.apply("MODIFIED", Observed.from_object(api.stored("ns", name)))
        api.refuse_next = [lost, lost]
        dispatcher._dispatch()
    assert dispatcher.counts.failed == 2 and dispatcher._flying == {}
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        *[(logging.DEBUG, f"dispatcher of 'team=batch': {n} for {W1} not claimed: 409 "
           f"Contention: JobLease ns/{n}: 1 conflicting writes in a row; giving up (is "
           "something rewriting it in a loop?)") for n in "ab"],
        *[(logging.WARNING, f"dispatcher of 'team=batch': {n} for {W1} not claimed: {lost}")
          for n in "ab"]]


def test_a_refusal_sets_aside_only_the_version_tried() -> None:
    api = FakeKubeApi()
    job(api, "a")
    holder: list[Dispatcher] = []

    def newer_meanwhile() -> None:  # the watch brings a newer version before the write
        newer = api.put_object(api.stored("ns", "a"))
        holder[0].apply("MODIFIED", Observed.from_object(newer))

    dispatcher = dispatcher_over(api, {W1: 1}, InLine(newer_meanwhile))
    holder.append(dispatcher)
    dispatcher._dispatch()  # decided from version 1, refused: version 2 exists
    assert dispatcher.counts.refused == 1
    assert not dispatcher.view.is_set_aside("a")  # the newer version was not tried yet


def test_a_claim_that_failed_unexpectedly_is_logged_with_its_error(
        caplog: pytest.LogCaptureFixture) -> None:
    failed: Future[None] = Future()
    boom = RuntimeError("boom")
    failed.set_exception(boom)
    fine: Future[None] = Future()
    fine.set_result(None)
    _log_failure(fine)
    _log_failure(failed)
    assert [(r.levelno, r.getMessage(), r.exc_info and r.exc_info[1]) for r in caplog.records
            ] == [(logging.ERROR, "dispatcher: a claim failed unexpectedly", boom)]


def test_the_queue_folds_the_feeds_events_and_says_when_the_feed_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKubeApi()
    job(api, "a")
    job(api, "b")
    dispatcher = dispatcher_over(api, {})
    dispatcher.apply("DELETED", Observed.from_object(api.stored("ns", "a")))  # type: ignore[arg-type]
    newer = api.put_object(api.stored("ns", "b"))  # type: ignore[arg-type]
    dispatcher.apply("MODIFIED", Observed.from_object(newer))
    assert dispatcher.view.get("a") is None
    assert dispatcher.view.get("b").resource_version == newer["metadata"]["resourceVersion"]  # type: ignore[union-attr]
    dispatcher.bookmark("900")
    assert dispatcher.view.resource_version == "900"
    down = UnavailableError(503, "ServiceUnavailable", "etcd is down")
    dispatcher.trouble(down)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"dispatcher of 'team=batch': list/watch failed ({down}); retrying")]


def test_a_change_that_lands_while_a_round_runs_starts_the_next_round_at_once() -> None:
    """A lost wake-up (docs/safety.md #68): a watch event applied after a round's planning
    and before the loop waits notified nobody, so the job it freed waited for the next
    change or the loop's 0.2 s timeout. Remembered now: the next round comes at once."""
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = dispatcher_over(api, {W1: 1})
    changed = Observed.from_object(api.stored("ns", "a"))  # type: ignore[arg-type]
    rounds: list[float] = []
    real = dispatcher._dispatch

    def round_then_an_event() -> None:
        rounds.append(time.monotonic())
        real()
        if len(rounds) == 1:  # the feed's event, between the round and the wait
            dispatcher.apply("MODIFIED", changed)

    dispatcher._dispatch = round_then_an_event  # type: ignore[method-assign]
    dispatcher.leader = True
    loop = threading.Thread(target=dispatcher._run, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 2.0
        while len(rounds) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        dispatcher._stop.set()
        with dispatcher._lock:
            dispatcher._lock.notify_all()
        loop.join(timeout=2)
    assert len(rounds) >= 2
    assert rounds[1] - rounds[0] < 0.1, f"the next round came {rounds[1] - rounds[0]:.3f}s later"


def test_rounds_wait_when_nothing_changed() -> None:
    """The remembered change is cleared once a round begins: an idle dispatcher does not spin."""
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = dispatcher_over(api, {W1: 1})
    rounds: list[float] = []
    real = dispatcher._dispatch

    def counted() -> None:
        rounds.append(time.monotonic())
        real()

    dispatcher._dispatch = counted  # type: ignore[method-assign]
    dispatcher.leader = True
    loop = threading.Thread(target=dispatcher._run, daemon=True)
    loop.start()
    time.sleep(0.5)
    dispatcher._stop.set()
    with dispatcher._lock:
        dispatcher._lock.notify_all()
    loop.join(timeout=2)
    assert 1 <= len(rounds) <= 5, f"{len(rounds)} rounds in 0.5 s with nothing changing"
