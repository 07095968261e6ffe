"""The dispatcher's proposals (issue 30): it writes each worker's inbox, never the job.

A worker that announced it reads its inbox is *proposed* the head of the queue (its free
slots plus ``ahead``) in one inbox write; it claims each itself. These rounds run over the
in-memory API server (``tests/support/fakekube.py``, whose coordination Leases are kept
apart from the JobLeases, so ``api.requests`` lists only JobLease requests), with each
write performed in the round that decided it.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest
from test_dispatcher_rounds import OPT_IN, W1, W2, InLine, dispatcher_over, job

from joblease.core.dispatcher import PASS_OVER_SECONDS, Dispatcher
from joblease.core.inbox import inbox_name
from joblease.domain.dispatch import POOL_EMPTY_ANNOTATION, PROPOSALS_ANNOTATION
from joblease.domain.errors import format_time
from joblease.domain.lease import Observed
from joblease.kube.api import UnavailableError
from support.fakekube import T_NOW, FakeKubeApi


def readers(api: FakeKubeApi, slots: dict[str, int], **options: Any) -> Dispatcher:
    """A dispatcher whose live workers all read their inboxes."""
    dispatcher = dispatcher_over(api, slots, **options)
    dispatcher._readers = set(slots)
    return dispatcher


def inbox(api: FakeKubeApi, dispatcher: Dispatcher, worker: str) -> list[str] | None:
    """The job names ``worker``'s inbox proposes, in order (``None``: no inbox)."""
    stored = api.presence.get(("ns", inbox_name(dispatcher.record.pool, worker)))
    if stored is None:
        return None
    return [entry[0] for entry in json.loads(stored["metadata"]["annotations"][
        PROPOSALS_ANNOTATION])]


def out_now(api: FakeKubeApi, dispatcher: Dispatcher) -> list[str]:
    """Every job W1's and W2's inboxes propose, sorted."""
    return sorted(name for worker in (W1, W2) for name in inbox(api, dispatcher, worker) or [])


def held_by(api: FakeKubeApi, dispatcher: Dispatcher, name: str, worker: str) -> None:
    """``worker`` claimed ``name`` itself; the dispatcher's watch brings it."""
    at = format_time(T_NOW)
    job(api, name, {"phase": "Held", "holder": worker, "generation": 1, "epoch": 1,
                    "claimId": "its-own", "acquireTime": at, "renewTime": at,
                    "leaseUntil": format_time(T_NOW + timedelta(seconds=30))})
    dispatcher.apply("MODIFIED", Observed.from_object(api.stored("ns", name)))


def created(api: FakeKubeApi, dispatcher: Dispatcher, name: str, priority: int = 0) -> None:
    api.put_object(_with_priority(name, priority))
    dispatcher.apply("ADDED", Observed.from_object(api.stored("ns", name)))


def _with_priority(name: str, priority: int) -> dict[str, Any]:
    from support.fakekube import lease_object
    return lease_object(name, {"phase": "Available", "generation": 0, "epoch": 1},
                        dispatch=OPT_IN, priority=priority)


def test_a_reader_is_proposed_its_free_slots_in_one_inbox_write_and_no_job_write() -> None:
    api = FakeKubeApi()
    for name in ("a", "b", "c", "d"):
        job(api, name)
    dispatcher = readers(api, {W1: 2})  # the default: nothing ahead
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a", "b"]
    assert api.requests == [] and dispatcher.counts.inbox_writes == 1


def test_with_one_ahead_a_reader_is_proposed_its_free_slots_plus_one_in_one_write(
        ) -> None:
    api = FakeKubeApi()
    for name in ("a", "b", "c", "d"):
        job(api, name)
    dispatcher = readers(api, {W1: 2}, ahead=1)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a", "b", "c"]  # 2 slots + 1 ahead, in order
    assert api.requests == []  # nothing written on any job: the worker claims itself
    assert (dispatcher.counts.proposed, dispatcher.counts.inbox_writes) == (3, 1)
    assert dispatcher.counts.assigned == 0
    dispatcher._dispatch()  # nothing changed: no write
    assert dispatcher.counts.inbox_writes == 1


