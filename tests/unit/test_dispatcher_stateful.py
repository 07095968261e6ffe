"""The dispatcher's books under any schedule of jobs, claims and completions (Hypothesis).

The example tests in ``test_dispatcher_proposals.py`` pin the races found so far (docs/
safety.md #50, #54, #55); this machine looks for the ones beside them. Jobs of random
priorities arrive; workers claim what their inbox proposes, or *any* claimable job (a
proposal read from an older inbox, a claim by turns: the races); held jobs complete; time
passes; the dispatcher runs its rounds. After every round its promises must hold:

* no worker is proposed more than it has room for (free slots plus ``ahead``: #55);
* no job is proposed to two workers, and every proposed job is claimable in its view;
* each worker's inbox, as stored, says what the dispatcher's books say (#54), but for the
  jobs the worker itself took (they leave the books with no inbox write);
* no job a worker may receive waits while a worker with room gets nothing (liveness).
* a worker that stops once the pool is empty (``--until-empty``, announced) finds its
  inbox marked exactly while the pool has no unfinished job, and no other worker ever
  finds a mark (#62).

Rounds run over the in-memory API server (``tests/support/fakekube.py``), each write
performed in the round that decided it.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_dispatcher_rounds import MARGIN, OPT_IN, W1, W2, dispatcher_over

from joblease.core.dispatcher import Dispatcher
from joblease.core.inbox import inbox_name
from joblease.domain.clock import ServerNow
from joblease.domain.dispatch import POOL_EMPTY_ANNOTATION, PROPOSALS_ANNOTATION
from joblease.domain.errors import format_time
from joblease.domain.lease import Observed, claimable_now
from support.fakekube import T_NOW, FakeKubeApi, lease_object

W3 = "system:serviceaccount:ns:ghost"
WORKERS = (W1, W2, W3)


class DispatcherBooks(RuleBasedStateMachine):
    """One dispatcher, three inbox-reading workers of random slots, and a stream of jobs."""

    api: FakeKubeApi
    dispatcher: Dispatcher
    slots: dict[str, int]

    @initialize(slots=st.tuples(*[st.integers(min_value=1, max_value=3)] * 3),
                ahead=st.integers(min_value=0, max_value=1),
                waiters=st.sets(st.sampled_from(WORKERS)))
    def start(self, slots: tuple[int, int, int], ahead: int, waiters: set[str]) -> None:
        self.api = FakeKubeApi()
        self.slots = dict(zip(WORKERS, slots, strict=True))
        self.dispatcher = dispatcher_over(self.api, self.slots, ahead=ahead,
                                          claim_within=timedelta(seconds=10))
        self.dispatcher._readers = set(WORKERS)
        self.dispatcher._waiters = set(waiters)  # announced --until-empty
        self.made = 0
        self.fresh = False  # whether a round ran since the last change

    # -- the world -------------------------------------------------------------------------

    @rule(priority=st.integers(min_value=0, max_value=3))
    def create(self, priority: int) -> None:
        name = f"j{self.made:03d}"
        self.made += 1
        self.api.put_object(lease_object(name, {"phase": "Available", "generation": 0,
                                                "epoch": 1}, dispatch=OPT_IN,
                                         priority=priority))
        self._seen(name, "ADDED")

    @rule(worker=st.sampled_from(WORKERS), pick=st.integers(min_value=0, max_value=63))
    def claim_from_inbox(self, worker: str, pick: int) -> None:
        proposed = self._inbox(worker) or []
        if proposed and self._free(worker):
            self._claim(proposed[pick % len(proposed)], worker)

    @rule(worker=st.sampled_from(WORKERS), pick=st.integers(min_value=0, max_value=63))
    def claim_anything(self, worker: str, pick: int) -> None:
        """A race: a proposal read from an older inbox, or a claim by turns."""
        claimable = self._claimable()
        if claimable and self._free(worker):
            self._claim(claimable[pick % len(claimable)], worker)

    @rule(pick=st.integers(min_value=0, max_value=63))
    def complete(self, pick: int) -> None:
        held = sorted(name for name, obj in self._objects()
                      if (obj.get("status") or {}).get("phase") == "Held")
        if held:
            name = held[pick % len(held)]
            status = (self.api.stored("ns", name) or {})["status"]
            self._write(name, {"phase": "Completed", "holder": status["holder"],
                               "generation": status["generation"], "epoch": 1,
                               "finishTime": format_time(T_NOW)})

    @rule(seconds=st.sampled_from([0.1, 1.0, 4.0]))
    def time_passes(self, seconds: float) -> None:
        self.api._monotonic += seconds
        self.fresh = False

    @rule(worker=st.sampled_from(WORKERS))
    def announces_until_empty(self, worker: str) -> None:
        """A worker's later claim asks to stop when empty (the dispatcher's next list)."""
        self.dispatcher._waiters.add(worker)
        self.fresh = False

    @rule()
    def a_round(self) -> None:
        self.dispatcher._dispatch()
        self.fresh = True

    # -- its promises, after a round -------------------------------------------------------

    @invariant()
    def no_worker_is_proposed_beyond_its_room(self) -> None:
        if not self.fresh:
            return  # a claim seen since the last round: the next round takes back
        held = self._held()
        for worker, jobs in self.dispatcher.proposed.items():
            room = max(0, self.slots[worker] + self.dispatcher.ahead - held[worker])
            assert len(jobs) <= room, (worker, list(jobs), held[worker])

    @invariant()
    def a_job_is_proposed_once_and_only_while_claimable(self) -> None:
        names = [name for jobs in self.dispatcher.proposed.values() for name in jobs]
        assert len(names) == len(set(names)), names
        if self.fresh:  # right after a round (a claim seen since leaves at the next one)
            now = ServerNow.exact(T_NOW)
            for name in names:
                obs = self.dispatcher.view.get(name)
                assert obs is not None and claimable_now(obs, now, MARGIN), name

    @invariant()
    def each_inbox_says_what_the_books_say(self) -> None:
        if not self.fresh:
            return  # a change seen since the last round: the next round writes it
        claimable = set(self._claimable())
        for worker in WORKERS:
            books = list(self.dispatcher.proposed.get(worker, {}))
            inbox = self._inbox(worker) or []
            assert [name for name in inbox if name in claimable] == books, (worker, inbox)
            for name in inbox:  # what it took leaves the books with no write (by design)
                if name not in claimable:
                    status = (self.api.stored("ns", name) or {}).get("status") or {}
                    assert status.get("holder") == worker, (worker, name, status)

    @invariant()
    def no_job_waits_while_a_worker_with_room_gets_nothing(self) -> None:
        if not self.fresh or self.dispatcher.passed_over:
            return
        out = {name for jobs in self.dispatcher.proposed.values() for name in jobs}
        waiting = [name for name in self._claimable() if name not in out]
        held = self._held()
        idle = [w for w in WORKERS
                if held[w] + len(self.dispatcher.proposed.get(w, {})) < self.slots[w]]
        assert not (waiting and idle), (waiting, idle)

    @invariant()
    def only_a_waiter_is_told_and_only_while_the_pool_is_empty(self) -> None:
        if not self.fresh:
            return
        empty = all((obj.get("status") or {}).get("phase") in ("Completed", "Failed")
                    for _, obj in self._objects())
        for worker in WORKERS:
            stored = self.api.presence.get(("ns", inbox_name(self.dispatcher.record.pool,
                                                              worker)))
            notes = (stored or {}).get("metadata", {}).get("annotations") or {}
            marked = notes.get(POOL_EMPTY_ANNOTATION) == "true"
            told = empty and worker in self.dispatcher._waiters
            assert marked == told, (worker, marked, empty, sorted(self.dispatcher._waiters))

    # -- helpers ---------------------------------------------------------------------------

    def _claim(self, name: str, worker: str) -> None:
        obj = self.api.stored("ns", name)
        status = (obj or {}).get("status") or {}
        if status.get("phase") != "Available":
            return  # the API server would refuse it: nothing changes
        at = format_time(T_NOW)
        self._write(name, {"phase": "Held", "holder": worker,
                           "generation": int(status.get("generation", 0)) + 1, "epoch": 1,
                           "claimId": "its-own", "acquireTime": at, "renewTime": at,
                           "leaseUntil": format_time(T_NOW + timedelta(seconds=30))})

    def _write(self, name: str, status: dict[str, Any]) -> None:
        self.api.put_object({**(self.api.stored("ns", name) or {}), "status": status})
        self._seen(name, "MODIFIED")

    def _seen(self, name: str, kind: str) -> None:
        stored = self.api.stored("ns", name)
        assert stored is not None
        self.dispatcher.apply(kind, Observed.from_object(stored))
        self.fresh = False  # the invariants wait for the next round

    def _objects(self) -> list[tuple[str, dict[str, Any]]]:
        return [(name, obj) for (_, name), obj in self.api.objects.items()]

    def _inbox(self, worker: str) -> list[str] | None:
        stored = self.api.presence.get(("ns", inbox_name(self.dispatcher.record.pool,
                                                          worker)))
        if stored is None:
            return None
        return [entry[0] for entry in json.loads(stored["metadata"]["annotations"][
            PROPOSALS_ANNOTATION])]

    def _claimable(self) -> list[str]:
        return sorted(name for name, obj in self._objects()
                      if (obj.get("status") or {}).get("phase") == "Available")

    def _held(self) -> Counter[str]:
        return Counter(self.dispatcher.view.held_by())

    def _free(self, worker: str) -> bool:
        return self._held()[worker] < self.slots[worker]


DispatcherBooks.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_the_dispatchers_books_hold_under_any_schedule = DispatcherBooks.TestCase
