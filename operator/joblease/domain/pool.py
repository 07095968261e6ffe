"""A work pool's view of its JobLeases: which one to claim next, and when to look again.

Pure: the caller (``joblease.sdk.pool``, ``joblease.aio``, the simulator) feeds it the list
and the watch events of one label selector and asks it to choose. Nothing here talks to
the API server, so the sync and the async client share every decision, and the simulator
runs the very same code.

Choosing
--------
1. A JobLease is a candidate when :func:`~joblease.domain.lease.claimable_at` says a claim
   may succeed by now (the earliest server time): not finished, not held or held past
   ``leaseUntil + margin``, and past its backoff (``notBefore``).
2. Candidates are ordered by ``spec.priority`` (higher first), then by creation (older
   first), then by name: FIFO within a priority.
3. Workers must not herd onto the first candidate: each worker takes the one of the first
   ``window`` candidates *of the top priority* that ranks highest under rendezvous hashing
   of (worker, job), where ``window`` is ``spread`` or, if larger, ``WINDOW_PER_HOLDER``
   (8) slots per active holder the view shows (distinct ``status.holder`` of Held
   JobLeases). Different workers thus usually pick different jobs without talking to
   each other, a worker's choice is stable while the window does not change, and a lower
   priority is never chosen while a higher one has a candidate.
4. A name the caller just failed to claim (409, refused) is set aside until the watch
   reports a newer version of it than the one the claim was decided from, so a worker does
   not ask twice about what it already knows is taken (and does not skip a version it has
   not tried).

How often workers collide
-------------------------
Without talking to each other, ``N`` workers choosing among a window of ``W`` candidates
pick like ``N`` independent uniform draws (rendezvous hashing), so the birthday bound
applies: a worker's first pick collides with another's with probability
``1 - (1 - 1/W)**(N - 1)`` (about ``(N - 1) / W``; 8 workers over a full window of 32:
about 20 %). A collision costs the loser one 409 and an immediate second choice. A wider
``spread`` means fewer collisions and a looser FIFO; ``tests/unit/test_pool_view.py``
measures the rate against this bound.

A fixed window makes the rate grow with the number of workers (20 over 32: about 45 % by
the formula), so the window grows with the workers the view can see are active: 8 slots
per holder keeps ``(N - 1) / W`` near 1/8 however many there are (``python -m
bench.choose``: 20 workers choosing at once collide on 1.18 of 20 first picks, 4.86 with
a window of 32). The price: FIFO within a priority is looser (a job may be taken up to
``W`` places after its turn, ``W`` = 160 for 20 workers); priority stays strict, since
the window never crosses into a lower priority. The factor was picked by measurement: a
drain of 600 jobs by 20 workers wasted 0.58 writes per job with a window of 32, 0.36
with 4 per holder, 0.24 with 8 (docs/benchmarks.md).

Cost
----
The view keeps the unfinished JobLeases' order keys in a sorted list (``bisect``, updated
by every change) and a count of Held JobLeases per holder, so a choice reads the order
from its front: its cost is the window plus the JobLeases skipped on the way (held,
resting, set aside, excluded), not the size of the cache (``bench.choose``: 0.3 ms at
10,000 cached, against 48 ms when every choice scanned them all).

Waiting
-------
:meth:`PoolView.next_wake` is the earliest server time at which a non-candidate may become
one (a holder's ``leaseUntil + margin``, a backoff's end); the caller sleeps until then or
until the watch reports a change, whichever comes first.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.lease import EARLIEST_TIME, Observed, Phase, claimable_at

DEFAULT_SPREAD = 32
WINDOW_PER_HOLDER = 8

_OrderKey = tuple[int, datetime, str]


def _rank(worker: str, name: str) -> bytes:
    """Rendezvous (highest random weight) score of ``name`` for ``worker``."""
    return hashlib.blake2b(f"{worker}\0{name}".encode(), digest_size=8).digest()


def _order_key(obs: Observed) -> _OrderKey:
    return (-obs.spec.priority, obs.created or EARLIEST_TIME, obs.name)


@dataclass
class PoolView:
    """The cached JobLeases of one pool (one namespace and label selector).

    Besides the cache itself the view keeps, updated on every change rather than recomputed
    per choice (a worker chooses once per claim, and a pool may cache tens of thousands):
    the unfinished JobLeases' order keys, sorted (step 2), so a choice reads only the front
    of the queue; and how many Held JobLeases each holder has, so a choice knows how many
    workers are active (:meth:`window`).

    Attributes:
        resource_version: The list's or the last watch event's ``resourceVersion``, from
            which a watch resumes (``None`` before the first list, or after a 410: re-list).
    """

    resource_version: str | None = None
    _items: dict[str, Observed] = field(default_factory=dict)
    _set_aside: dict[str, str] = field(default_factory=dict)
    _order: list[_OrderKey] = field(default_factory=list)
    _holders: Counter[str] = field(default_factory=Counter)

    def replace(self, items: Iterable[Observed], resource_version: str) -> None:
        """Start over from a list (the first one, or after the watch's history expired)."""
        self._items = {obs.name: obs for obs in items}
        self._order = sorted(_order_key(obs) for obs in self._items.values()
                             if not obs.status.phase.finished)
        self._holders = Counter(holder for obs in self._items.values()
                                if (holder := _active_holder(obs)) is not None)
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
        if (holder := _active_holder(obs)) is not None:
            self._holders[holder] += 1
        if self._set_aside.get(obs.name) != obs.resource_version:
            self._set_aside.pop(obs.name, None)

    def _forget(self, name: str) -> None:
        """Drop ``name`` from the cache and from the indexes built on it (not the set-aside)."""
        old = self._items.pop(name, None)
        if old is None:
            return
        if not old.status.phase.finished:
            key = _order_key(old)
            at = bisect_left(self._order, key)
            if at < len(self._order) and self._order[at] == key:
                del self._order[at]
        if (holder := _active_holder(old)) is not None:
            self._holders[holder] -= 1
            if self._holders[holder] <= 0:
                del self._holders[holder]

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

    def window(self, spread: int = DEFAULT_SPREAD, per_holder: int = WINDOW_PER_HOLDER) -> int:
        """How many of the first candidates of the top priority a choice is made among.

        ``spread``, widened to ``per_holder`` slots per active holder: the more workers
        choose without talking to each other, the more often two pick the same job (see
        "How often workers collide"), so the window grows with them to keep that rate down.
        """
        return max(1, spread, per_holder * len(self._holders))

    def _in_order(self) -> Iterator[Observed]:
        """The unfinished cached JobLeases, best first (step 2)."""
        for key in self._order:
            yield self._items[key[-1]]  # the name comes last in every order key

    def candidates(self, now: ServerNow, margin: timedelta) -> list[Observed]:
        """The JobLeases a claim may take now (step 1), best first (step 2)."""
        return [obs for obs in self._in_order()
                if obs.name not in self._set_aside and _ready(obs, now, margin)]

    def choose(self, worker: str, now: ServerNow, margin: timedelta,
               spread: int = DEFAULT_SPREAD, exclude: Collection[str] = (),
               per_holder: int = WINDOW_PER_HOLDER) -> Observed | None:
        """The candidate ``worker`` should try (steps 1-4), or ``None`` if there is none.

        Reads the order from its front and stops once the window (:meth:`window`) is full
        or the priority drops below the first candidate's: the cost is the window plus the
        JobLeases skipped on the way (held, resting, set aside, excluded), not the cache.

        ``exclude``: names the caller's other threads are claiming right now. Threads of one
        worker share its name, hence its rendezvous ranking; without this they would all
        race for the same lease.
        """
        size = self.window(spread, per_holder)
        window: list[Observed] = []
        for obs in self._in_order():
            if window and obs.spec.priority != window[0].spec.priority:
                break  # a lower priority is never chosen while a higher one has a candidate
            if (obs.name in self._set_aside or obs.name in exclude
                    or not _ready(obs, now, margin)):
                continue
            window.append(obs)
            if len(window) >= size:
                break
        if not window:
            return None
        return max(window, key=lambda obs: _rank(worker, obs.name))

    def next_wake(self, now: ServerNow, margin: timedelta) -> datetime | None:
        """The earliest server time a non-candidate may become claimable (``None``: never).

        Set-aside names are not counted: only the watch brings them back. Reads the
        unfinished JobLeases only (finished ones never wake anyone); it runs when a choice
        found nothing, i.e. when every unfinished one is held, resting or set aside.
        """
        times = [at for obs in self._in_order() if obs.name not in self._set_aside
                 and (at := claimable_at(obs, margin)) is not None and at > now.earliest]
        return min(times, default=None)


def _active_holder(obs: Observed) -> str | None:
    """The holder ``obs`` shows active (Held by it), for :meth:`PoolView.window`."""
    return obs.status.holder if obs.status.phase == Phase.HELD and obs.status.holder else None


def _ready(obs: Observed, now: ServerNow, margin: timedelta) -> bool:
    at = claimable_at(obs, margin)
    return at is not None and now.earliest >= at


def _newer(obs: Observed, current: Observed) -> bool:
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


def seconds_until_wake(clock: ServerClock, wake: datetime, now: float) -> float:
    """Local seconds from ``now`` until the *earliest* server time has certainly reached ``wake``.

    That is what a claim's decision judges (``ServerClock.monotonic_certain``), so a pool
    that wakes earlier finds nothing claimable; the millisecond on top absorbs float
    rounding. Shared by ``joblease.sdk.Pool`` and ``joblease.aio.AsyncPool``.
    """
    return clock.monotonic_certain(wake) - now + 0.001
