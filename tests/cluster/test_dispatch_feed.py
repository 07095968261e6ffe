"""A dispatched worker watches only its own jobs, on the real API server (issue 30).

While the pool's dispatcher record lives, a worker that announced its slots lists and
watches two parts of the pool only (``joblease.core.scope``): ``status.holder=<itself>`` and
``spec.dispatch.enabled!=true``. Tried here, each against both pools (``open_pool``):
what ``!=true`` matches (an absent field, ``false``) and what it does not (``true``); the
narrow feed (a worker that reads its inbox watches only the second: the first would echo
its own writes) sees its own proposals and a job that did not opt in, and decodes **no** event
of another worker's jobs (``pool.events``, the engine's counter, against a worker that
watches the whole pool); a job deleted and re-created while narrow; the dispatcher killed
→ the worker's view becomes the whole pool within the record's lifetime and it completes an
opted-in job by turns → a new dispatcher → narrow again; ``until_empty`` while narrow
ends on the dispatcher's published count, not on the worker's own part. The dispatcher's
record lives 5 s here (:data:`RECORD_SECONDS`) and the workers list presence every 0.5 s.
"""

# ruff: noqa: F811  (the open_pool fixture is imported, then taken as an argument)
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from test_dispatch import OPT_IN, announced, dispatchers, worker  # noqa: F401  (fixture)
from test_pool import create, open_pool, synced_pool  # noqa: F401  (fixture)

from joblease.core.dispatcher import Dispatcher
from joblease.core.feed import LeaseFeed
from joblease.core.scope import FULL, NOT_DISPATCHED, Scope
from joblease.domain.lease import DISPATCH_CLAIM_PREFIX, Phase
from joblease.sdk.client import LeaseClient
from support.waiting import wait_for

RECORD_SECONDS = 5  # > the dispatcher's 2 s renewal: a 2 s record lapses between renewals,
# and each lapse would switch the worker to the whole pool for a moment


def listed(leases: LeaseClient, fields: str) -> list[str]:
    """The names of ``pool=p`` the API server lists with ``fields`` (and the unfinished filter)."""
    items, _ = LeaseFeed(leases.store, leases.namespace, "pool=p", fields=fields).list()
    return sorted(obs.name for obs in items)


def narrowed(pool: Any, holder: str) -> Scope:
    """The narrow scope of ``pool``'s worker: without its own jobs while it reads its inbox."""
    return Scope(holder, own=not pool.presence.reads_inbox)


def narrow(pool: Any, holder: str) -> None:
    wait_for(lambda: pool.scope == narrowed(pool, holder), 10, "the worker's view to narrow")


def test_not_true_matches_an_absent_field_and_false_never_true(leases: LeaseClient) -> None:
    create(leases, "absent")
    create(leases, "off", dispatch={"enabled": False})
    create(leases, "on", dispatch=OPT_IN)
    assert listed(leases, NOT_DISPATCHED) == ["absent", "off"]
    assert listed(leases, "spec.dispatch.enabled=true") == ["on"]
    leases.claim("on", holder="w,x=1")  # a holder a field selector must escape
    assert listed(leases, Scope("w,x=1").fields()[0]) == ["on"]
    assert listed(leases, Scope("w").fields()[0]) == []


