"""A pool dispatcher's decision (``joblease.domain.dispatch``) and the protocol's rules for
its claims (``joblease.domain.lease``: an unadopted assignment never ran), pure (issue 30).

The properties try to break the promises: never more jobs for a worker than its free slots,
the jobs assigned a prefix of the queue (strict priority, FIFO within a priority), every
slot used while jobs remain; and the protocol's: taking back an unadopted claim counts no
attempt and waits for no backoff, while an adopted one (it may have run) counts as before.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from joblease.domain.clock import ServerNow
from joblease.domain.dispatch import Queued, dispatch_queue, free_slots, may_receive, plan
from joblease.domain.errors import LeaseHeldError
from joblease.domain.lease import (
    Claim,
    Observed,
    Phase,
    decide_claim,
    decide_expire,
    decide_renew,
    dispatch_claim_id,
    unadopted,
)
from joblease.domain.pool import PoolView
from joblease.domain.token import FencingToken
from support.fakekube import T_NOW, lease_object

MARGIN = timedelta(seconds=1)
NOW = ServerNow.exact(T_NOW)


OPT_IN = {"enabled": True, "serviceAccountNames": ["w1", "w2"]}


def sa(name: str) -> str:
    return f"system:serviceaccount:ns:{name}"


def job(name: str, status: dict[str, Any] | None = None, rv: int = 1, **spec: Any
        ) -> Observed:
    spec.setdefault("dispatch", OPT_IN)
    obj = lease_object(name, status or {"phase": "Available", "generation": 0}, **spec)
    obj["metadata"]["resourceVersion"] = str(rv)
    obj["metadata"]["creationTimestamp"] = "2026-12-03T12:00:00Z"
    return Observed.from_object(obj)


def queued(names: list[str]) -> list[Queued]:
    return [Queued(job(name)) for name in names]


# --- plan: properties ---------------------------------------------------------------------

workers = st.dictionaries(st.sampled_from([f"w{i}" for i in range(8)]),
                          st.integers(min_value=-2, max_value=5), max_size=8)


@given(jobs=st.integers(min_value=0, max_value=40), free=workers)
def test_a_plan_never_gives_a_worker_more_than_its_free_slots(jobs: int, free: dict[str, int]
                                                                ) -> None:
    given_to = Counter(who for _, who in plan(queued([f"j{i}" for i in range(jobs)]), free))
    for who, count in given_to.items():
        assert count <= free[who]


@given(jobs=st.integers(min_value=0, max_value=40), free=workers)
def test_a_plan_assigns_a_prefix_of_the_queue_and_every_free_slot(
        jobs: int, free: dict[str, int]) -> None:
    names = [f"j{i}" for i in range(jobs)]
    assigned = [q.job.name for q, _ in plan(queued(names), free)]
    total = sum(max(0, slots) for slots in free.values())
    assert assigned == names[:min(jobs, total)]  # strict order: nothing skipped, nothing twice


@given(priorities=st.lists(st.integers(min_value=-3, max_value=3), max_size=30),
       free=workers)
def test_the_queue_of_a_view_is_strict_priority_then_fifo(priorities: list[int],
                                                          free: dict[str, int]) -> None:
    view = PoolView()
    jobs = [job(f"j{i:02d}", rv=10 + i, priority=p) for i, p in enumerate(priorities)]
    view.replace(jobs, "100")
    total = sum(max(0, slots) for slots in free.values())
    queue = dispatch_queue(view.in_order(), NOW, MARGIN, live=set(free), skip=(), limit=total)
    assigned = [q.job for q, _ in plan(queue, free)]
    expected = sorted(jobs, key=lambda o: (-o.spec.priority, int(o.resource_version)))
    assert assigned == expected[:min(len(jobs), total)]


def test_free_slots_caps_an_announcement_and_subtracts_the_busy() -> None:
    assert free_slots({"a": 4, "b": 100, "c": 1}, {"a": 1, "c": 3}, cap=8) == \
        {"a": 3, "b": 8, "c": 0}


def test_a_plan_spreads_jobs_over_the_workers_with_most_free_slots() -> None:
    assigned = [who for _, who in plan(queued(["j1", "j2", "j3"]), {"a": 1, "b": 2})]
    assert assigned == ["b", "a", "b"]


@given(opted=st.lists(st.sampled_from([("w1",), ("w2",), ("w1", "w2"), ("w3",)]), max_size=20),
       free=st.dictionaries(st.sampled_from([sa("w1"), sa("w2"), sa("w3"), "w1"]),
                            st.integers(min_value=0, max_value=4)))
def test_a_plan_gives_a_job_only_to_a_service_account_it_names(
        opted: list[tuple[str, ...]], free: dict[str, int]) -> None:
    jobs = [Queued(job(f"j{i}", dispatch={"enabled": True, "serviceAccountNames": list(names)}))
            for i, names in enumerate(opted)]
    decided = plan(jobs, free, may_receive)
    for queued, who in decided:
        assert who in [sa(name) for name in queued.job.spec.dispatch_to or ()]
    given_to = Counter(who for _, who in decided)
    assert all(count <= free[who] for who, count in given_to.items())
    for queued in jobs:  # a job passed over had no allowed worker with a slot left
        if queued not in [q for q, _ in decided]:
            assert all(given_to[sa(name)] >= free.get(sa(name), 0)
                       for name in queued.job.spec.dispatch_to or ())


# --- the queue: what may be assigned ------------------------------------------------------

def test_a_job_that_did_not_opt_in_is_never_queued() -> None:
    plain = job("plain", dispatch={"enabled": False})
    assert dispatch_queue([plain], NOW, MARGIN, live=set(), skip=(), limit=5) == []
    assert not may_receive(job("j"), "w1")  # a holder must be a named ServiceAccount
    assert may_receive(job("j"), sa("w1"))
    assert not may_receive(job("j"), "system:serviceaccount:other-ns:w1")


def held(holder: str, claim_id: str, *, renewed: bool = False, until_s: int = 20,
         attempts: int = 0) -> dict[str, Any]:
    acquire = "2026-12-03T12:00:05.000Z"
    return {"phase": "Held", "holder": holder, "generation": 1, "epoch": 1,
            "acquireTime": acquire,
            "renewTime": "2026-12-03T12:00:07.000Z" if renewed else acquire,
            "leaseUntil": f"2026-12-03T12:00:{until_s:02d}.000Z", "attempts": attempts,
            "claimId": claim_id}


def test_an_unadopted_assignment_of_a_live_worker_is_not_queued_but_of_a_gone_one_is() -> None:
    obs = job("j", held("w1", dispatch_claim_id("x")))
    assert dispatch_queue([obs], NOW, MARGIN, live={"w1"}, skip=(), limit=5) == []
    assert dispatch_queue([obs], NOW, MARGIN, live={"w2"}, skip=(), limit=5) == \
        [Queued(obs, reassign=True)]


def test_an_adopted_or_self_claimed_job_of_a_gone_worker_waits_for_its_lease() -> None:
    adopted = job("a", held("w1", dispatch_claim_id("x"), renewed=True))
    own = job("b", held("w1", "plain-claim-id"))
    assert dispatch_queue([adopted, own], NOW, MARGIN, live=set(), skip=(), limit=5) == []


# --- the protocol: an unadopted claim never ran -------------------------------------------

def test_unadopted_needs_the_dispatch_prefix_and_no_renewal() -> None:
    assert unadopted(job("j", held("w", dispatch_claim_id("x"))).status)
    assert not unadopted(job("j", held("w", dispatch_claim_id("x"), renewed=True)).status)
    assert not unadopted(job("j", held("w", "x")).status)


def test_the_adoption_moves_renew_time_past_acquire_time_even_at_the_same_instant() -> None:
    obs = job("j", held("w", dispatch_claim_id("x")))
    same_instant = ServerNow.exact(obs.status.acquire_time)  # type: ignore[arg-type]
    claim = Claim("w", FencingToken(1, 1), dispatch_claim_id("x"))
    renewed = decide_renew(obs, claim, same_instant, timedelta(0)).status
    assert renewed.renew_time is not None and renewed.acquire_time is not None
    assert renewed.renew_time > renewed.acquire_time


def test_taking_back_an_unadopted_claim_counts_no_attempt_and_waits_no_backoff() -> None:
    backoff = {"initialSeconds": 60}
    obs = job("j", held("gone", dispatch_claim_id("x"), attempts=2), backoff=backoff,
              maxAttempts=3)
    with pytest.raises(LeaseHeldError):  # not expired, not a reassignment: still held
        decide_claim(obs, "w2", NOW, MARGIN, dispatch_claim_id("y"))
    taken = decide_claim(obs, "w2", NOW, MARGIN, dispatch_claim_id("y"), reassign=True)
    assert taken is not None and taken.status.phase == Phase.HELD
    assert (taken.status.holder, taken.status.attempts, taken.status.generation) == ("w2", 2, 2)
    later = ServerNow.exact(T_NOW + timedelta(seconds=30))  # expired: any claimer, no attempt
    after = decide_claim(obs, "w3", later, MARGIN)
    assert after is not None and after.status.attempts == 2
    expired = decide_expire(obs, later, MARGIN)
    assert expired is not None and expired.status.attempts == 2
    assert expired.status.not_before is None


def test_an_adopted_claim_counts_its_attempt_as_any_claim_does() -> None:
    obs = job("j", held("gone", dispatch_claim_id("x"), renewed=True, attempts=0))
    with pytest.raises(LeaseHeldError):  # reassign takes back only what never ran
        decide_claim(obs, "w2", NOW, MARGIN, reassign=True)
    later = ServerNow.exact(T_NOW + timedelta(seconds=30))
    after = decide_claim(obs, "w3", later, MARGIN)
    assert after is not None and after.status.attempts == 1


def test_an_assignment_left_unadopted_too_long_is_taken_back_from_a_live_worker() -> None:
    obs = job("j", held("w1", dispatch_claim_id("x")))  # acquired at 12:00:05, now 12:00:10
    assert dispatch_queue([obs], NOW, MARGIN, live={"w1"}, skip=(), limit=5,
                          adopt_within=timedelta(seconds=5)) == [Queued(obs, reassign=True)]
    assert dispatch_queue([obs], NOW, MARGIN, live={"w1"}, skip=(), limit=5,
                          adopt_within=timedelta(seconds=6)) == []


@given(claimable=st.lists(st.booleans(), min_size=0, max_size=12),
       proposed=st.sets(st.integers(min_value=0, max_value=11)),
       room=st.one_of(st.none(), st.integers(min_value=0, max_value=12)))
def test_a_worker_keeps_the_best_claimable_wanted_proposals_that_fit_its_room(
        claimable: list[bool], proposed: set[int], room: int | None) -> None:
    """``proposals_to_keep``: the kept are exactly the best ``room`` (in the queue's order)
    of the proposals whose jobs are wanted and claimable; none beyond it (safety.md #55)."""
    from joblease.domain.dispatch import Proposal, proposals_to_keep
    from joblease.domain.errors import format_time
    from support.fakekube import T_NOW, lease_object

    held = {"phase": "Held", "holder": "other", "generation": 1, "epoch": 1, "claimId": "c",
            "leaseUntil": format_time(T_NOW + timedelta(seconds=30))}
    view = {f"j{i}": Observed.from_object(lease_object(
        f"j{i}", {"phase": "Available", "generation": 0, "epoch": 1} if ok else held))
        for i, ok in enumerate(claimable)}
    wanted = [f"j{i}" for i in range(len(claimable))]
    mine = {f"j{i}": Proposal(f"j{i}", view[f"j{i}"].resource_version if f"j{i}" in view
                              else "1") for i in proposed}
    kept = proposals_to_keep(mine, view.get, ServerNow.exact(T_NOW), timedelta(seconds=1),
                             wanted, room)
    standing = [n for n in wanted if n in mine and claimable[int(n[1:])]]
    assert list(kept) == standing[:room]  # best first, and a prefix of what stands
    assert all(kept[n] == mine[n] for n in kept)  # unchanged versions: the same proposals