def test_a_proposal_the_worker_took_leaves_without_a_write_and_frees_one_place() -> None:
    api = FakeKubeApi()
    for name in ("a", "b", "c"):
        job(api, name)
    dispatcher = readers(api, {W1: 1}, ahead=1)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a", "b"]
    held_by(api, dispatcher, "a", W1)
    dispatcher._dispatch()
    # "a" is held (its slot busy), "b" still ahead: the inbox is already right
    assert dispatcher.counts.inbox_writes == 1 and set(dispatcher.proposed[W1]) == {"b"}
    api.put_object(api.stored("ns", "a") | {"status": {"phase": "Completed", "generation": 1,
                                                       "epoch": 1}})
    dispatcher.apply("DELETED", Observed.from_object(api.stored("ns", "a")))
    dispatcher._dispatch()  # "a" done: one more place, "c" proposed in one write
    assert inbox(api, dispatcher, W1) == ["b", "c"] and dispatcher.counts.inbox_writes == 2
    assert dispatcher.counts.taken_back == 0


def test_an_urgent_job_takes_the_place_of_the_last_proposal_at_once() -> None:
    api = FakeKubeApi()
    for name in ("a", "b"):
        job(api, name)
    dispatcher = readers(api, {W1: 1, W2: 1}, ahead=0)
    dispatcher._dispatch()
    assert out_now(api, dispatcher) == ["a", "b"]
    created(api, dispatcher, "urgent", priority=9)
    dispatcher._dispatch()
    assert out_now(api, dispatcher) == ["a", "urgent"]
    assert dispatcher.counts.taken_back == 1  # "b", still claimable, taken back


def test_a_gone_workers_proposals_go_to_another_and_its_inbox_is_deleted() -> None:
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = readers(api, {W1: 1}, ahead=0)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a"]
    dispatcher._live, dispatcher._readers, dispatcher._slots = {W2}, {W2}, {W2: 1}
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W2) == ["a"]
    assert inbox(api, dispatcher, W1) is None  # deleted
    assert dispatcher.counts.taken_back == 1 and api.requests == []


def test_a_worker_with_a_free_slot_that_takes_nothing_is_passed_over() -> None:
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = readers(api, {W1: 1, W2: 1}, ahead=0, claim_within=timedelta(seconds=10))
    dispatcher._dispatch()
    first = W1 if inbox(api, dispatcher, W1) == ["a"] else W2
    api._monotonic += 9.0
    dispatcher._dispatch()
    assert first not in dispatcher.passed_over  # 9 s: not yet
    api._monotonic += 1.5
    dispatcher._dispatch()
    other = W2 if first == W1 else W1
    assert dispatcher.passed_over[first] == pytest.approx(api._monotonic + PASS_OVER_SECONDS,
                                                          abs=0.1)
    assert inbox(api, dispatcher, first) == [] and inbox(api, dispatcher, other) == ["a"]


def test_a_busy_worker_keeps_the_job_proposed_ahead_however_long_its_job_runs() -> None:
    api = FakeKubeApi()
    for name in ("a", "b"):
        job(api, name)
    dispatcher = readers(api, {W1: 1}, ahead=1, claim_within=timedelta(seconds=10))
    dispatcher._dispatch()
    held_by(api, dispatcher, "a", W1)
    for _ in range(5):
        api._monotonic += 30.0  # "a" runs for minutes: "b" waits, proposed ahead
        dispatcher._dispatch()
    assert W1 not in dispatcher.passed_over and set(dispatcher.proposed[W1]) == {"b"}
    assert dispatcher.counts.taken_back == 0


