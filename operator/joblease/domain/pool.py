"""A work pool's view of its JobLeases: which one to claim next, and when to look again.

Pure: the caller (``joblease.sdk.pool``, ``joblease.aio``, the simulator) feeds it the list
and the watch events of one label selector, and the pool's live workers, and asks it to
choose. Nothing here talks to the API server, so the sync and the async client share every
decision, and the simulator runs the very same code.

Choosing
--------
1. A JobLease is a candidate when :func:`~joblease.domain.lease.claimable_at` says a claim
   may succeed by now (the earliest server time): not finished, not held or held past
   ``leaseUntil + margin``, and past its backoff (``notBefore``).
2. Candidates are ordered by ``spec.priority`` (higher first), then by creation: the
   ``creationTimestamp`` (whole seconds), then the creation revision
   (:func:`creation_revision`: ``status.epoch``, else the first version's
   ``resourceVersion``; etcd revisions strictly increase, so jobs created in the same
   second keep their creation order), then the name.
3. One owner per job, and turns: the view knows the pool's live workers (presence records
   fed to :meth:`PoolView.note_worker`, and every holder it caches, until its
   ``leaseUntil``). Rendezvous hashing of the *job* over them ranks them; rank 0 is the
   job's owner. Time from the job's origin (:func:`turn_origin`: its creation, or when it
   became claimable again) is cut into turns of ``step`` (0.5 s) that pass from rank to
   rank, round and round (:func:`turn_due`); a worker takes the first candidate *of the
   top priority* whose turn is its own now, and not in the first ``guard`` (0.25 s) of a
   turn. A lower priority is never chosen while a higher one has a candidate, even if
   that means waiting for a turn. A worker alone takes the first candidate: exact FIFO.
4. A name the caller just failed to claim (409, refused) is set aside until the watch
   reports a newer version of it than the one the claim was decided from, so a worker does
   not ask twice about what it already knows is taken (and does not skip a version it has
   not tried).

Safety never depends on step 3: every claim is one conditional write, and two workers that
disagree about the live workers or the time only waste a write.

How often workers collide
-------------------------
At any instant a job is the turn of exactly one worker of those a view knows, so two
workers that agree on the live workers never act on one job at the same time; and one that
acts at the start of its turn (after the guard) already sees a claim made at the end of the
turn before, as long as its view lags less than the guard. What remains: views that
disagree on the live workers (a presence just lapsed or appeared: some jobs change owner),
lag beyond the guard, or clocks further apart than the guard's slack.
``tests/unit/test_pool_contention.py`` measures it with views lagging 200 ms (20 workers):
0 wasted writes per job with 100 arrivals/s, in a trickle of 5/s and in a drain of 600,
against 9.6, 19 and 1.6 with the previous design (each worker took the job of a window
that ranked highest *for it*: independent draws, which collide at the birthday bound).

The price is waiting. A job waits for a turn whose worker is free: in a drain a job starts
on average under ``N`` places after its turn (``N`` live workers), at most about ``5 N``
(same test); a drain of 600 by 20 workers takes 6.5 s (5.1 s with the old window, and
934 refused writes), 1000 arrivals at 100/s with mixed priorities finish at 17.5 s
(10.2 s). A turn's worker that is busy or dead costs the job one turn (a dead one stops
costing once its presence lapses); strict priority can make every worker
wait for the one whose turn it is on the only top-priority job.

Cost
----
The view keeps the unfinished JobLeases' order keys in a sorted list (``bisect``, updated
by every change), a count of Held JobLeases per holder, the held or resting names (for
:meth:`PoolView.next_wake`) and each job's ranking of the live workers (recomputed only
when they change: ``N`` hashes per job), so a choice reads the order from its front: its
cost is the candidates read up to the first of its turns (about ``N``, at most the window)
plus the JobLeases skipped on the way (held, resting, set aside, excluded), not the size
of the cache.

Waiting
-------
:meth:`PoolView.next_wake` is the earliest server time at which a non-candidate may become
one (a holder's ``leaseUntil + margin``, a backoff's end), or at which the caller's next
turn on a candidate the choice passed over begins; the caller sleeps until then or until
the watch reports a change, whichever comes first.
"""

