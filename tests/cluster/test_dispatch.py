"""A pool dispatcher on the real API server (issue 30, items 1-3): it proposes jobs in
workers' inboxes and they claim them themselves (a worker of an earlier version, which
reads no inbox, is claimed for and adopts); killed, workers take turns; a dead worker's
proposal goes to another worker with nothing written on the job, and a dead assignee's
claim with no attempt counted.

Each test runs with the thread pool and the asyncio pool (``open_pool`` from
``test_pool``). The dispatcher's record lives 2 s here (``record_seconds``) and the
workers list presence every 0.5 s, so that fallback and return take seconds.
"""

# ruff: noqa: F811  (the open_pool fixture is imported, then taken as an argument)
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_pool import create, delivering, open_pool, synced_pool  # noqa: F401  (fixture)

from joblease.core.dispatcher import Dispatcher
from joblease.core.presence import INBOX_ANNOTATION, PATH, Presence
from joblease.core.scope import Scope
from joblease.core.steps import SyncPort, drive
from joblease.domain.lease import (
    DISPATCH_CLAIM_PREFIX,
    PROPOSED_CLAIM_PREFIX,
    Phase,
    dispatched_claim,
)
from joblease.kube.api import MERGE_PATCH
from joblease.kube.errors import InvalidError
from joblease.sdk.client import LeaseClient
from support.waiting import wait_for

RECORD_SECONDS = 2
OPT_IN = {"enabled": True, "serviceAccountNames": ["w1"]}


def worker(leases: LeaseClient) -> str:
    """The holder a dispatcher may claim for (the job names its ServiceAccount)."""
    return f"system:serviceaccount:{leases.namespace}:w1"


@pytest.fixture
def dispatchers(make_client: Callable[..., LeaseClient]) -> Iterator[Callable[..., Dispatcher]]:
    """Start dispatchers of ``pool=p`` (each its own client); all are killed afterwards."""
    started: list[Dispatcher] = []

    def start(**options: Any) -> Dispatcher:
        options.setdefault("record_seconds", RECORD_SECONDS)
        dispatcher = Dispatcher.for_client(make_client(), "pool=p", "dispatcher", **options)
        started.append(dispatcher.start())
        return dispatcher

    yield start
    for dispatcher in started:
        dispatcher.kill()


def announced(pool: Any, holder: str) -> None:
    """Start ``pool``'s presence as ``holder`` (a claim that finds nothing), listing often."""
    assert pool.claim_next(holder, timeout=0) is None
    pool.presence.every = 0.5


def dispatched(pool: Any) -> bool:
    return bool(pool.engine.dispatched(pool.engine.clock.server_now()))