def first_inbox_write_fails(api: FakeKubeApi) -> None:
    """Make ``api``'s first inbox request fail as a reset connection; the rest pass."""
    real, calls = api.request, {"n": 0}

    def flaky(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if "joblease-inbox-" in path and calls["n"] == 0:
            calls["n"] += 1
            raise UnavailableError(0, "Unavailable", "connection reset")
        return real(method, path, *args, **kwargs)

    api.request = flaky  # type: ignore[method-assign]


def test_a_failed_inbox_write_is_written_again_after_a_second(
        caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = readers(api, {W1: 1}, ahead=0)
    first_inbox_write_fails(api)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) is None and dispatcher.counts.failed == 1
    assert caplog.text.count("the inbox of") == 1
    dispatcher._dispatch()  # it rests a second: no write, no warning each round
    assert inbox(api, dispatcher, W1) is None and caplog.text.count("the inbox of") == 1
    api._monotonic += 1.1
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a"] and dispatcher.counts.inbox_writes == 1


def test_a_worker_that_reads_no_inbox_is_still_claimed_for() -> None:
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = dispatcher_over(api, {W1: 1}, InLine())  # W1 announced no inbox
    dispatcher._dispatch()
    assert dispatcher.counts.assigned == 1 and dispatcher.counts.proposed == 0
    assert api.stored("ns", "a")["status"]["holder"] == W1


def test_a_proposal_an_active_worker_leaves_unclaimed_is_proposed_afresh() -> None:
    """A worker that keeps taking other proposals is not late, but a proposal it leaves
    for 10 s with a slot free (a read that failed, its clock) must not stay stuck there."""
    api = FakeKubeApi()
    for name in ("a", "b"):
        job(api, name)
    dispatcher = readers(api, {W1: 2}, claim_within=timedelta(seconds=10))
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a", "b"]
    api._monotonic += 5.0
    held_by(api, dispatcher, "b", W1)  # it took "b", not "a"
    dispatcher._dispatch()
    assert dispatcher.counts.taken_back == 0 and "a" in dispatcher.proposed[W1]
    api._monotonic += 5.5  # "a" unclaimed 10.5 s with a slot free
    dispatcher._dispatch()
    assert W1 not in dispatcher.passed_over  # active: not passed over
    assert dispatcher.counts.taken_back == 1
    assert dispatcher.proposed[W1]["a"][1] == pytest.approx(api._monotonic, abs=0.01)
    assert inbox(api, dispatcher, W1) == ["a"]  # proposed afresh (and rewritten)


def test_a_proposal_taken_by_another_worker_is_dropped_from_its_inbox() -> None:
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = readers(api, {W1: 1}, ahead=0)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a"]
    held_by(api, dispatcher, "a", W2)  # a race: another worker, by turns
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == []  # no stale proposal left for W1 to re-read
    assert dispatcher.counts.taken_back == 0  # not claimable any more: nothing taken back


class Later:
    """Keeps each write in flight until :meth:`run`: a slow inbox write, seen by the rounds."""

    def __init__(self) -> None:
        self.queued: list[tuple[Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        self.queued.append((fn, args))
        return Future()

    def run(self) -> None:
        queued, self.queued = self.queued, []
        for fn, args in queued:
            fn(*args)


def test_a_proposal_made_while_the_workers_last_inbox_write_is_in_flight_is_written_after_it(
        ) -> None:
    """safety.md #54: a round that met the worker's previous inbox write still in flight
    took the worker off the inboxes due, so the new proposal was never written; the worker
    never saw it and was passed over 10 s later (an urgent job waited 11 s in the bench)."""
    api = FakeKubeApi()
    job(api, "a")
    later = Later()
    dispatcher = readers(api, {W1: 1}, ahead=0, executor=later)
    dispatcher._dispatch()  # "a" proposed: the inbox write is in flight
    held_by(api, dispatcher, "a", W1)  # W1 saw it (the write landed), claimed it, ran it
    at = format_time(T_NOW)
    job(api, "a", {"phase": "Completed", "holder": W1, "generation": 1, "epoch": 1,
                   "finishTime": at})
    dispatcher.apply("MODIFIED", Observed.from_object(api.stored("ns", "a")))
    created(api, dispatcher, "b")
    dispatcher._dispatch()  # "b" proposed to W1 while the write of "a" has not answered
    assert "b" in dispatcher.proposed.get(W1, {})
    later.run()  # the write of ["a"] answers
    dispatcher._dispatch()
    later.run()
    assert inbox(api, dispatcher, W1) == ["b"]  # before the fix: ["a"], for 10 s


def test_a_job_proposed_to_a_worker_that_filled_its_slots_goes_to_the_next_that_frees(
        ) -> None:
    """safety.md #55: an urgent job replaced the filler proposed to the one free worker in
    the instant that worker claimed the filler; when the dispatcher saw that claim together
    with another worker freeing, the urgent job stayed proposed to the busy worker (1 s in
    the bench, the filler's length) and the free one was given the next filler."""
    api = FakeKubeApi()
    job(api, "x")
    dispatcher = readers(api, {W1: 1, W2: 1}, ahead=0)
    held_by(api, dispatcher, "x", W2)  # W2 busy
    created(api, dispatcher, "filler")
    created(api, dispatcher, "filler-2")
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["filler"]
    created(api, dispatcher, "urgent", priority=9)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["urgent"]  # it replaced the filler...
    held_by(api, dispatcher, "filler", W1)  # ...which W1 had claimed in that instant
    job(api, "x", {"phase": "Completed", "holder": W2, "generation": 1, "epoch": 1,
                   "finishTime": format_time(T_NOW)})
    dispatcher.apply("MODIFIED", Observed.from_object(api.stored("ns", "x")))  # W2 frees
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W2) == ["urgent"]  # the free worker gets it at once
    assert inbox(api, dispatcher, W1) == []  # no room left at W1: taken back
    assert dispatcher.counts.taken_back == 2  # the filler, then the urgent job


def test_a_worker_keeps_the_best_of_its_proposals_that_fit_its_room() -> None:
    api = FakeKubeApi()
    for name in ("a", "b", "c", "d"):
        job(api, name)
    dispatcher = readers(api, {W1: 3}, ahead=0)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a", "b", "c"]
    job(api, "x")
    held_by(api, dispatcher, "x", W1)  # one slot filled by a job not proposed (by turns)
    dispatcher._live, dispatcher._readers = {W1, W2}, {W1, W2}
    dispatcher._slots = {W1: 3, W2: 1}  # and a worker with a free slot arrives
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a", "b"]  # "c", its last, went back...
    assert inbox(api, dispatcher, W2) == ["c"]  # ...to the free worker, before "d"
    assert dispatcher.counts.taken_back == 1


def test_a_proposed_job_whose_version_moved_while_claimable_is_proposed_at_its_new_one(
        ) -> None:
    """The worker's claim vouches for the version it was told: a proposal left at the old
    one would cost a refused write and a read; the inbox is rewritten instead."""
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = readers(api, {W1: 1}, ahead=0)
    dispatcher._dispatch()
    told = json.loads(api.presence[("ns", inbox_name(dispatcher.record.pool, W1))][
        "metadata"]["annotations"][PROPOSALS_ANNOTATION])[0][1]
    obj = api.stored("ns", "a")
    obj["metadata"].setdefault("annotations", {})["note"] = "edited"
    api.put_object(obj)  # a change that leaves it claimable: a new resourceVersion
    now = api.stored("ns", "a")["metadata"]["resourceVersion"]
    assert now != told
    dispatcher.apply("MODIFIED", Observed.from_object(api.stored("ns", "a")))
    dispatcher._dispatch()
    entry = json.loads(api.presence[("ns", inbox_name(dispatcher.record.pool, W1))][
        "metadata"]["annotations"][PROPOSALS_ANNOTATION])[0]
    assert entry[:2] == ["a", now] and dispatcher.counts.inbox_writes == 2
    assert dispatcher.counts.taken_back == 0


def test_a_dispatcher_taking_over_rewrites_the_live_workers_inboxes_and_deletes_the_gone_ones(
        ) -> None:
    """A dispatcher that died left inboxes: W1's (live) still proposes what it decided, and
    GHOST's (gone since) would stay for ever. The next one lists the pool's inboxes once
    it leads: it rewrites W1's with its own proposals and deletes GHOST's; an inbox of
    another pool is left alone."""
    from test_dispatcher_rounds import GHOST

    from joblease.core.inbox import write_inbox_steps
    from joblease.core.steps import SyncPort, drive
    from joblease.domain.dispatch import Proposal
    from joblease.kube.leases import LeaseStore

    api = FakeKubeApi()
    job(api, "a")
    dispatcher = readers(api, {W1: 1}, ahead=0)
    port = SyncPort(LeaseStore(api))  # type: ignore[arg-type]
    for worker in (W1, GHOST):
        drive(write_inbox_steps("ns", dispatcher.record.pool, worker, "dead-dispatcher",
                                [Proposal("old", "1")]), port)
    drive(write_inbox_steps("ns", "another-pool", GHOST, "x", [Proposal("old", "1")]), port)
    assert inbox(api, dispatcher, W1) == ["old"] and inbox(api, dispatcher, GHOST) == ["old"]
    dispatcher._inherit_inboxes(port)
    dispatcher._dispatch()
    assert inbox(api, dispatcher, W1) == ["a"]  # this dispatcher's proposal, not "old"
    assert inbox(api, dispatcher, GHOST) is None  # deleted
    assert ("ns", inbox_name("another-pool", GHOST)) in api.presence
    assert dispatcher.counts.inbox_writes == 2  # W1's write, GHOST's delete


def test_a_failed_list_of_inboxes_is_said_and_tried_again(
        caplog: pytest.LogCaptureFixture) -> None:
    from joblease.core.steps import SyncPort
    from joblease.kube.api import ForbiddenError
    from joblease.kube.leases import LeaseStore

    class Refusing(SyncPort):
        def perform(self, step: Any) -> Any:
            raise ForbiddenError(403, "Forbidden", "leases is forbidden")

    api = FakeKubeApi()
    dispatcher = readers(api, {W1: 1})
    dispatcher._inherit_inboxes(Refusing(LeaseStore(api)))  # type: ignore[arg-type]
    assert not dispatcher._inherited
    assert "listing inboxes: 403 Forbidden" in caplog.text
    dispatcher._inherit_inboxes(SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert dispatcher._inherited


def marked(api: FakeKubeApi, dispatcher: Dispatcher, worker: str) -> bool | None:
    """Whether ``worker``'s inbox says the pool is empty (``None``: no inbox)."""
    stored = api.presence.get(("ns", inbox_name(dispatcher.record.pool, worker)))
    if stored is None:
        return None
    return stored["metadata"]["annotations"].get(POOL_EMPTY_ANNOTATION) == "true"


def completed(api: FakeKubeApi, dispatcher: Dispatcher, name: str, worker: str) -> None:
    at = format_time(T_NOW)
    job(api, name, {"phase": "Completed", "holder": worker, "generation": 1, "epoch": 1,
                    "finishTime": at})
    dispatcher.apply("MODIFIED", Observed.from_object(api.stored("ns", name)))


def test_a_worker_that_stops_when_empty_is_told_so_in_its_inbox_and_untold_when_a_job_comes(
        ) -> None:
    """#62: a narrow worker learnt the pool was empty only from the dispatcher's record, read
    at its next presence list: it exited 6.6-8.3 s after the last job in the bench."""
    api = FakeKubeApi()
    job(api, "a")
    dispatcher = readers(api, {W1: 1, W2: 1}, ahead=0)
    dispatcher._waiters = {W1}  # only W1 announced --until-empty
    dispatcher._dispatch()
    proposed_to = W1 if inbox(api, dispatcher, W1) == ["a"] else W2
    assert marked(api, dispatcher, W1) in (False, None)  # a job is left: no mark
    held_by(api, dispatcher, "a", proposed_to)
    dispatcher._dispatch()
    writes = dispatcher.counts.inbox_writes
    completed(api, dispatcher, "a", proposed_to)
    dispatcher._dispatch()  # none left: W1's inbox is marked, in one write; W2's is not
    assert marked(api, dispatcher, W1) is True
    assert marked(api, dispatcher, W2) in (False, None)
    assert dispatcher.counts.inbox_writes == writes + 1
    dispatcher._dispatch()  # nothing changed: no write
    assert dispatcher.counts.inbox_writes == writes + 1
    created(api, dispatcher, "b")
    dispatcher._dispatch()  # a job again: the mark is taken back at once
    assert marked(api, dispatcher, W1) is False
    assert sorted(n for w in (W1, W2) for n in inbox(api, dispatcher, w) or []) == ["b"]


def test_a_failed_marking_write_is_written_again() -> None:
    api = FakeKubeApi()
    dispatcher = readers(api, {W1: 1}, ahead=0)
    dispatcher._waiters = {W1}
    first_inbox_write_fails(api)
    dispatcher._dispatch()  # the pool is empty from the start: the mark's write fails
    assert marked(api, dispatcher, W1) is None and dispatcher.counts.failed == 1
    api._monotonic += 1.1
    dispatcher._dispatch()
    assert marked(api, dispatcher, W1) is True


def test_a_worker_that_does_not_stop_when_empty_gets_no_write_for_it() -> None:
    """A trickle would otherwise pay an inbox write per worker at each job, twice."""
    api = FakeKubeApi()
    dispatcher = readers(api, {W1: 1, W2: 1}, ahead=0)
    dispatcher._dispatch()
    created(api, dispatcher, "a")
    dispatcher._dispatch()
    taker = W1 if inbox(api, dispatcher, W1) == ["a"] else W2
    held_by(api, dispatcher, "a", taker)
    dispatcher._dispatch()  # taken: it leaves the books with no write
    completed(api, dispatcher, "a", taker)
    dispatcher._dispatch()  # the pool is empty again: nobody to tell
    assert dispatcher.counts.inbox_writes == 1  # the proposal only
    assert marked(api, dispatcher, taker) is False