from __future__ import annotations

import hashlib
import sys
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.lease import (
    EARLIEST_TIME,
    Observed,
    Phase,
    claimable_at,
    claimable_now,
    not_before,
    parse_time,
    unadopted,
)

DEFAULT_SPREAD = 32
WINDOW_PER_HOLDER = 8
TURN_STEP = timedelta(milliseconds=500)
TURN_GUARD = timedelta(milliseconds=250)
_NO_REVISION = sys.maxsize

_OrderKey = tuple[int, datetime, int, str]


def _rank(worker: str, name: str) -> bytes:
    """Rendezvous (highest random weight) score of the pair (``worker``, job ``name``)."""
    return hashlib.blake2b(f"{worker}\0{name}".encode(), digest_size=8).digest()


def creation_revision(obs: Observed) -> int:
    """The etcd revision at which ``obs``'s JobLease was created, as far as ``obs`` shows.

    Why a revision: ``creationTimestamp`` has one-second resolution, so jobs created in the
    same second would otherwise fall back to name order; revisions are cluster-wide and
    strictly increase with every write, so they order creations exactly.

    Where it comes from: ``status.epoch``, which the operator's initialization (or, without
    the operator, the first claim) records from the version it read: the object's first
    version, unless its metadata changed before (then a later revision, still a server-side
    number near its creation). An object without an epoch has had no status write yet, so
    its ``resourceVersion`` is its first version's (or a metadata change's). A non-numeric
    resourceVersion (not the API server's) sorts after every number of its second.
    """
    if obs.status.epoch:
        return obs.status.epoch
    try:
        return int(obs.resource_version)
    except ValueError:
        return _NO_REVISION


def _order_key(obs: Observed) -> _OrderKey:
    return (-obs.spec.priority, obs.created or EARLIEST_TIME, creation_revision(obs), obs.name)


def owner_rank(worker: str, name: str, workers: Iterable[str]) -> int:
    """``worker``'s place in job ``name``'s rendezvous ranking of ``workers`` (0: the owner).

    Every worker that sees the same live workers computes the same ranking of each job, so
    the owner is agreed on without talking. ``worker`` itself is always ranked, listed or
    not; a name listed twice counts once.
    """
    return ranking(name, {*workers, worker})[worker]


def ranking(name: str, workers: Collection[str]) -> dict[str, int]:
    """Job ``name``'s rendezvous ranking of ``workers``: each worker's place, 0 the owner."""
    order = sorted(workers, key=lambda who: (_rank(who, name), who), reverse=True)
    return {who: place for place, who in enumerate(order)}


def turn_origin(obs: Observed, margin: timedelta) -> datetime:
    """The server time from which job ``obs``'s turns are counted (step 3).

    Taken from the object alone, so that every worker's view, however stale, counts the
    same turns: a job never claimed counts from its ``creationTimestamp`` (whole seconds:
    its first turns may have passed when it reaches the views, which only moves it on to
    the next rank); a job claimed before counts from when it became claimable again: the
    end of its rest or of its holder's lease (``claimable_at``), or its release (the
    ``Held`` condition's last flip to False), whichever is latest.
    """
    origin = obs.created or EARLIEST_TIME
    if obs.status.generation == 0:
        return origin  # the operator's first status write must not move the turns
    ready = claimable_at(obs, margin)
    if ready is not None:
        origin = max(origin, ready)
    for condition in obs.status.conditions:
        if condition.get("type") == "Held" and condition.get("status") == "False":
            flipped = condition.get("lastTransitionTime")
            if isinstance(flipped, str):
                origin = max(origin, parse_time(flipped))
    return origin


