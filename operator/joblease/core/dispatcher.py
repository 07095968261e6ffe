"""A pool's dispatcher: one decider that claims the head of the queue *for* a free worker.

Issue 30: with turns, every worker decodes every event of every job and a job waits for a
turn whose worker is free. A dispatcher is the pool's one decider, as kube-scheduler is for
pods: it keeps the pool's queue (one list and watch of the selector into a ``PoolView``:
priority, creation, creation revision), knows the live workers and their free slots from
their presence records (``joblease.core.presence``: a worker announces its slots once;
its busy slots are the Held JobLeases it holds, an unadopted assignment included, plus the
claims in flight for it), decides who gets which job (``joblease.domain.dispatch.plan``,
pure) and writes each claim with the usual compare-and-swap: holder = the worker,
generation + 1, a claim id marked as a dispatcher's (``dispatch_claim_id``). The worker
adopts it (``joblease.core.pool_engine.Adopt``: one renewal) and runs it.

**Who is the dispatcher.** A ``coordination.k8s.io`` Lease per pool,
``joblease-dispatcher-<pool digest>``, labelled like the workers' records plus
``joblease.dev/role=dispatcher`` (:class:`DispatcherRecord`). A dispatcher acts only while
it holds that record (leader election among replicas: create it, renew it, or take it over
once lapsed, each a conditional write); workers list it with their presence records and
take turns again once it lapses (``PoolEngine.dispatched``).

**Safety never depends on it.** Every assignment is one conditional write decided by the
protocol (``decide_claim``) from the version the dispatcher read, checked by the API
server's rules; a stale decision costs a refused write. An assignment the assignee never
adopted never ran (``joblease.domain.lease.unadopted``): the dispatcher takes it back
(``reassign``) when the assignee's presence lapses or it stays unadopted past
``adopt_within``, counting no attempt.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from joblease.core.claiming import REFUSED
from joblease.core.feed import LeaseFeed
from joblease.core.inbox import delete_inbox_steps, list_inboxes_steps, write_inbox_steps
from joblease.core.presence import (
    DISPATCHER_ROLE,
    PATH,
    POOL_LABEL,
    ROLE_LABEL,
    UNFINISHED_ANNOTATION,
    announced_slots,
    empty_waiters,
    inbox_readers,
    live_records,
    micro_time,
    pool_key,
    record_until,
    records_selector,
)
from joblease.core.steps import Call, Steps, Stopped, SyncPort, Whoami, drive
from joblease.core.transaction import Outcome, transaction
from joblease.domain.clock import ServerNow
from joblease.domain.dispatch import (
    ADOPT_WITHIN,
    AHEAD,
    CLAIM_WITHIN,
    Proposal,
    Queued,
    dispatch_queue,
    free_slots,
    may_receive,
    plan,
    proposal_state,
    proposals_to_keep,
)
from joblease.domain.holder import ClaimDecider
from joblease.domain.lease import Observed, claimable_now, dispatch_claim_id
from joblease.domain.pool import PoolView
from joblease.kube.api import MERGE_PATCH, ApiError, ConflictError, NotFoundError
from joblease.kube.identity import new_claim_id
from joblease.kube.leases import LeaseCall, LeaseStore
from joblease.kube.transact import ServerTime
from joblease.kube.transport import Transport

RECORD_SECONDS = 10  # the dispatcher's record lapses this long after its last renewal
RENEW_SECONDS = 2.0  # how often the dispatcher renews its record
LIST_SECONDS = 1.0  # how often it lists the workers' records
MAX_SLOTS = 64  # the most slots believed of one worker, whatever it announces
IN_FLIGHT = 8  # claims written at once: write latency must not bound the rate
PASS_OVER_SECONDS = 60.0  # a live worker that left an assignment unadopted gets none meanwhile
RETRY_SECONDS = 1.0  # a claim that failed without an answer (or was forbidden) waits this long
REPLICA_ANNOTATION = "joblease.dev/replica"

log = logging.getLogger(__name__)


def dispatcher_record_name(pool: str) -> str:
    """The dispatcher's record of pool digest ``pool``."""
    return f"joblease-dispatcher-{pool}"