def test_the_narrow_feed_sees_its_own_and_the_plain_jobs_and_no_event_of_anothers(
        open_pool: Callable[..., Any], leases: LeaseClient,
        make_client: Callable[..., LeaseClient],
        dispatchers: Callable[..., Dispatcher]) -> None:
    w1, w2 = worker(leases), f"system:serviceaccount:{leases.namespace}:w2"
    pool = open_pool(slots=1)
    announced(pool, w1)
    other = synced_pool(make_client(), slots=1)  # w2, a thread pool whatever the parameter
    announced(other, w2)
    whole = synced_pool(make_client())  # announces no slots: watches the whole pool
    try:
        dispatchers(record_seconds=RECORD_SECONDS)
        narrow(pool, w1)
        narrow(other, w2)
        assert whole.scope == FULL
        mine, everyone = pool.events, whole.events
        for i in range(3):  # w2's jobs: proposed to w2, claimed and completed by it
            create(leases, f"for-w2-{i}", dispatch={"enabled": True,
                                                   "serviceAccountNames": ["w2"]})
        for _ in range(3):
            lease = other.claim_next(w2, timeout=10)
            assert lease is not None and lease.name.startswith("for-w2-")
            assert not lease.claim_id.startswith(DISPATCH_CLAIM_PREFIX)  # its own claim
            lease.complete("done")
        create(leases, "marker")  # did not opt in: both views get it, after w2's events
        wait_for(lambda: pool.view.get("marker") is not None, 10, "the marker in w1's view")
        wait_for(lambda: whole.view.get("marker") is not None, 10, "the marker, whole view")
        assert pool.events == mine + 1  # the marker's ADDED only: nothing of w2's jobs
        assert whole.events - everyone >= 3 * 3 + 1  # created, claimed, completed; marker
        create(leases, "for-w1", dispatch=OPT_IN)
        got = [pool.claim_next(w1, timeout=10), pool.claim_next(w1, timeout=10)]
        assert sorted(lease.name for lease in got if lease is not None) == ["for-w1", "marker"]
        for lease in got:
            assert lease is not None
            assert not lease.claim_id.startswith(DISPATCH_CLAIM_PREFIX)  # both its own claims
            lease.complete("done")
        assert pool.scope == Scope(w1, own=False) and pool.conflicts == 0  # reads its inbox
        assert pool.engine.inbox_feed is not None and pool.engine.inbox_feed.events >= 1
    finally:
        other.close()
        whole.close()