def test_a_dispatcher_proposes_in_priority_order_and_workers_claim_and_complete(
        open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    w1 = worker(leases)
    pool = open_pool(slots=2)
    announced(pool, w1)
    for i, priority in enumerate([0, 5, 0, 5]):
        create(leases, f"job-{i}", priority=priority, dispatch=OPT_IN)
    dispatcher = dispatchers()
    wait_for(lambda: dispatched(pool), 10, "the worker to see the dispatcher")
    order = []
    for _ in range(4):
        lease = pool.claim_next(w1, timeout=10)
        assert lease is not None
        assert lease.claim_id.startswith(PROPOSED_CLAIM_PREFIX)  # its own, on a proposal
        order.append(lease.name)
        lease.complete("done")
    assert order[:2] == ["job-1", "job-3"] and sorted(order[2:]) == ["job-0", "job-2"]
    for name in order:
        status = leases.get(name).status
        assert (status.phase, status.generation, status.attempts) == (Phase.COMPLETED, 1, 0)
        assert status.completion is not None and status.completion.holder == w1
    assert pool.conflicts == 0
    # proposed, never claimed for: the job's only writes are the worker's claim and completion
    assert dispatcher.counts.proposed >= 4 and dispatcher.counts.assigned == 0
    assert dispatcher.counts.inbox_writes >= 1 and dispatcher.counts.refused == 0
    create(leases, "not-opted-in")  # never claimed for anyone: the worker takes it itself
    own = pool.claim_next(w1, timeout=10)
    assert own is not None and own.name == "not-opted-in"
    assert not own.claim_id.startswith(DISPATCH_CLAIM_PREFIX) and dispatched(pool)


def test_with_the_dispatcher_killed_workers_take_turns_and_return_when_it_is_back(
        open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    first = dispatchers()
    wait_for(lambda: dispatched(pool), 10, "the worker to see the dispatcher")
    first.kill()  # its record is left to lapse, as a crash leaves it
    create(leases, "alone", dispatch=OPT_IN)
    lease = pool.claim_next(w1, timeout=RECORD_SECONDS + 8)  # turns once the record lapsed
    assert lease is not None and not dispatched_claim(lease.claim_id)
    lease.complete("by turns")
    second = dispatchers()  # a new replica takes the lapsed record over
    wait_for(lambda: dispatched(pool), 10, "the worker to see the dispatcher back")
    create(leases, "dispatched-again", dispatch=OPT_IN)
    again = pool.claim_next(w1, timeout=10)  # dispatched: an opted-in job only by proposal
    assert again is not None and again.claim_id.startswith(PROPOSED_CLAIM_PREFIX)
    assert second.counts.proposed == 1


def test_a_dead_workers_proposal_goes_to_another_worker_with_nothing_written_on_the_job(
        open_pool: Callable[..., Any], leases: LeaseClient,
        make_client: Callable[..., LeaseClient],
        dispatchers: Callable[..., Dispatcher]) -> None:
    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    dispatcher = dispatchers(record_seconds=10)  # w1 stays dispatched: no job by turns
    wait_for(lambda: dispatched(pool), 10, "w1 to see the dispatcher")
    ghost_sa = f"system:serviceaccount:{leases.namespace}:ghost"
    # one renewal, then it dies; its name ranks before w1's, so it is proposed the job
    ghost = Presence(leases.namespace, "pool=p", ghost_sa, seconds=6, slots=1)
    drive(ghost._renew_steps(), SyncPort(make_client().store))
    wait_for(lambda: ghost_sa in dispatcher._readers, 10, "the dispatcher to list the ghost")
    create(leases, "job", maxAttempts=1, backoff={"initialSeconds": 60},
           dispatch={"enabled": True, "serviceAccountNames": ["ghost", "w1"]})
    wait_for(lambda: "job" in dispatcher.proposed.get(ghost_sa, {}), 20,
             "the job to be proposed to the ghost")
    lease = pool.claim_next(w1, timeout=20)
    assert lease is not None and lease.name == "job"
    lease.complete("ran once")
    status = leases.get("job").status
    # generation 1: the ghost wrote nothing on the job, so nothing is left to un-count
    assert (status.phase, status.generation, status.attempts) == (Phase.COMPLETED, 1, 0)
    assert dispatcher.counts.taken_back >= 1 and dispatcher.counts.assigned == 0


def test_a_dead_assignee_of_an_earlier_version_loses_its_claim_without_an_attempt_counted(
        open_pool: Callable[..., Any], leases: LeaseClient,
        make_client: Callable[..., LeaseClient],
        dispatchers: Callable[..., Dispatcher]) -> None:
    """A worker that announces slots but reads no inbox (an earlier version) is claimed for,
    and adopts; dead before adopting, its claim is taken back with no attempt counted."""
    pool = open_pool(slots=1)
    ghost_sa = f"system:serviceaccount:{leases.namespace}:ghost"
    ghost = Presence(leases.namespace, "pool=p", ghost_sa, seconds=RECORD_SECONDS, slots=1)
    store = make_client().store
    drive(ghost._renew_steps(), SyncPort(store))  # one renewal, then it dies
    store.api.request("PATCH", f"{PATH.format(namespace=leases.namespace)}/{ghost.name}",
                      {"metadata": {"annotations": {INBOX_ANNOTATION: None}}},
                      content_type=MERGE_PATCH)  # as an earlier version announced it
    create(leases, "job", maxAttempts=1, backoff={"initialSeconds": 60},
           dispatch={"enabled": True, "serviceAccountNames": ["ghost", "w1"]})
    dispatcher = dispatchers()
    wait_for(lambda: leases.get("job").status.holder == ghost_sa, 20,
             "the job to be assigned to the only worker announced")
    w1 = worker(leases)
    announced(pool, w1)
    lease = pool.claim_next(w1, timeout=RECORD_SECONDS + 10)
    assert lease is not None and lease.name == "job"
    lease.complete("ran once")
    status = leases.get("job").status
    # generation 2: the ghost's claim and w1's; no attempt (maxAttempts 1 would have
    # failed the job, and the backoff would have made it rest for a minute)
    assert (status.phase, status.generation, status.attempts) == (Phase.COMPLETED, 2, 0)
    assert dispatcher.counts.reassigned == 1


def grant_all_but_watching_leases(cluster: Any, namespace: str, user: str) -> None:
    """``user`` may do anything to JobLeases and Leases in ``namespace`` except watch Leases:
    a worker role written before inboxes (issue 30 added ``watch`` on leases)."""
    subject = cluster.rbac_subject(user)
    who = (f"--user={subject['name']}" if subject["kind"] == "User"
           else f"--serviceaccount={subject.get('namespace')}:{subject['name']}")
    for role, verbs, resources in (
            ("jl-all", "*", "jobleases.joblease.dev,jobleases.joblease.dev/status"),
            ("leases-no-watch", "get,list,create,update,patch,delete",
             "leases.coordination.k8s.io")):
        made = cluster.kubectl("create", "role", role, "-n", namespace, f"--verb={verbs}",
                               f"--resource={resources}")
        assert made.returncode == 0, made.stderr
        bound = cluster.kubectl("create", "rolebinding", role, "-n", namespace,
                                f"--role={role}", who)
        assert bound.returncode == 0, bound.stderr


def test_a_worker_refused_its_inbox_watches_its_own_jobs_and_adopts_what_is_claimed_for_it(
        cluster: Any, open_pool: Callable[..., Any], leases: LeaseClient,
        dispatchers: Callable[..., Dispatcher]) -> None:
    """A worker that reads its inbox does not watch ``status.holder=<itself>`` (the echo of
    its own writes). Refused its inbox by RBAC (no ``watch`` on Leases), it announces that it
    reads none and a dispatcher claims *for* it: it must watch its own jobs again to see
    those claims, or the job would wait, held for a live worker that never runs it."""
    grant_all_but_watching_leases(cluster, leases.namespace, "alice")
    w1 = worker(leases)
    pool = open_pool(slots=1, user="alice")
    announced(pool, w1)
    dispatcher = dispatchers()
    wait_for(lambda: dispatched(pool), 10, "the worker to see the dispatcher")
    wait_for(lambda: pool.scope == Scope(w1), 10, "its own jobs watched again")
    assert not pool.presence.reads_inbox
    assert pool.engine.inbox_feed is not None and not pool.engine.inbox_feed.enabled
    wait_for(lambda: dispatcher.workers().get(w1) is False, 10,
             "the dispatcher to read that it reads no inbox")
    create(leases, "job", dispatch=OPT_IN)
    lease = pool.claim_next(w1, timeout=10)
    assert lease is not None and lease.name == "job"
    assert lease.claim_id.startswith(DISPATCH_CLAIM_PREFIX)  # claimed for it, adopted
    lease.complete("adopted")
    status = leases.get("job").status
    assert (status.phase, status.holder, status.attempts) == (Phase.COMPLETED, w1, 0)


def test_the_operator_dispatches_the_pools_it_is_told_to(
        leases: LeaseClient, make_client: Callable[..., LeaseClient],
        start_operator: Callable[..., Any]) -> None:
    """The operator's wiring (``--dispatch-pools``), not the pool, is under test: one pool."""
    w1 = worker(leases)
    pool = synced_pool(make_client(), slots=1)
    delivering(pool, leases, "pool=p")
    announced(pool, w1)
    start_operator(extra_env={"JOBLEASE_DISPATCH_POOLS": f"{leases.namespace}/pool=p"},
                   namespaces=[leases.namespace])
    wait_for(lambda: dispatched(pool), 30, "the worker to see the operator's dispatcher")
    create(leases, "job", dispatch=OPT_IN)
    lease = pool.claim_next(w1, timeout=10)
    assert lease is not None and not lease.claim_id.startswith(DISPATCH_CLAIM_PREFIX)
    assert pool.engine.inbox_feed is not None and pool.engine.inbox_feed.events >= 1
    lease.complete("done")
    pool.close()


def test_a_job_may_name_as_many_service_accounts_as_a_pool_has_slots_and_no_more(
        leases: LeaseClient) -> None:
    """One ServiceAccount per worker identity (the holder-only rule): a pool of 20 workers
    names 20, which the CRD's old limit of 16 refused (the pool benchmark's drain met it);
    64, a presence record's slot cap, is the limit, and the 65th is refused by name."""
    names = [f"w{i:02d}" for i in range(65)]
    create(leases, "sixty-four", dispatch={"enabled": True, "serviceAccountNames": names[:64]})
    assert len(leases.get("sixty-four").spec.dispatch_to or ()) == 64
    with pytest.raises(InvalidError, match=r"serviceAccountNames: Too many: 65: must have at "
                                           r"most 64 items"):
        create(leases, "sixty-five", dispatch={"enabled": True, "serviceAccountNames": names})


def test_a_dispatcher_taking_over_empties_a_live_workers_inbox_and_deletes_a_gone_ones(
        open_pool: Callable[..., Any], leases: LeaseClient,
        make_client: Callable[..., LeaseClient],
        dispatchers: Callable[..., Dispatcher]) -> None:
    """docs/safety.md #57 on the real API server: a dispatcher that died left inboxes (one
    of w1, live, proposing a job that is no more; one of a worker gone since). The next
    one lists them by label once it leads: it empties w1's and deletes the other."""
    from joblease.core.inbox import inbox_name, write_inbox_steps
    from joblease.core.presence import pool_key
    from joblease.domain.dispatch import PROPOSALS_ANNOTATION, Proposal
    from joblease.kube.api import NotFoundError

    w1 = worker(leases)
    pool = open_pool(slots=1)
    announced(pool, w1)
    gone = f"system:serviceaccount:{leases.namespace}:gone"
    port = SyncPort(make_client().store)
    key = pool_key("pool=p")
    for holder in (w1, gone):
        drive(write_inbox_steps(leases.namespace, key, holder, "a-dead-dispatcher",
                                [Proposal("no-such-job", "1")]), port)
    path = f"{PATH.format(namespace=leases.namespace)}/"

    def proposals(holder: str) -> str | None:
        try:
            obj = leases.api.request("GET", path + inbox_name(key, holder)).body
        except NotFoundError:
            return None
        return str(obj["metadata"]["annotations"][PROPOSALS_ANNOTATION])

    assert proposals(gone) is not None and "no-such-job" in str(proposals(w1))
    dispatcher = dispatchers()
    wait_for(lambda: proposals(gone) is None, 15, "the gone worker's inbox to be deleted")
    wait_for(lambda: proposals(w1) == "[]", 15, "w1's inbox to be emptied")
    assert dispatcher.counts.inbox_writes >= 2