class DispatcherRecord:
    """The dispatcher's ``coordination.k8s.io`` Lease: who dispatches for a pool, until when.

    Args:
        namespace: The pool's namespace.
        selector: The pool's label selector.
        identity: The dispatcher's ``holderIdentity`` (its username, under the chart's
            presence policy: a record speaks only for its writer).
        replica: Tells replicas that share an identity apart (an annotation).
        seconds: How long the record lives without renewal.
    """

    def __init__(self, namespace: str, selector: str | None, identity: str, *,
                 replica: str | None = None, seconds: int = RECORD_SECONDS) -> None:
        self.pool = pool_key(selector)
        self.name = dispatcher_record_name(self.pool)
        self.identity = identity
        self.replica = replica or uuid.uuid4().hex[:12]
        self.seconds = seconds
        self._path = PATH.format(namespace=namespace)

    def hold_steps(self, unfinished: int | None = None) -> Steps[bool]:
        """One round of leader election: ``True`` while this replica holds the record.

        Creates the record if there is none, renews it if it is ours, takes it over once
        lapsed on the server's earliest time; each write is conditional (a create, or a
        patch carrying the resourceVersion read), so two replicas never both win a round.
        ``unfinished`` (the pool's unfinished jobs, as the dispatcher's view counts them)
        is published with each write: workers that watch only their own jobs learn from it
        when the pool is empty (``joblease work --until-empty``).
        """
        now: ServerNow = yield ServerTime()
        try:
            current: dict[str, Any] = yield Call(LeaseCall("GET", f"{self._path}/{self.name}",
                                                           _raw))
        except NotFoundError:
            try:
                yield Call(LeaseCall("POST", self._path, _raw,
                                     body=self._body(now, unfinished)))
            except ConflictError:
                return False
            return True
        read = record_until(current)
        mine = self._is_mine(current)
        if not mine and read is not None and now.earliest < read[1]:
            return False  # another replica holds it
        meta = {"resourceVersion": current["metadata"]["resourceVersion"],
                "annotations": self._annotations(unfinished)}
        try:
            yield Call(LeaseCall("PATCH", f"{self._path}/{self.name}", _raw,
                                 body={"metadata": meta, "spec": self._spec(now)},
                                 content_type=MERGE_PATCH))
        except (ConflictError, NotFoundError):
            return False
        return True

    def leave_steps(self) -> Steps[None]:
        """Delete the record if it is ours: workers take turns at their next list."""
        try:
            current: dict[str, Any] = yield Call(LeaseCall("GET", f"{self._path}/{self.name}",
                                                           _raw))
            if self._is_mine(current):
                yield Call(LeaseCall("DELETE", f"{self._path}/{self.name}", _raw, body={
                    "preconditions": {"resourceVersion": current["metadata"]["resourceVersion"]}
                }))
        except ApiError as err:
            log.debug("dispatcher record %s: leaving: %s", self.name, err)

    def _is_mine(self, current: dict[str, Any]) -> bool:
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        spec = current.get("spec") or {}
        return bool(spec.get("holderIdentity") == self.identity
                    and annotations.get(REPLICA_ANNOTATION) == self.replica)

    def _spec(self, now: ServerNow) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": self.seconds,
                "renewTime": micro_time(now.midpoint)}

    def _annotations(self, unfinished: int | None) -> dict[str, str]:
        annotations = {REPLICA_ANNOTATION: self.replica}
        if unfinished is not None:
            annotations[UNFINISHED_ANNOTATION] = str(unfinished)
        return annotations

    def _body(self, now: ServerNow, unfinished: int | None = None) -> dict[str, Any]:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name,
                             "labels": {POOL_LABEL: self.pool, ROLE_LABEL: DISPATCHER_ROLE},
                             "annotations": self._annotations(unfinished)},
                "spec": {**self._spec(now), "acquireTime": micro_time(now.midpoint)}}


@dataclass
class DispatchCounts:
    """What a dispatcher has done (tests, the bench)."""

    assigned: int = 0
    reassigned: int = 0
    refused: int = 0
    failed: int = 0
    rounds: int = 0
    proposed: int = 0
    taken_back: int = 0
    inbox_writes: int = 0


