"""Who gets which job: a pool dispatcher's decision, pure (issue 30, item 1).

A dispatched pool has one decider (``joblease.core.dispatcher.Dispatcher``) that claims the
head of the pool's queue *for* a worker with free slots, the way kube-scheduler binds a pod
to a node; the worker then adopts the claim and runs it (``docs/pools.md``). This module is
the decision only, with no I/O, so that its promises are tested by properties:

* **never beyond a worker's free slots**: a worker announces its slots (its
  ``--concurrency``) in its presence record; its busy slots are the Held JobLeases it holds
  (an unadopted assignment included) plus the claims for it still in flight;
* **strict priority, FIFO within a priority**: the queue is the pool's order (priority,
  creation, creation revision, name: ``joblease.domain.pool``), and the jobs assigned are
  always a *prefix* of it: no job is assigned while one before it is left waiting;
* **spread**: each next job goes to the worker with the most free slots left (ties by
  name), so that one worker's slots do not all fill while others idle.

Safety does not depend on any of this: every assignment is one compare-and-swap checked by
the API server (a stale decision costs a refused write, never a second holder).
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from joblease.domain.clock import ServerNow
from joblease.domain.lease import LeaseStatus, Observed, claimable_now, unadopted

ADOPT_WITHIN = timedelta(seconds=10)  # an assignment left unadopted longer is taken back
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # an object name (RFC 1123)


@dataclass(frozen=True)
class Queued:
    """A job the dispatcher may assign now; ``reassign``: it takes back an unadopted claim."""

    job: Observed
    reassign: bool = False


def free_slots(announced: Mapping[str, int], busy: Mapping[str, int], cap: int
               ) -> dict[str, int]:
    """Each live worker's free slots: its announced slots (at most ``cap``) less its busy ones.

    Args:
        announced: The live workers' announced slots (presence records).
        busy: Held JobLeases per holder plus claims in flight for it.
        cap: The most slots the dispatcher believes of one worker (an announcement is only
            the worker's word: docs/pools.md, who may receive work).
    """
    return {who: max(0, min(slots, cap) - busy.get(who, 0)) for who, slots in announced.items()}


def dispatch_queue(in_order: Iterable[Observed], now: ServerNow, margin: timedelta,
                   live: Collection[str], skip: Collection[str], limit: int,
                   adopt_within: timedelta = ADOPT_WITHIN) -> list[Queued]:
    """The first ``limit`` jobs the dispatcher may assign now, in the pool's order.

    Only jobs that opted in (``spec.dispatch``) are queued. A job may be assigned when a
    claim may succeed by now (``claimable_at``), or when it is
    an unadopted assignment (``unadopted``) whose assignee is no longer live, or has not
    adopted it within ``adopt_within``: it never ran, and is taken back at once without
    counting an attempt (an assignee that never adopts — an impostor, a worker of another
    pool — costs each job ``adopt_within``, never an attempt).

    Args:
        in_order: The pool's unfinished jobs, best first (``PoolView.in_order``).
        now: The server's time now.
        margin: The claims' clock margin.
        live: The live workers (an assignee not among them is gone).
        skip: Jobs not to assign now (claims in flight, refused until a newer version).
        limit: How many at most (the free slots in all: more could not be assigned).
        adopt_within: How long an assignee may leave its assignment unadopted.
    """
    return list(_queue(in_order, now, margin, live, skip, limit, adopt_within))


def overdue(st: LeaseStatus, now: ServerNow, live: Collection[str],
            adopt_within: timedelta) -> bool:
    """Whether ``st`` is an unadopted assignment to take back: its assignee gone or late."""
    return (unadopted(st) and st.acquire_time is not None
            and (st.holder not in live or now.earliest >= st.acquire_time + adopt_within))


def _queue(in_order: Iterable[Observed], now: ServerNow, margin: timedelta,
           live: Collection[str], skip: Collection[str], limit: int,
           adopt_within: timedelta) -> Iterator[Queued]:
    if limit <= 0:
        return
    found = 0
    for obs in in_order:
        if obs.name in skip or obs.spec.dispatch_to is None:
            continue  # in flight, refused, or not opted in (workers take it by turns)
        if claimable_now(obs, now, margin):
            yield Queued(obs)
        elif overdue(obs.status, now, live, adopt_within):
            yield Queued(obs, reassign=True)
        else:
            continue
        found += 1
        if found >= limit:
            return


def plan(queue: Iterable[Queued], free: Mapping[str, int],
         allowed: Callable[[Observed, str], bool] | None = None) -> list[tuple[Queued, str]]:
    """Assign the head of ``queue`` to workers with free slots: ``[(job, worker), ...]``.

    Each next job goes to the worker with the most free slots left (ties: the smaller
    name) among those ``allowed`` to receive it (``spec.dispatch``: default, all), until
    the queue or the slots run out; no worker gets more than its free slots. With every
    worker allowed, the jobs assigned are a prefix of ``queue``; a job no free worker may
    receive is passed over (it is not this dispatcher's to give).
    """
    heap = [(-slots, who) for who, slots in free.items() if slots > 0]
    heapq.heapify(heap)
    assigned: list[tuple[Queued, str]] = []
    for queued in queue:
        if not heap:
            break
        passed: list[tuple[int, str]] = []
        while heap and allowed is not None and not allowed(queued.job, heap[0][1]):
            passed.append(heapq.heappop(heap))
        if heap:
            slots, who = heapq.heappop(heap)
            assigned.append((queued, who))
            if slots + 1 < 0:
                heapq.heappush(heap, (slots + 1, who))
        for entry in passed:
            heapq.heappush(heap, entry)
    return assigned


def may_receive(job: Observed, worker: str) -> bool:
    """Whether ``job`` opted in to be claimed for ``worker`` (``LeaseSpec.may_dispatch_to``)."""
    return job.spec.may_dispatch_to(job.namespace, worker)


# -- proposals (issue 30: the dispatcher proposes, the worker claims itself) ----------------

PROPOSALS_ANNOTATION = "joblease.dev/proposals"  # a worker's inbox: the jobs proposed to it
POOL_EMPTY_ANNOTATION = "joblease.dev/pool-empty"  # "true": the dispatcher counts no
# unfinished job in the pool (written only to a worker that stops once it is empty)
MAX_PROPOSALS = 64  # the most proposals a worker reads from its inbox, whatever it holds
# proposals a worker receives beyond its free slots. 0: measured (bench/results/pool), one
# ahead left the drain's rate and completion → next claim as they were (the host is
# CPU-bound) and made order and an urgent job's wait worse (it waits behind jobs promised)
AHEAD = 0
CLAIM_WITHIN = timedelta(seconds=10)  # a proposal left unclaimed longer is taken back


@dataclass(frozen=True)
class Proposal:
    """A job proposed to a worker: its name and the version the dispatcher judged it by.

    A proposal is a hint, never a claim: the worker claims the job itself with the usual
    compare-and-swap, so nothing a proposal says can make a worker hold what the protocol
    would refuse it.

    ``state`` is the job at that version as the dispatcher saw it (:func:`proposal_state`):
    the worker decides its claim from it instead of reading the job first, and its write
    carries JSON-patch ``test`` operations (``Observed.vouched``) so that the API server
    applies it only to that very version, in the worker's pool, with the status the
    decision believed; a proposal without one, or refused once, is read first.
    """

    name: str
    resource_version: str
    state: Mapping[str, Any] | None = field(default=None, compare=False)


def proposal_state(job: Observed) -> dict[str, Any]:
    """What a proposal carries of ``job`` for a worker to claim it unread (see :class:`Proposal`).

    Its uid, spec and status; ``None`` values are left out (as the API server stores them).
    """
    status = {key: value for key, value in job.status.to_dict().items() if value is not None}
    return {"uid": job.uid, "spec": job.spec.to_dict(), "status": status}


def encode_proposals(proposals: Iterable[Proposal]) -> str:
    """The inbox annotation's value: ``[[name, resourceVersion, state?], ...]`` in order."""
    return json.dumps([[p.name, p.resource_version,
                        *([dict(p.state)] if p.state is not None else [])] for p in proposals],
                      separators=(",", ":"))


def decode_proposals(value: object) -> tuple[Proposal, ...]:
    """The proposals an inbox annotation holds, in order; anything unreadable is dropped.

    An inbox is written by the dispatcher, but read as hostile input all the same: a value
    that is not JSON, entries of the wrong shape and names that are no object names are
    skipped, duplicates keep their first place, and at most :data:`MAX_PROPOSALS` are read.
    """
    if not isinstance(value, str):
        return ()
    try:
        entries = json.loads(value)
    except (ValueError, RecursionError):
        return ()
    if not isinstance(entries, list):
        return ()
    seen: set[str] = set()
    out: list[Proposal] = []
    for entry in entries:
        if (isinstance(entry, list) and len(entry) in (2, 3)
                and all(isinstance(part, str) for part in entry[:2])
                and _NAME.fullmatch(entry[0]) and entry[1].isdigit() and entry[0] not in seen):
            seen.add(entry[0])
            state = entry[2] if len(entry) == 3 and isinstance(entry[2], dict) else None
            out.append(Proposal(entry[0], entry[1], state))
            if len(out) >= MAX_PROPOSALS:
                break
    return tuple(out)


def proposals_to_keep(proposed: Mapping[str, Proposal], current: Callable[[str], Observed | None],
                      now: ServerNow, margin: timedelta, wanted: Sequence[str],
                      room: int | None = None) -> dict[str, Proposal]:
    """Which of a worker's outstanding proposals still stand (the rest are taken back).

    A proposal stands while its job is still claimable now (``claimable_now``), among the
    ``wanted`` ones (the head of the queue the dispatcher would give out now: a job that a
    better one pushed out of that head is taken back, so an urgent job is proposed at once),
    and among the best ``room`` of them: a worker that filled its slots with jobs proposed
    to it before (it claimed a job in the instant a better one replaced it) keeps no more
    than it has room for, so the better job goes to the next worker that frees instead of
    waiting for this one (safety.md #55). Its version follows the job's (a change that left
    it claimable).

    Args:
        proposed: The worker's outstanding proposals, by job name.
        current: The job of a name in the dispatcher's view (``PoolView.get``).
        now: The server's time now.
        margin: The claims' clock margin.
        wanted: The jobs the dispatcher would have out now, best first.
        room: The worker's free slots (plus what it may have ahead); ``None``: no bound.
    """
    place = {name: at for at, name in enumerate(wanted)}
    standing = sorted((name for name in proposed if name in place), key=place.__getitem__)
    kept: dict[str, Proposal] = {}
    for name in standing:
        obs = current(name)
        if obs is None or not claimable_now(obs, now, margin):
            continue
        if room is not None and len(kept) >= room:
            break
        before = proposed[name]
        kept[name] = before if before.resource_version == obs.resource_version else (
            Proposal(name, obs.resource_version, proposal_state(obs)))
    return kept