def turn_due(origin: datetime, rank: int, workers: int, now: datetime, step: timedelta,
             guard: timedelta, phase: float = 0.0) -> datetime:
    """When the worker of ``rank`` (of ``workers`` live ones) may next take a job (step 3).

    Time from ``origin`` is cut into turns of ``step``: turn 0, the owner's, runs until
    ``origin + (1 + phase) * step``, each next turn ``step`` longer; turn ``k`` belongs to
    rank ``k mod workers``: the owner first, then each next rank, round and round. A worker
    acts only within its own turn, and not in its first ``guard`` (except in turn 0): by
    then its view shows any claim made in the turn before, as long as the views lag less
    than ``guard``. So two workers never act on a job at once, and a busy or dead rank only
    costs the job one turn. ``phase`` (in [0, 1), per job) staggers the jobs' turns, so
    that the guards of jobs created together do not idle every worker at the same time.
    Returns ``now`` itself when the turn is running.
    """
    if workers <= 1:
        return now
    first = origin + step * phase
    turn = max(0, (now - first) // step)
    if turn % workers == rank:
        return now if turn == 0 else max(now, first + turn * step + guard)
    turn += (rank - turn) % workers
    return first + turn * step + guard


def _phase(name: str) -> float:
    """Job ``name``'s offset of its turns, a fraction of a turn (:func:`turn_due`)."""
    return int.from_bytes(_rank("", name), "big") / 2**64


@dataclass
class PoolView:
    """The cached JobLeases of one pool (one namespace and label selector).

    Besides the cache itself the view keeps, updated on every change rather than recomputed
    per choice (a worker chooses once per claim, and a pool may cache tens of thousands):
    the unfinished JobLeases' order keys, sorted (step 2), so a choice reads only the front
    of the queue; how many Held JobLeases each holder has; the live workers of the pool
    (step 3: :meth:`note_worker`, and every holder the cache shows, until its
    ``leaseUntil``); and since when each candidate has been waiting in this view's choices.

    Attributes:
        resource_version: The list's or the last watch event's ``resourceVersion``, from
            which a watch resumes (``None`` before the first list, or after a 410: re-list).
    """

    resource_version: str | None = None
    _items: dict[str, Observed] = field(default_factory=dict)
    _set_aside: dict[str, str] = field(default_factory=dict)
    _order: list[_OrderKey] = field(default_factory=list)
    _holders: Counter[str] = field(default_factory=Counter)
    _workers: dict[str, datetime] = field(default_factory=dict)
    _deferred: datetime | None = None
    _rankings: dict[str, tuple[frozenset[str], dict[str, int]]] = field(default_factory=dict)
    _timed: set[str] = field(default_factory=set)
    _assigned: dict[str, set[str]] = field(default_factory=dict)

    def replace(self, items: Iterable[Observed], resource_version: str) -> None:
        """Start over from a list (the first one, or after the watch's history expired)."""
        self._items = {obs.name: obs for obs in items}
        self._order = sorted(_order_key(obs) for obs in self._items.values()
                             if not obs.status.phase.finished)
        self._holders = Counter(holder for obs in self._items.values()
                                if (holder := _active_holder(obs)) is not None)
        for obs in self._items.values():
            self._note_holder(obs)
        self._timed = {obs.name for obs in self._items.values() if _timed(obs)}
        self._assigned = {}
        for obs in self._items.values():
            self._note_assigned(obs)
        self._rankings = {}
        self._set_aside = {name: rv for name, rv in self._set_aside.items()
                           if name in self._items
                           and self._items[name].resource_version == rv}
        self.resource_version = resource_version

    def apply(self, event_type: str, obs: Observed) -> None:
        """Fold one watch event (ADDED, MODIFIED, DELETED) into the view.

        Events of one watch stream arrive in resourceVersion order, but the view may already
        hold a later version the caller learned itself (:meth:`learn`), so an event older
        than the cached version is ignored. A DELETED that names another incarnation (uid)
        than the cached one is stale and ignored too. ``BOOKMARK`` events carry no object:
        pass their resourceVersion to :meth:`bookmark`.
        """
        current = self._items.get(obs.name)
        if event_type == "DELETED":
            if current is not None and current.uid == obs.uid:
                self._forget(obs.name)
                self._set_aside.pop(obs.name, None)
        elif current is None or _newer(obs, current):
            self._store(obs)
        self.bookmark(obs.resource_version)

    def bookmark(self, resource_version: str) -> None:
        """Remember where the watch stands (a BOOKMARK event, or any event's version)."""
        if resource_version:
            self.resource_version = resource_version

    def learn(self, obs: Observed) -> None:
        """Fold a version the caller read or wrote itself (a claim's answer, a fresh GET).

        Only a name the view holds is updated: if the watch already removed it (deleted,
        or no longer matching the selector, e.g. finished), that removal came after the
        caller's write, and re-adding the older version would keep a ghost in the view.
        """
        current = self._items.get(obs.name)
        if current is not None and _newer(obs, current):
            self._store(obs)

    def _store(self, obs: Observed) -> None:
        """Cache ``obs`` in place of its name's version; a set-aside ends with a new version."""
        self._forget(obs.name)
        self._items[obs.name] = obs
        if not obs.status.phase.finished:
            insort(self._order, _order_key(obs))
        if _timed(obs):
            self._timed.add(obs.name)
        if (holder := _active_holder(obs)) is not None:
            self._holders[holder] += 1
        self._note_holder(obs)
        self._note_assigned(obs)
        if self._set_aside.get(obs.name) != obs.resource_version:
            self._set_aside.pop(obs.name, None)

    def _forget(self, name: str) -> None:
        """Drop ``name`` from the cache and from the indexes built on it (not the set-aside)."""
        old = self._items.pop(name, None)
        self._rankings.pop(name, None)
        self._timed.discard(name)
        if old is None:
            return
        if unadopted(old.status) and old.status.holder:
            names = self._assigned.get(old.status.holder, set())
            names.discard(name)
            if not names:
                self._assigned.pop(old.status.holder, None)
        if not old.status.phase.finished:
            key = _order_key(old)
            at = bisect_left(self._order, key)
            if at < len(self._order) and self._order[at] == key:
                del self._order[at]
        if (holder := _active_holder(old)) is not None:
            self._holders[holder] -= 1
            if self._holders[holder] <= 0:
                del self._holders[holder]


    # -- the pool's live workers (step 3) ----------------------------------------------------

    def note_worker(self, name: str, until: datetime) -> None:
        """Record that worker ``name`` is live until server time ``until`` (or later).

        The caller feeds this from the workers' presence records: for a
        ``coordination.k8s.io`` Lease per worker, ``until`` is its ``renewTime`` plus
        ``leaseDurationSeconds``. The view also notes every holder it caches, until the
        held lease's ``leaseUntil``. A later ``until`` wins; an earlier one is ignored, so
        the sources can be fed in any order.
        """
        if until > self._workers.get(name, EARLIEST_TIME):
            self._workers[name] = until

    def forget_worker(self, name: str) -> None:
        """Drop worker ``name`` at once (its presence record was deleted: it left cleanly).

        A holder the cache still shows Held comes back with the next version of its lease.
        """
        self._workers.pop(name, None)


    def live_workers(self, now: ServerNow) -> list[str]:
        """The workers whose presence, or last held lease, has not lapsed by ``now``.

        Lapsed ones are dropped from the view here: a dead worker leaves every job's
        ranking once its presence runs out (and its last lease ends), and its jobs pass to
        the next in rank.
        """
        for name in [n for n, until in self._workers.items() if until <= now.earliest]:
            del self._workers[name]
        return sorted(self._workers)

    def _note_holder(self, obs: Observed) -> None:
        """A holder is a live worker at least until its ``leaseUntil`` (step 3).

        Sticky on purpose: a worker that just completed or released a job is alive (it
        just acted) and about to claim again; dropping it at once made workers of a drain
        see themselves alone between two jobs and herd onto the first candidate (0.095
        wasted writes per job in ``python -m bench --quick --only pool`` against 0.005).
        The price: a worker that leaves keeps its turns until its last lease's end.
        """
        holder = _active_holder(obs)
        if holder is not None and obs.status.lease_until is not None:
            self.note_worker(holder, obs.status.lease_until)

    # -- reading -----------------------------------------------------------------------------

    def set_aside(self, name: str, tried: str | None = None) -> None:
        """Skip ``name`` until a version other than ``tried`` arrives (a claim of it failed).

        ``tried`` is the resourceVersion the failed claim was decided from (default: the
        cached one). If the view already holds another version, nothing is set aside: that
        version has not been tried yet (a 409 is often caused by the very event that the
        watch has delivered meanwhile, such as the operator's first status write).
        """
        current = self._items.get(name)
        if current is None:
            return
        version = current.resource_version if tried is None else tried
        if version == current.resource_version:
            self._set_aside[name] = version

    def set_aside_names(self) -> set[str]:
        """The names skipped until a newer version of each arrives."""
        return set(self._set_aside)

    def is_set_aside(self, name: str) -> bool:
        """Whether ``name`` is skipped until a newer version of it arrives."""
        return name in self._set_aside

    def get(self, name: str) -> Observed | None:
        """The cached version of ``name``."""
        return self._items.get(name)

    def __len__(self) -> int:
        return len(self._items)

    def unfinished(self) -> int:
        """How many cached JobLeases are not Completed or Failed."""
        return len(self._order)

    def active_holders(self) -> int:
        """How many distinct holders the cache shows holding a JobLease (Held)."""
        return len(self._holders)

    def window(self, spread: int = DEFAULT_SPREAD, per_holder: int = WINDOW_PER_HOLDER,
               workers: int | None = None) -> int:
        """How many of the first candidates of the top priority a choice reads at most.

        ``spread``, widened to ``per_holder`` slots per worker (``workers``, by default the
        active holders): a worker looks past the jobs other workers own for one of its own,
        and with ``N`` workers its first one lies about ``N`` places back. The window
        bounds how far back (and so the cost of a choice that finds nothing due).
        """
        count = len(self._holders) if workers is None else workers
        return max(1, spread, per_holder * count)

    def _in_order(self) -> Iterator[Observed]:
        """The unfinished cached JobLeases, best first (step 2)."""
        for key in self._order:
            yield self._items[key[-1]]  # the name comes last in every order key

    def assigned_to(self, worker: str) -> list[Observed]:
        """The dispatcher's claims for ``worker`` it has not adopted yet (issue 30)."""
        return [self._items[name] for name in sorted(self._assigned.get(worker, ()))]

    def _note_assigned(self, obs: Observed) -> None:
        if unadopted(obs.status) and obs.status.holder:
            self._assigned.setdefault(obs.status.holder, set()).add(obs.name)

    def in_order(self) -> Iterator[Observed]:
        """The unfinished cached JobLeases, best first: a dispatcher's queue (step 2)."""
        return self._in_order()

    def held_by(self) -> dict[str, int]:
        """How many JobLeases each holder holds (Held), as cached: its busy slots."""
        return dict(self._holders)

    def candidates(self, now: ServerNow, margin: timedelta) -> list[Observed]:
        """The JobLeases a claim may take now (step 1), best first (step 2)."""
        return [obs for obs in self._in_order()
                if obs.name not in self._set_aside and claimable_now(obs, now, margin)]

    def choose(self, worker: str, now: ServerNow, margin: timedelta,
               spread: int = DEFAULT_SPREAD, exclude: Collection[str] = (),
               per_holder: int = WINDOW_PER_HOLDER, *, workers: Iterable[str] | None = None,
               step: timedelta = TURN_STEP, guard: timedelta = TURN_GUARD,
               only: Callable[[Observed], bool] | None = None) -> Observed | None:
        """The candidate ``worker`` should try now (steps 1-4), or ``None``.

        Reads the candidates of the top priority from the front of the order and takes the
        first whose turn (:func:`turn_due`) is ``worker``'s now. ``None`` when none of the
        first :meth:`window` candidates is; :meth:`next_wake`, asked right after, then
        includes the moment the first of them is. A worker alone takes the first candidate.

        Args:
            worker: The caller's holder name; always counted among the live workers.
            now: The server's time now (a claim's decision judges the same interval).
            margin: The clock margin claims use (``claimable_at``).
            spread: The least window (:meth:`window`).
            exclude: Names the caller's other threads are claiming right now. Threads of one
                worker share its name, hence its turns; without this they would all race
                for the same lease.
            per_holder: The window's slots per live worker (:meth:`window`).
            workers: The live workers, if the caller keeps them itself; by default those
                the view knows (:meth:`note_worker`, holders; :meth:`live_workers`).
            step: How long each rank's turn lasts.
            guard: How long a worker lets a turn begin before it acts in it: more than
                the views' lag plus the clocks' error, so that it sees the claim the rank
                before made at the end of its own turn.
            only: Consider only the JobLeases it accepts (a dispatched pool's workers take
                by turns only the jobs that did not opt in to the dispatcher).
        """
        live = frozenset(self.live_workers(now) if workers is None else workers) | {worker}
        size = self.window(spread, per_holder, workers=len(live))
        at = now.midpoint  # turns are cut on the server's clock; the guard absorbs its error
        top: int | None = None
        read = 0
        deferred: datetime | None = None
        for obs in self._in_order():
            if top is not None and obs.spec.priority != top:
                break  # a lower priority is never chosen while a higher one has a candidate
            if (obs.name in self._set_aside or obs.name in exclude
                    or (only is not None and not only(obs)) or not claimable_now(obs, now, margin)):
                continue
            top = obs.spec.priority
            if len(live) == 1:
                self._deferred = None
                return obs  # alone: strictly first
            due = turn_due(turn_origin(obs, margin), self._rank_of(worker, obs.name, live),
                           len(live), at, step, guard, _phase(obs.name))
            if due <= at:
                self._deferred = None
                return obs
            deferred = due if deferred is None else min(deferred, due)
            read += 1
            if read >= size:
                break
        self._deferred = deferred
        return None

    def _rank_of(self, worker: str, name: str, live: frozenset[str]) -> int:
        """:func:`owner_rank`, its ranking kept per job until the live workers change."""
        cached = self._rankings.get(name)
        if cached is None or cached[0] != live:
            cached = (live, ranking(name, live))
            self._rankings[name] = cached
        return cached[1][worker]

    def next_wake(self, now: ServerNow, margin: timedelta) -> datetime | None:
        """The earliest server time a choice may find something new (``None``: never).

        That is when a non-candidate may become claimable, or when the first candidate
        the last :meth:`choose` passed over becomes that worker's turn: call it right
        after the choice that returned ``None``, for the same worker.

        Set-aside names are not counted: only the watch brings them back. Reads the
        unfinished JobLeases only (finished ones never wake anyone); it runs when a choice
        found nothing, i.e. when every unfinished one is held, resting, set aside or not
        yet due for this worker.
        """
        times = [at for name in self._timed if name not in self._set_aside
                 and (at := claimable_at(self._items[name], margin)) is not None
                 and at > now.earliest]
        if self._deferred is not None and self._deferred > now.earliest:
            times.append(self._deferred)
        return min(times, default=None)


def _active_holder(obs: Observed) -> str | None:
    """The holder ``obs`` shows active (Held by it), for :meth:`PoolView.window`."""
    return obs.status.holder if obs.status.phase == Phase.HELD and obs.status.holder else None


def _timed(obs: Observed) -> bool:
    """Whether ``obs`` may become claimable later (held, or resting): what wakes a waiter.

    The unfinished others are claimable at once, whatever the margin, so
    :meth:`PoolView.next_wake` reads only these.
    """
    st = obs.status
    return not st.phase.finished and (
        (st.phase == Phase.HELD and bool(st.holder)) or not_before(obs) is not None)


def is_newer(obs: Observed, current: Observed) -> bool:
    """Whether ``obs`` is the same or a later version than ``current`` (any incarnation).

    resourceVersions are opaque strings by contract; the API server's are etcd revisions,
    global to the cluster, so a numeric comparison orders them even across a delete and
    re-create (a learned version of the old incarnation must not replace the new one). An
    unparsable one is taken as newer.
    """
    try:
        return int(obs.resource_version) >= int(current.resource_version)
    except ValueError:
        return True


_newer = is_newer


def seconds_until_wake(clock: ServerClock, wake: datetime, now: float) -> float:
    """Local seconds from ``now`` until the *earliest* server time has certainly reached ``wake``.

    That is what a claim's decision judges (``ServerClock.monotonic_certain``), so a pool
    that wakes earlier finds nothing claimable; the millisecond on top absorbs float
    rounding. Shared by ``joblease.sdk.Pool`` and ``joblease.aio.AsyncPool``.
    """
    return clock.monotonic_certain(wake) - now + 0.001