class Dispatcher:
    """One pool's dispatcher, in threads of its own (see the module doc).

    Args:
        store: The dispatcher's ``LeaseStore`` (its identity writes the claims).
        api: Its transport (the server-clock estimate every decision judges).
        margin: The claims' clock margin (``LeaseClient.margin``).
        namespace: The pool's namespace.
        selector: The pool's label selector.
        identity: The dispatcher record's ``holderIdentity``.
        max_slots: The most slots believed of one worker.
        in_flight: Claims written at once.
        adopt_within: How long an assignment may stay unadopted before it is taken back.
        record_seconds: The dispatcher record's lifetime (workers take turns again this
            long after the dispatcher's last renewal).
        ahead: Proposals a worker that reads its inbox receives beyond its free slots.
        claim_within: How long a worker with a free slot may leave its proposals
            unclaimed before they are taken back (and it is passed over).

    Attributes:
        view: The pool's queue (a ``PoolView`` fed by the list and watch).
        counts: What it has done.
        leader: Whether it held its record at its last round.
    """

    def __init__(self, store: LeaseStore, api: Transport, margin: Callable[[], timedelta],
                 namespace: str, selector: str, identity: str, *, max_slots: int = MAX_SLOTS,
                 in_flight: int = IN_FLIGHT, adopt_within: timedelta = ADOPT_WITHIN,
                 record_seconds: int = RECORD_SECONDS, watch_seconds: int = 300,
                 ahead: int = AHEAD, claim_within: timedelta = CLAIM_WITHIN) -> None:
        self.store, self.api, self.margin = store, api, margin
        self.namespace, self.selector = namespace, selector
        self.max_slots, self.in_flight, self.adopt_within = max_slots, in_flight, adopt_within
        self.record = DispatcherRecord(namespace, selector, identity, seconds=record_seconds)
        self.view = PoolView()
        self.counts = DispatchCounts()
        self.leader = False
        self._lock = threading.Condition()
        self._changed = False  # something changed since the last round began (``_wake``)
        self._synced = False
        self._flying: dict[str, str] = {}  # job → worker, claims being written
        self._retry_at: dict[str, float] = {}  # job → when to try again (no answer, 403)
        self.passed_over: dict[str, float] = {}  # worker → until when it gets no work
        self._slots: dict[str, int] = {}
        self._live: set[str] = set()
        self._readers: set[str] = set()  # live workers that read proposals from an inbox
        self._waiters: set[str] = set()  # live readers that stop once the pool is empty
        self._empty = False  # the synced view counts no unfinished job
        self._marked: set[str] = set()  # inboxes written (or being written) with that mark
        # worker → job → (proposal, local time proposed), in the order to claim
        self.proposed: dict[str, dict[str, tuple[Proposal, float]]] = {}
        self._active: dict[str, float] = {}  # worker → when it last took a proposed job
        self._free_since: dict[str, float] = {}  # worker → since when it had a free slot
        self._dirty: set[str] = set()  # inboxes to write
        self._writing: set[str] = set()  # inboxes being written
        self._inboxes: set[str] = set()  # inboxes this dispatcher wrote (deleted when gone)
        self._inherited = False  # whether the inboxes found at taking over were adopted
        self._inbox_retry_at: dict[str, float] = {}  # worker → when a failed write may retry
        self.ahead, self.claim_within = ahead, claim_within
        self._stop = threading.Event()
        self.feed = LeaseFeed(store, namespace, selector, watch_seconds=watch_seconds)
        self._executor = ThreadPoolExecutor(max_workers=in_flight,
                                            thread_name_prefix="joblease-dispatch")
        self._threads = [threading.Thread(target=self._run_feed, daemon=True,
                                          name=f"joblease-dispatch-feed[{selector}]"),
                         threading.Thread(target=self._run, daemon=True,
                                          name=f"joblease-dispatcher[{selector}]"),
                         threading.Thread(target=self._run_record, daemon=True,
                                          name=f"joblease-dispatch-record[{selector}]")]

    @classmethod
    def for_client(cls, client: Any, selector: str, identity: str | None = None,
                   **options: Any) -> Dispatcher:
        """A dispatcher over a ``LeaseClient``'s store, transport and margin (not started).

        ``identity`` defaults to the client's username (``whoami``): under the chart's
        presence policy a record may name only its writer.
        """
        client.calibrate_if_due()
        who = identity or whoami(client.store)
        return cls(client.store, client.api, client.margin, client.namespace, selector,
                   who, **options)

    # -- life ---------------------------------------------------------------------------

    def start(self) -> Dispatcher:
        """Start the feed and the dispatch loop."""
        for thread in self._threads:
            thread.start()
        return self

    def kill(self) -> None:
        """Stop at once, leaving the record to lapse (what a crash looks like to workers)."""
        self._stop.set()
        self.feed.stop()
        with self._lock:
            self._wake()
        for thread in self._threads:
            thread.join(timeout=5)
        self._executor.shutdown(wait=True)

    def close(self) -> None:
        """Stop and delete the record: workers take turns at their next list."""
        self.kill()
        drive(self.record.leave_steps(), SyncPort(self.store))

    # -- the feed (FeedSink) --------------------------------------------------------------

    def replace(self, items: list[Observed], resource_version: str) -> None:
        """A complete list of the pool."""
        with self._lock:
            self.view.replace(items, resource_version)
            self._synced = True
            self._wake()

    def apply(self, event_type: str, obs: Observed) -> None:
        """A watch event."""
        with self._lock:
            self.view.apply(event_type, obs)
            self._wake()

    def bookmark(self, resource_version: str) -> None:
        """The watch's resume point moved."""
        with self._lock:
            self.view.bookmark(resource_version)

    def workers(self) -> dict[str, bool]:
        """The live workers as last listed, each with whether it reads its inbox.

        ``False``: it is claimed *for*, and adopts (an earlier version, or refused its inbox).
        """
        with self._lock:
            return {who: who in self._readers for who in self._live}

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed (the feed retries)."""
        log.warning("dispatcher of %r: list/watch failed (%s); retrying", self.selector, error)

    def _run_feed(self) -> None:
        try:
            self.feed.run(self)
        except Exception:  # the loop stops dispatching once the record lapses; say why
            log.exception("dispatcher of %r: its watch stopped", self.selector)
            self._stop.set()

    # -- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        """Dispatch rounds: one after each change (a watch event, a write's answer, a list).

        The record's renewals and the workers' lists run in a thread of their own
        (:meth:`_run_record`): a round never waits for their requests, so a worker that
        frees is given the head of the queue within one round.
        """
        while not self._stop.is_set():
            if self.leader:
                self._dispatch()
            with self._lock:
                if not self._changed:  # a change during the round: the next one at once
                    self._lock.wait(timeout=0.2)
                self._changed = False

    def _wake(self) -> None:
        """Tell the rounds that something changed (with the lock held).

        Remembered, not only notified: a change that lands while no round waits (one is
        running, or about to wait) would otherwise wake nobody, and the job it freed would
        wait for the next change or 0.2 s (docs/safety.md #68).
        """
        self._changed = True
        self._lock.notify_all()

    def _run_record(self) -> None:
        """Hold the record and list the workers on their periods, until stopped.

        Renewals every :data:`RENEW_SECONDS`, lists every :data:`LIST_SECONDS`; each result
        wakes the dispatch rounds.
        """
        port = SyncPort(self.store, stop=self._stop)
        renewed_at = listed_at = float("-inf")
        try:
            while not self._stop.is_set():
                now = self.api.monotonic()
                if now - renewed_at >= RENEW_SECONDS:
                    self.leader = self._hold(port)
                    renewed_at = now
                    if not self.leader:
                        self._inherited = False  # another may write them meanwhile
                if now - listed_at >= LIST_SECONDS:
                    listed = self._list_workers(port)
                    listed_at = now
                    if listed and self.leader and not self._inherited:
                        self._inherit_inboxes(port)  # once the live workers are known
                with self._lock:
                    self._wake()
                next_at = min(renewed_at + RENEW_SECONDS, listed_at + LIST_SECONDS)
                # at most 0.2 s at a time: the transport's clock may run apart from this
                # thread's timeouts (a test's clock)
                self._stop.wait(min(0.2, max(0.0, next_at - self.api.monotonic())))
        except Stopped:
            return
        except Exception:  # a bug: stop dispatching, as when the watch dies; the record lapses
            log.exception("dispatcher of %r: its record thread stopped", self.selector)
            self.leader = False
            self._stop.set()

    def _hold(self, port: SyncPort) -> bool:
        with self._lock:
            unfinished = self.view.unfinished() if self._synced else None
        try:
            return drive(self.record.hold_steps(unfinished), port)
        except ApiError as err:
            log.warning("dispatcher of %r: its record: %s", self.selector, err)
            return False

    def _inherit_inboxes(self, port: SyncPort) -> None:
        """Once leader, take on the pool's inboxes that exist (a dead dispatcher's included).

        Each is marked to write: a live worker's is rewritten with this dispatcher's
        proposals (none yet: emptied of what the dead one decided), a gone worker's deleted
        (``_take_back``). Called only after a list of the live workers succeeded: before it,
        every worker would count as gone and its inbox be deleted. A failed list is tried
        again with the next list of the workers.
        """
        try:
            found = drive(list_inboxes_steps(self.namespace, self.record.pool), port)
        except ApiError as err:
            log.warning("dispatcher of %r: listing inboxes: %s", self.selector, err)
            return
        with self._lock:
            self._inboxes |= found
            self._dirty |= found
            self._inherited = True
            self._wake()

    def _list_workers(self, port: SyncPort) -> bool:
        """List the live workers and their slots; ``False``: the list failed (said)."""
        try:
            body: dict[str, Any] = drive(_list_records(self.namespace, self.record.pool), port)
        except ApiError as err:
            log.warning("dispatcher of %r: listing workers: %s", self.selector, err)
            return False
        items = list(body.get("items") or [])
        now = self._now()
        live = {who for who, until in live_records(items).items() if now.earliest < until}
        with self._lock:
            self._live = live
            self._slots = {who: n for who, n in announced_slots(items).items() if who in live}
            self._readers = inbox_readers(items) & live
            self._waiters = empty_waiters(items) & self._readers
        return True

    def _now(self) -> ServerNow:
        return self.api.server_now()

    def _dispatch(self) -> None:
        """One round: plan from the queue and the free slots; propose, or claim (legacy).

        A worker that reads its inbox (it announced so) is *proposed* its jobs (an inbox
        write, no status write); a worker of an earlier version is claimed for, as before,
        and adopts. The proposals out are always the head of the queue that fits the
        workers' slots (plus :attr:`ahead` each): a better job that arrives takes the
        place of the last one proposed (taken back while still unclaimed).
        """
        with self._lock:
            if not self._synced:
                return
            now = self.api.monotonic()
            self.passed_over = {w: t for w, t in self.passed_over.items() if t > now}
            self._retry_at = {n: t for n, t in self._retry_at.items() if t > now}
            server_now, margin = self._now(), self.margin()
            held = Counter(self.view.held_by())
            busy = held + Counter(self._flying.values())
            cap = free_slots({w: n + (self.ahead if w in self._readers else 0)
                              for w, n in self._slots.items() if w not in self.passed_over},
                             busy, self.max_slots + self.ahead)
            queue = dispatch_queue(self.view.in_order(), server_now, margin, self._live,
                                   skip=self._skipped(), limit=sum(cap.values()),
                                   adopt_within=self.adopt_within)
            self._take_back([q.job.name for q in queue], cap, held, server_now, margin, now)
            self._mark_emptiness()
            out = {name for jobs in self.proposed.values() for name in jobs}
            free = {w: max(0, c - len(self.proposed.get(w, {}))) for w, c in cap.items()
                    if w not in self.passed_over}  # passed over in this round included
            room = self.in_flight - len(self._flying)
            claims: list[tuple[Queued, str]] = []
            for queued, worker in plan([q for q in queue if q.job.name not in out], free,
                                       may_receive):
                if worker in self._readers and not queued.reassign:
                    self._propose(queued.job, worker, now)
                    if held[worker] < self._slots.get(worker, 0):  # it may claim at once
                        self._free_since.setdefault(worker, now)
                elif len(claims) < room:
                    self._flying[queued.job.name] = worker
                    claims.append((queued, worker))
            writes = self._inbox_writes(now)
            self.counts.rounds += 1
        for queued, worker in claims:
            self._executor.submit(self._claim, queued, worker, margin).add_done_callback(
                _log_failure)
        for write in writes:
            self._executor.submit(self._write_inbox, write).add_done_callback(_log_failure)

    def _propose(self, job: Observed, worker: str, now: float) -> None:
        self.proposed.setdefault(worker, {})[job.name] = (
            Proposal(job.name, job.resource_version, proposal_state(job)), now)
        self._active.setdefault(worker, now)
        self._dirty.add(worker)
        self.counts.proposed += 1

    def _take_back(self, wanted: list[str], room: dict[str, int], held: Counter[str],
                   server_now: ServerNow, margin: timedelta, now: float) -> None:
        """Drop the proposals that no longer stand; an inbox changes only if one did not.

        A proposal its worker took (the job Held by it) just leaves. Any other leaves with
        its worker's inbox rewritten: one whose job is no longer claimable (taken by
        another, finished: rare, a race), and one *taken back* while still claimable — when
        a better job pushed it out of the head of the queue, when its worker has no room
        left for it (``room``: its free slots plus :attr:`ahead`), when its worker is no longer
        live (or no longer reads an inbox), when it stayed unclaimed for
        :attr:`claim_within` while its worker had a free slot (it is proposed afresh), or
        when its worker had a free slot and took none of its proposals for that long (then
        the worker is passed over).
        """
        for worker in list(self.proposed):
            jobs = self.proposed[worker]
            if held[worker] < self._slots.get(worker, 0):  # a free slot: the clock runs
                since = max(self._free_since.setdefault(worker, now),
                            self._active.get(worker, now))
            else:
                self._free_since.pop(worker, None)
                since = now
            late = now - since >= self.claim_within.total_seconds()
            gone = worker not in self._readers or worker in self.passed_over
            free_from = self._free_since.get(worker)  # None: no free slot, nothing is due
            fresh = {name: p for name, (p, at) in jobs.items()
                     if free_from is None
                     or now - max(at, free_from) < self.claim_within.total_seconds()}
            keep = {} if gone or late else proposals_to_keep(
                fresh, self._unfinished, server_now, margin, wanted, room.get(worker, 0))
            for name in list(jobs):
                if name in keep:
                    if keep[name] is not jobs[name][0]:  # a newer version, still claimable
                        jobs[name] = (keep[name], jobs[name][1])
                        self._dirty.add(worker)  # told the version its claim will test
                    continue
                del jobs[name]
                obs = self._unfinished(name)
                if obs is not None and obs.status.holder == worker:
                    self._active[worker] = now  # it took the job
                    continue
                self._dirty.add(worker)  # its inbox must stop proposing it
                if obs is not None and claimable_now(obs, server_now, margin):
                    self.counts.taken_back += 1
            if late and worker not in self.passed_over:
                self.passed_over[worker] = now + PASS_OVER_SECONDS
                log.warning("dispatcher of %r: %s took none of its proposals for %.0fs: "
                            "passed over", self.selector, worker,
                            self.claim_within.total_seconds())
            if not jobs:
                del self.proposed[worker]
                self._active.pop(worker, None)
                self._free_since.pop(worker, None)
        for worker in self._inboxes - self._live:
            self._dirty.add(worker)  # gone: its inbox is deleted

    def _mark_emptiness(self) -> None:
        """Mark the inboxes to write that must tell (or stop telling) that the pool is empty.

        Only workers that stop once it is empty are told (they announced it): a mark costs
        an inbox write per worker at each turn from some jobs to none and back, which a
        trickle would pay at every job if every worker were told.
        """
        self._empty = self.view.unfinished() == 0
        self._dirty |= (self._waiters - self._marked) if self._empty else set(self._marked)

    def _unfinished(self, name: str) -> Observed | None:
        """The unfinished cached job ``name`` (one ``view.in_order`` yields), or ``None``."""
        obs = self.view.get(name)
        return None if obs is None or obs.status.phase.finished else obs

    def _inbox_writes(self, now: float) -> list[InboxWrite]:
        """The inboxes to write now (no proposals: delete it), at most one write per worker.

        An inbox whose last write failed waits :data:`RETRY_SECONDS` (no warning a round).
        """
        writes: list[InboxWrite] = []
        resting = {w for w, at in self._inbox_retry_at.items() if at > now}
        for worker in sorted(self._dirty - self._writing - resting):
            jobs = self.proposed.get(worker, {})
            if worker not in self._live and not jobs:
                writes.append(InboxWrite(worker, None))
                self._marked.discard(worker)
            else:
                empty = self._empty and worker in self._waiters
                writes.append(InboxWrite(worker, [p for p, _ in jobs.values()], empty))
                (self._marked.add if empty else self._marked.discard)(worker)
            self._writing.add(worker)
        # only the inboxes written now are no longer due: one whose previous write is still
        # in flight stays due, and is written once that write has answered (safety.md #54)
        self._dirty -= {write.worker for write in writes}
        return writes

    def _write_inbox(self, write: InboxWrite) -> None:
        """Write (or delete) one worker's inbox; a failure marks it to write again."""
        worker, proposals = write.worker, write.proposals
        try:
            if proposals is None:
                drive(delete_inbox_steps(self.namespace, self.record.pool, worker),
                      SyncPort(self.store))
            else:
                drive(write_inbox_steps(self.namespace, self.record.pool, worker,
                                        self.record.identity, proposals, write.pool_empty),
                      SyncPort(self.store))
        except Exception as err:  # lost, refused, a bug: the next round writes it again
            log.warning("dispatcher of %r: the inbox of %s: %s", self.selector, worker, err)
            with self._lock:
                self._writing.discard(worker)
                self._dirty.add(worker)
                self._marked.discard(worker)  # unknown: written again as the pool is then
                self._inbox_retry_at[worker] = self.api.monotonic() + RETRY_SECONDS
                self.counts.failed += 1
            return
        with self._lock:
            self._writing.discard(worker)
            self._inbox_retry_at.pop(worker, None)
            self.counts.inbox_writes += 1
            if proposals is None:
                self._inboxes.discard(worker)
            else:
                self._inboxes.add(worker)
            self._wake()

    def _skipped(self) -> set[str]:
        return set(self._flying) | set(self._retry_at) | self.view.set_aside_names()

    def _write_claim(self, queued: Queued, worker: str, margin: timedelta) -> Outcome:
        """The assignment's one conditional write (a test records it by wrapping this)."""
        decide = ClaimDecider(worker, margin, dispatch_claim_id(new_claim_id()),
                              reassign=queued.reassign)
        return drive(transaction(self.namespace, queued.job.name, decide, self.api.monotonic,
                                 observed=queued.job, max_conflicts=1),
                     SyncPort(self.store))

    def _claim(self, queued: Queued, worker: str, margin: timedelta) -> None:
        """Write one assignment (a conditional write); fold its answer into the queue."""
        job = queued.job
        try:
            outcome = self._write_claim(queued, worker, margin)
        except REFUSED as refusal:  # someone else wrote it: wait for the watch's newer version
            self._failed(job, worker, refusal, set_aside=True)
            return
        except Exception as err:  # no answer (it may have landed), 403, a bug: retry later
            self._failed(job, worker, err, set_aside=False)
            return
        with self._lock:
            self._flying.pop(job.name, None)
            self.view.learn(outcome.observed)
            self.counts.assigned += 1
            if queued.reassign:
                self.counts.reassigned += 1
                previous = job.status.holder
                if previous is not None and previous in self._live:  # live, yet never adopted
                    self.passed_over[previous] = self.api.monotonic() + PASS_OVER_SECONDS
            self._wake()

    def _failed(self, job: Observed, worker: str, err: Exception, *, set_aside: bool) -> None:
        """A claim that did not land: set the job aside until a newer version, or rest it.

        Only a refusal means a newer version exists (or will: the watch brings it). A lost
        answer may have landed, or not: setting the job aside would then wait for a version
        that never comes, so it rests :data:`RETRY_SECONDS` instead (a retry from the cached
        version is refused if it did land, and the watch brings that version).
        """
        with self._lock:
            self._flying.pop(job.name, None)
            if set_aside:
                self.view.set_aside(job.name, job.resource_version)
                self.counts.refused += 1
            else:
                self._retry_at[job.name] = self.api.monotonic() + RETRY_SECONDS
                self.counts.failed += 1
            self._wake()
        log.log(logging.DEBUG if set_aside else logging.WARNING,
                "dispatcher of %r: %s for %s not claimed: %s", self.selector, job.name, worker,
                err)


@dataclass(frozen=True)
class InboxWrite:
    """One inbox write a round decided: the worker, its proposals, whether the pool is empty.

    ``proposals`` ``None``: delete the inbox (its worker is gone).
    """

    worker: str
    proposals: list[Proposal] | None
    pool_empty: bool = False


def whoami(store: LeaseStore) -> str:
    """The username the API server knows ``store``'s identity by (a dispatcher's identity)."""
    return drive(_whoami(), SyncPort(store))


def _whoami() -> Steps[str]:
    return str((yield Whoami()))


def _list_records(namespace: str, pool: str) -> Steps[dict[str, Any]]:
    body: dict[str, Any] = yield Call(LeaseCall(
        "GET", PATH.format(namespace=namespace), _raw,
        query={"labelSelector": records_selector(pool)}))
    return body


def _log_failure(future: Future[None]) -> None:
    err = future.exception()
    if err is not None:
        log.error("dispatcher: a claim failed unexpectedly", exc_info=err)


def _raw(body: dict[str, Any]) -> dict[str, Any]:
    return body