def test_a_job_deleted_and_created_again_while_narrow_is_seen_as_the_new_one(
        open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    dispatchers(record_seconds=RECORD_SECONDS)
    narrow(pool, w1)
    create(leases, "again")
    wait_for(lambda: pool.view.get("again") is not None, 10, "the job in the narrow view")
    old = pool.view.get("again").uid
    leases.store.delete_if_unchanged(leases.get("again"))
    wait_for(lambda: pool.view.get("again") is None, 10, "the deletion in the narrow view")
    create(leases, "again")
    wait_for(lambda: pool.view.get("again") is not None, 10, "the new one in the view")
    assert pool.view.get("again").uid != old
    lease = pool.claim_next(w1, timeout=10)
    assert lease is not None and lease.name == "again"
    lease.complete("the new one")
    assert leases.get("again").status.phase == Phase.COMPLETED


def test_the_dispatcher_killed_the_view_is_whole_again_and_narrow_once_it_is_back(
        open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    first = dispatchers(record_seconds=RECORD_SECONDS)
    narrow(pool, w1)
    held = pool.claim_next(w1, timeout=0)  # nothing yet; then one assignment held across
    assert held is None
    create(leases, "held-across", dispatch=OPT_IN)
    held = pool.claim_next(w1, timeout=10)
    assert held is not None and held.name == "held-across"
    first.kill()  # its record is left to lapse, as a crash leaves it
    create(leases, "by-turns", dispatch=OPT_IN)
    wait_for(lambda: pool.scope == FULL, RECORD_SECONDS + 8, "the whole pool in view")
    assert pool.view.get("held-across") is not None  # never out of view
    lease = pool.claim_next(w1, timeout=10)
    assert lease is not None and lease.name == "by-turns"
    assert not lease.claim_id.startswith(DISPATCH_CLAIM_PREFIX)  # its own claim, by turns
    lease.complete("by turns")
    dispatchers(record_seconds=RECORD_SECONDS)  # a new replica takes the lapsed record over
    narrow(pool, w1)
    # a worker that reads its inbox does not watch its own opted-in jobs (no echo of its
    # writes): the job leaves the view, and the holding goes on regardless
    assert pool.scope == Scope(w1, own=False) and pool.view.get("held-across") is None
    held.complete("held across two switches")
    status = leases.get("held-across").status
    assert (status.phase, status.generation, status.attempts) == (Phase.COMPLETED, 1, 0)


def test_a_narrow_worker_told_until_empty_stops_once_the_dispatcher_counts_none_left(
        open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    """Its own view cannot tell (it holds only its part): the dispatcher's record does."""
    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    create(leases, "last", dispatch=OPT_IN)
    create(leases, "someone-elses", dispatch={"enabled": True, "serviceAccountNames": ["w9"]})
    dispatchers(record_seconds=RECORD_SECONDS)
    narrow(pool, w1)
    lease = pool.claim_next(w1, timeout=10, until_empty=True)
    assert lease is not None and lease.name == "last"
    lease.complete("done")
    wait_for(lambda: pool.engine.pool_unfinished == 1, 10, "the dispatcher's count of 1")
    assert pool.claim_next(w1, timeout=1, until_empty=True) is None  # the timeout, not empty
    assert pool.unfinished() == 1  # w9's job, which this worker's view never shows
    leases.store.delete_if_unchanged(leases.get("someone-elses"))
    wait_for(lambda: pool.engine.pool_unfinished == 0, 10, "the dispatcher's count of 0")
    assert pool.claim_next(w1, timeout=30, until_empty=True) is None and pool.unfinished() == 0
    assert pool.scope == Scope(w1, own=False)


def test_a_narrow_worker_told_until_empty_stops_when_its_inbox_says_so_not_seconds_later(
        open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    """#62: the dispatcher marks the inbox of a worker that announced ``until_empty`` the
    moment the pool empties; before, it learnt so from the record at its next presence list.

    Presence lists every 12 s here once the job is held, so the record's count cannot reach
    the worker in time: it must stop on the mark, with the record's count still 1 and its
    view still narrow (the record lives 30 s: a list 12 s apart still finds it alive).
    """
    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    create(leases, "last", dispatch=OPT_IN)
    dispatcher = dispatchers(record_seconds=30)
    narrow(pool, w1)
    lease = pool.claim_next(w1, timeout=10, until_empty=True)
    assert lease is not None and lease.name == "last"
    wait_for(lambda: w1 in dispatcher._waiters, 15, "the dispatcher to know w1 stops when empty")
    wait_for(lambda: pool.engine.pool_unfinished == 1, 10, "the record's count of 1")
    pool.presence.every = 12  # below the record's 15 s life; no list for ~10 s from now
    time.sleep(1)  # presence is in its long sleep
    lease.complete("done")
    began = time.monotonic()
    assert pool.claim_next(w1, timeout=20, until_empty=True) is None
    took = time.monotonic() - began
    assert took < 4, f"stopped {took:.1f}s after the pool emptied"
    assert pool.engine.pool_unfinished == 1  # the record's count never told it
    assert pool.scope == narrowed(pool, w1) and pool.unfinished() == 0


def test_a_narrow_worker_does_not_stop_on_a_dead_dispatchers_word_that_the_pool_is_empty(
        open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    """#63: the dispatcher counted the pool empty (its record's count, the worker's inbox
    mark), then died; its word outlives it until its record lapses. A job created then must
    not be left behind by an ``until_empty`` worker that believes that word: the worker
    asks the API server once (one list, ``limit=1``) before it stops, and here takes the job
    by turns once the record lapsed."""
    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    create(leases, "first", dispatch=OPT_IN)
    dispatcher = dispatchers(record_seconds=RECORD_SECONDS)
    narrow(pool, w1)
    lease = pool.claim_next(w1, timeout=10, until_empty=True)
    assert lease is not None and lease.name == "first"
    lease.complete("done")
    wait_for(lambda: pool.engine.inbox_says_empty or pool.engine.pool_unfinished == 0, 15,
             "the dispatcher's word that the pool is empty")
    dispatcher.kill()  # its record stays, saying so, until it lapses
    create(leases, "after", dispatch=OPT_IN)
    assert pool.scope == narrowed(pool, w1)  # still narrow: the record lives
    began = time.monotonic()
    late = pool.claim_next(w1, timeout=RECORD_SECONDS + 15, until_empty=True)
    assert late is not None and late.name == "after", (
        f"stopped after {time.monotonic() - began:.1f}s with 'after' left unfinished")
    late.complete("not left behind")
